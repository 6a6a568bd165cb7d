//! Dead-letter operations through the API and `fleetctl`: list with filters, retry one (same
//! execution id, fresh attempts), a retried job that already succeeded is not run again, bulk
//! redrive, purge with a count; any of 2,000 found, retried and purged; concurrent retries publish
//! once; retention and maximum trim the index; a dead letter made while Redis is down is kept.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lapin::options::BasicPublishOptions;
use lapin::BasicProperties;
use serde_json::{json, Value};

use fleet_tests::{spawn_fleet, wait_for, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_dead_letter_tests_1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_can_be_listed_retried_redriven_and_purged() {
    let healthy = Arc::new(AtomicBool::new(false));
    let up = healthy.clone();
    let receiver = Receiver::start(SECRET, move |_, _| {
        if up.load(Ordering::SeqCst) {
            Reply::result(json!("recovered"))
        } else {
            Reply::status(404)
        }
    })
    .await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("alpha", &receiver.url("/alpha"), SECRET).await;
    fleet.register_tool("beta", &receiver.url("/beta"), SECRET).await;
    let a1 = fleet.call_tool("alpha", json!({"query": "1"})).await;
    let a2 = fleet.call_tool("alpha", json!({"query": "2"})).await;
    let b1 = fleet.call_tool("beta", json!({"query": "3"})).await;
    for id in [&a1, &a2, &b1] {
        fleet.wait_status(id, "dead_lettered", Duration::from_secs(20)).await;
    }
    // Redis holds the records; the dispatcher drains the dead-letter queue's copies.
    let dlq = fleet.topology.dead_letter_queue();
    wait_for("the dead-letter queue drained", Duration::from_secs(20), || async {
        (fleet.queue_depth(&dlq).await == 0).then_some(())
    })
    .await;

    let (status, listed) = fleet.get("/v1/dead-letters?tool_name=alpha").await;
    assert_eq!(status, 200);
    let ids: Vec<&str> =
        listed["data"].as_array().unwrap().iter().map(|r| r["execution_id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&a1.as_str()) && ids.contains(&a2.as_str()));
    let (_, page) = fleet.get("/v1/dead-letters?limit=1").await;
    assert_eq!(page["data"].as_array().unwrap().len(), 1);
    let cursor = page["next_cursor"].as_str().expect("a next page");
    let (_, rest) = fleet.get(&format!("/v1/dead-letters?limit=5&cursor={cursor}")).await;
    assert_eq!(rest["data"].as_array().unwrap().len(), 2);
    let (status, _) = fleet.get("/v1/dead-letters?since=yesterday").await;
    assert_eq!(status, 422);

    // Retry one: same execution id, fresh attempt count, off the dead-letter queue once confirmed.
    healthy.store(true, Ordering::SeqCst);
    let (status, body) = fleet.post(&format!("/v1/dead-letters/{a1}/retry"), &json!({})).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["data"]["execution_id"], a1.as_str());
    let done = fleet.wait_status(&a1, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(done["result"], "recovered");
    let attempts = done["attempts"].as_array().unwrap();
    assert_eq!(attempts.last().unwrap()["attempt"], 1, "the replay starts a fresh attempt count");
    let (status, _) = fleet.get(&format!("/v1/dead-letters/{a1}")).await;
    assert_eq!(status, 404);
    let (status, _) = fleet.post(&format!("/v1/dead-letters/{a1}/retry"), &json!({})).await;
    assert_eq!(status, 404, "it is no longer dead-lettered");

    // A stale copy of a dead letter whose job has since succeeded: retrying it runs nothing.
    let calls_before = receiver.received_for(&a1).len();
    let record = json!({"execution_id": a1, "tool_name": "alpha", "assistant_id": "asst_1", "room_id": "room_1",
        "attempts": 1, "last_error": "HTTP 404", "first_attempt_at": null, "last_attempt_at": null, "reason": "permanent",
        "dead_lettered_at": "2026-01-01T00:00:00Z", "history": [],
        "job": done_job(&a1)});
    let (conn, channel) = fleet.amqp().await;
    channel.confirm_select(Default::default()).await.unwrap();
    channel
        .basic_publish(
            fleet.topology.dead_letter_exchange().as_str().into(),
            "".into(),
            BasicPublishOptions::default(),
            record.to_string().as_bytes(),
            BasicProperties::default().with_content_type("application/json".into()).with_delivery_mode(2),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let _ = conn.close(200, "".into()).await;
    wait_for("the stale copy drained into Redis", Duration::from_secs(20), || async {
        (fleet.get(&format!("/v1/dead-letters/{a1}")).await.0 == 200).then_some(())
    })
    .await;
    // The execution succeeded since: nothing is retried, and the stale dead letter goes.
    let (status, body) = fleet.post(&format!("/v1/dead-letters/{a1}/retry"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["status"], "succeeded", "{body}");
    let (status, _) = fleet.get(&format!("/v1/dead-letters/{a1}")).await;
    assert_eq!(status, 404, "the stale dead letter is removed");
    assert_eq!(fleet.get(&format!("/v1/executions/{a1}")).await.1["data"]["status"], "succeeded");
    assert_eq!(receiver.received_for(&a1).len(), calls_before, "a succeeded job is not run again");

    // Bulk redrive by tool, at a bounded rate.
    let (status, body) =
        fleet.post("/v1/dead-letters/retry", &json!({"tool_name": "beta", "rate_per_second": 20})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["done"], 1);
    fleet.wait_status(&b1, "succeeded", Duration::from_secs(20)).await;

    // fleetctl sees the one left, and purges it with a count.
    let listed = fleetctl(&fleet, &["dead-letters", "list"]);
    assert!(listed.contains(&a2), "{listed}");
    assert!(fleetctl(&fleet, &["dead-letters", "list", "--tool", "alpha"]).contains(&a2));
    assert!(!fleetctl(&fleet, &["dead-letters", "list", "--tool", "beta"]).contains(&a2));
    assert!(fleetctl(&fleet, &["dead-letters", "show", &a2]).contains("\"history\""));
    let queues = fleetctl(&fleet, &["queues"]);
    assert!(queues.contains(&dlq), "{queues}");
    let refused = fleetctl_status(&fleet, &["dead-letters", "purge", "--all"]);
    assert!(!refused.success(), "purge needs --yes");
    let purged = fleetctl(&fleet, &["dead-letters", "purge", "--all", "--reason", "permanent", "--yes"]);
    assert!(purged.contains("purged 1 dead letter"), "{purged}");
    assert_eq!(fleet.queue_depth(&dlq).await, 0);
    let (_, listed) = fleet.get("/v1/dead-letters").await;
    assert_eq!(listed["data"], json!([]));
}

fn done_job(id: &str) -> Value {
    json!({"v": 1, "execution_id": id, "attempt": 1, "enqueued_at_ms": 1, "kind": "tool_call",
        "tool_name": "alpha", "parameters": {"query": "1"}, "room_id": "room_1", "assistant_id": "asst_1"})
}

fn fleetctl_command(fleet: &fleet_tests::Fleet, args: &[&str]) -> std::process::Command {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let mut cmd = std::process::Command::new(dir.join("fleetctl"));
    cmd.args(args)
        .env("FLEET_AMQP_URL", fleet_tests::amqp_url())
        .env("FLEET_REDIS_URL", fleet_tests::redis_url())
        .env("FLEET_TOPOLOGY_PREFIX", fleet.topology.prefix())
        .env("FLEET_REDIS_KEY_PREFIX", &fleet.key_prefix);
    cmd
}

fn fleetctl(fleet: &fleet_tests::Fleet, args: &[&str]) -> String {
    let out = fleetctl_command(fleet, args).output().expect("run fleetctl");
    assert!(out.status.success(), "fleetctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn fleetctl_status(fleet: &fleet_tests::Fleet, args: &[&str]) -> std::process::ExitStatus {
    fleetctl_command(fleet, args).output().expect("run fleetctl").status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_never_skips_dead_letters_of_the_same_millisecond() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    let keys = fleet_protocol::keys::Keys::new(&fleet.key_prefix);
    let client = redis::Client::open(fleet_tests::redis_url()).unwrap();
    let mut con = fleet_tests::redis_connection(&client).await;
    let ids = ["exec_same_a", "exec_same_b", "exec_same_c", "exec_other"];
    for (n, id) in ids.iter().enumerate() {
        let at: i64 = if n < 3 { 1_768_910_400_000 } else { 1_768_910_300_000 };
        let record = json!({"execution_id": id, "tool_name": "t", "assistant_id": null, "room_id": null, "attempts": 1,
            "last_error": "HTTP 404", "first_attempt_at": null, "last_attempt_at": null, "reason": "permanent",
            "dead_lettered_at": "2026-01-20T12:00:00Z", "history": []});
        let _: () =
            redis::cmd("SET").arg(keys.dead_letter(id)).arg(record.to_string()).query_async(&mut con).await.unwrap();
        let _: () =
            redis::cmd("ZADD").arg(keys.dead_letters_index()).arg(at).arg(id).query_async(&mut con).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..6 {
        let path = match &cursor {
            Some(c) => format!("/v1/dead-letters?limit=1&cursor={c}"),
            None => "/v1/dead-letters?limit=1".to_string(),
        };
        let (status, page) = fleet.get(&path).await;
        assert_eq!(status, 200, "{page}");
        for r in page["data"].as_array().unwrap() {
            seen.push(r["execution_id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, ["exec_same_c", "exec_same_b", "exec_same_a", "exec_other"], "newest first, none skipped");
}

/// Collects what went wrong instead of stopping at the first problem, so one run shows them all.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn check(&mut self, ok: bool, what: impl Into<String>) {
        if !ok {
            self.0.push(what.into());
        }
    }
}

/// Every record the API lists for `query`, following `next_cursor` to the end.
async fn list_all(fleet: &fleet_tests::Fleet, query: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let path = match &cursor {
            Some(c) => format!("/v1/dead-letters?limit=200&{query}&cursor={c}"),
            None => format!("/v1/dead-letters?limit=200&{query}"),
        };
        let (status, page) = fleet.get(&path).await;
        assert_eq!(status, 200, "{path}: {page}");
        all.extend(page["data"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    all
}

fn ids_of(records: &[Value]) -> Vec<String> {
    records.iter().map(|r| r["execution_id"].as_str().unwrap_or_default().to_string()).collect()
}

fn metric(text: &str, prefix: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(prefix)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

async fn redis_con() -> redis::aio::MultiplexedConnection {
    fleet_tests::redis_connection(&redis::Client::open(fleet_tests::redis_url()).unwrap()).await
}

/// A worker of concurrency 64 keeping dead letters a day, with tool `perm` calling `receiver`.
async fn perm_fleet(receiver: &Receiver) -> fleet_tests::Fleet {
    let fleet = spawn_fleet(
        FleetOptions::default()
            .env("FLEET_WORKER_CONCURRENCY", "64")
            .env("FLEET_DEAD_LETTER_RETENTION", "86400")
            .env("FLEET_DEAD_LETTER_MAX", "100000"),
    )
    .await;
    fleet.register_tool("perm", &receiver.url("/perm"), SECRET).await;
    fleet
}

/// Dead letters of tool `ancient` from two days ago (a millisecond apart, in order), in the
/// record store and its index as a save two days ago left them; returns now (ms).
async fn plant_expired(keys: &fleet_protocol::keys::Keys, ids: &[String]) -> i64 {
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let old_ms = now_ms - 2 * 86_400_000;
    let mut pipe = redis::pipe();
    for (n, id) in ids.iter().enumerate() {
        let old = json!({"execution_id": id, "tool_name": "ancient", "assistant_id": null, "room_id": null,
            "attempts": 1, "last_error": "HTTP 404", "first_attempt_at": null, "last_attempt_at": null,
            "reason": "permanent", "dead_lettered_at": fleet_protocol::timefmt::rfc3339_from_millis(old_ms),
            "history": []});
        pipe.set(keys.dead_letter(id), old.to_string()).ignore();
        pipe.zadd(keys.dead_letters_index(), id, old_ms + n as i64).ignore();
    }
    let _: () = pipe.query_async(&mut redis_con().await).await.unwrap();
    now_ms
}

/// `n` calls of tool `perm` (its receiver answers 404), accepted 32 at a time, once the worker
/// has dead-lettered them all; their execution ids.
async fn dead_lettered_calls(fleet: &fleet_tests::Fleet, n: usize) -> Vec<String> {
    let accepted: Vec<String> = futures::stream::iter(0..n)
        .map(|i| async move { fleet.call_tool("perm", json!({"query": i.to_string()})).await })
        .buffer_unordered(32)
        .collect()
        .await;
    wait_for(&format!("{n} dead letters"), Duration::from_secs(180), || async {
        let m = fleet.worker_metrics(0).await;
        (metric(&m, "fleet_dead_letters_total{kind=\"tool_call\",reason=\"permanent\"}") == n as u64).then_some(())
    })
    .await;
    accepted
}

async fn publish_to_dead_exchange(fleet: &fleet_tests::Fleet, body: &[u8]) {
    let (conn, channel) = fleet.amqp().await;
    channel.confirm_select(Default::default()).await.unwrap();
    channel
        .basic_publish(
            fleet.topology.dead_letter_exchange().as_str().into(),
            "".into(),
            BasicPublishOptions::default(),
            body,
            BasicProperties::default().with_content_type("text/plain".into()).with_delivery_mode(2),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let _ = conn.close(200, "".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_of_two_thousand_dead_letters_can_be_found_retried_and_purged() {
    const N: usize = 2000;
    let healthy: Arc<std::sync::Mutex<std::collections::HashSet<String>>> = Default::default();
    let ok = healthy.clone();
    let receiver = Receiver::start(SECRET, move |r, _| {
        if ok.lock().unwrap().contains(r.execution_id()) {
            Reply::result(json!("recovered"))
        } else {
            Reply::status(404)
        }
    })
    .await;
    let fleet = perm_fleet(&receiver).await;
    let keys = fleet_protocol::keys::Keys::new(&fleet.key_prefix);
    let mut con = redis_con().await;
    let mut p = Problems::default();

    // A dead letter from two days ago: past the one-day retention, so the next save trims it.
    plant_expired(&keys, &["exec_ancient".to_string()]).await;

    // The oldest: two poison messages through the worker and one raw body the broker dead-lettered.
    for body in [&b"not json at all"[..], &b"{\"v\": 99}"[..]] {
        fleet.publish_raw(body, BasicProperties::default().with_content_type("application/json".into())).await;
    }
    publish_to_dead_exchange(&fleet, b"\x00raw bytes no worker ever parsed").await;
    wait_for("the worker's two poison dead letters", Duration::from_secs(20), || async {
        (metric(&fleet.worker_metrics(0).await, "fleet_dead_letters_total{kind=\"unknown\",reason=\"poison\"}") == 2)
            .then_some(())
    })
    .await;

    // 2,000 permanent failures (the receiver answers 404), accepted 32 at a time.
    let started = std::time::Instant::now();
    let accepted = dead_lettered_calls(&fleet, N).await;
    eprintln!("2,000 dead letters in {:?}", started.elapsed());
    let listed = wait_for("the 2,000 listed", Duration::from_secs(30), || async {
        let all = list_all(&fleet, "tool_name=perm").await;
        (all.len() >= N).then_some(all)
    })
    .await;
    let listed_ids = ids_of(&listed);
    let unique: std::collections::HashSet<&String> = listed_ids.iter().collect();
    p.check(
        unique.len() == N && accepted.iter().all(|id| unique.contains(id)),
        format!("listing: {} ids, {} unique", listed_ids.len(), unique.len()),
    );
    let newest = listed_ids[0].clone();
    let oldest = listed_ids[N - 1].clone();

    // The newest and the oldest can be shown and retried (the receiver now accepts them).
    for id in [&newest, &oldest] {
        let (status, body) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
        p.check(status == 200, format!("show {id}: {status} {body}"));
        healthy.lock().unwrap().insert(id.clone());
        let (status, body) = fleet.post(&format!("/v1/dead-letters/{id}/retry"), &json!({})).await;
        p.check(status == 202, format!("retry {id}: {status} {body}"));
        if status == 202 {
            fleet.wait_status(id, "succeeded", Duration::from_secs(30)).await;
        }
    }

    // Two concurrent retries of one dead letter publish it once.
    let twice = listed_ids[N / 2].clone();
    healthy.lock().unwrap().insert(twice.clone());
    let path = format!("/v1/dead-letters/{twice}/retry");
    let empty = json!({});
    let (a, b) = tokio::join!(fleet.post(&path, &empty), fleet.post(&path, &empty));
    let mut codes = [a.0, b.0];
    codes.sort();
    p.check(codes[0] == 202 && codes[1] != 202, format!("concurrent retries answered {a:?} and {b:?}"));
    if codes[0] == 202 {
        fleet.wait_status(&twice, "succeeded", Duration::from_secs(30)).await;
    }

    // The second newest and second oldest can be purged one by one; a second delete finds nothing.
    for id in [&listed_ids[1], &listed_ids[N - 2]] {
        let (status, body) = fleet.request(reqwest::Method::DELETE, &format!("/v1/dead-letters/{id}"), None).await;
        p.check(status == 204, format!("delete {id}: {status} {body}"));
        let (status, _) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
        p.check(status == 404, format!("{id} still shown after delete: {status}"));
        let (status, _) = fleet.request(reqwest::Method::DELETE, &format!("/v1/dead-letters/{id}"), None).await;
        p.check(status == 404, format!("second delete of {id}: {status}"));
    }

    // Poison records, behind 2,000 newer ones, are found by a filtered listing and purged.
    let poison = list_all(&fleet, "reason=poison").await;
    p.check(poison.len() == 3, format!("poison listed: {}", poison.len()));
    let raw = poison.iter().find(|r| r["raw_body"].as_str().is_some_and(|b| b.contains("raw bytes no worker")));
    p.check(raw.is_some(), "the broker's raw poison body is listed");
    if let Some(raw) = raw {
        let id = raw["execution_id"].as_str().unwrap();
        let (status, _) = fleet.request(reqwest::Method::DELETE, &format!("/v1/dead-letters/{id}"), None).await;
        p.check(status == 204, format!("delete raw poison {id}: {status}"));
    }
    let (status, body) = fleet.post("/v1/dead-letters/purge", &json!({"reason": "poison"})).await;
    p.check(status == 200 && body["data"]["done"] == 2, format!("purge poison: {status} {body}"));

    // A purge with a limit deletes that many and no more (deletes go several at a time).
    const LIMIT: usize = 37;
    let (status, body) = fleet.post("/v1/dead-letters/purge", &json!({"tool_name": "perm", "limit": LIMIT})).await;
    p.check(status == 200 && body["data"]["done"] == LIMIT, format!("purge with a limit: {status} {body}"));

    // Two concurrent bulk purges over the two halves of the time range cover every one left.
    let left = N - 5 - LIMIT;
    let mid = listed[N / 4]["dead_lettered_at"].as_str().unwrap().to_string();
    let (until, since) = (json!({"tool_name": "perm", "until": mid}), json!({"tool_name": "perm", "since": mid}));
    let purging = std::time::Instant::now();
    let (older, newer) =
        tokio::join!(fleet.post("/v1/dead-letters/purge", &until), fleet.post("/v1/dead-letters/purge", &since));
    eprintln!("two concurrent bulk purges of {left} dead letters in {:?}", purging.elapsed());
    let done = older.1["data"]["done"].as_u64().unwrap_or(0) + newer.1["data"]["done"].as_u64().unwrap_or(0);
    p.check(done == left as u64, format!("bulk purges removed {done} of {left}: {older:?} {newer:?}"));
    let rest = list_all(&fleet, "").await;
    p.check(rest.is_empty(), format!("{} dead letters listed after purging all", rest.len()));

    // Nothing ran twice; the dead-letter queue does not keep growing; the ancient one was trimmed.
    let hits = metric(&fleet.worker_metrics(0).await, "fleet_idempotency_hits_total{kind=\"tool_call\"}");
    p.check(
        hits == 0 && receiver.received_for(&twice).len() == 2,
        format!("{twice}: {} calls, {hits} duplicates", receiver.received_for(&twice).len()),
    );
    let depth = fleet.queue_depth(&fleet.topology.dead_letter_queue()).await;
    p.check(depth == 0, format!("dead-letter queue holds {depth} messages"));
    let (exists, rank): (bool, Option<i64>) = redis::pipe()
        .exists(keys.dead_letter("exec_ancient"))
        .zrank(keys.dead_letters_index(), "exec_ancient")
        .query_async(&mut con)
        .await
        .unwrap();
    p.check(!exists && rank.is_none(), format!("past retention: record kept {exists}, index rank {rank:?}"));
    assert!(p.0.is_empty(), "problems:\n{}", p.0.join("\n"));
}

/// Every save trims what is past retention, and many saves run at once (a worker's concurrent
/// dead letters, the dispatcher's drain). Two trims that both counted the same expired entries
/// must not drop them twice over: the second would take the oldest live dead letters instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saves_trimming_at_once_drop_only_what_is_past_retention() {
    const EXPIRED: usize = 300;
    const CALLS: usize = 300;
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(404)).await;
    let fleet = perm_fleet(&receiver).await;
    // Dead letters from two days ago, past the one-day retention: the next saves trim them.
    let keys = fleet_protocol::keys::Keys::new(&fleet.key_prefix);
    let expired: Vec<String> = (0..EXPIRED).map(|n| format!("exec_expired_{n}")).collect();
    let now_ms = plant_expired(&keys, &expired).await;
    let accepted = dead_lettered_calls(&fleet, CALLS).await;
    let listed = ids_of(&list_all(&fleet, "tool_name=perm").await);
    let lost: Vec<&String> = accepted.iter().filter(|id| !listed.contains(id)).collect();
    assert!(lost.is_empty(), "{} of {CALLS} live dead letters were trimmed: {lost:?}", lost.len());
    let left: u64 = redis::cmd("ZCOUNT")
        .arg(keys.dead_letters_index())
        .arg("-inf")
        .arg(format!("({}", now_ms - 86_400_000))
        .query_async(&mut redis_con().await)
        .await
        .unwrap();
    assert_eq!(left, 0, "the expired dead letters were trimmed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dead_letter_index_keeps_at_most_its_maximum() {
    let fleet =
        spawn_fleet(FleetOptions::default().env("FLEET_DEAD_LETTER_MAX", "5").env("FLEET_WORKER_CONCURRENCY", "1"))
            .await;
    for n in 0..8 {
        fleet
            .publish_raw(
                format!("poison {n}").as_bytes(),
                BasicProperties::default().with_content_type("text/plain".into()),
            )
            .await;
    }
    wait_for("eight poison dead letters", Duration::from_secs(20), || async {
        (metric(&fleet.worker_metrics(0).await, "fleet_dead_letters_total{kind=\"unknown\",reason=\"poison\"}") == 8)
            .then_some(())
    })
    .await;
    let keys = fleet_protocol::keys::Keys::new(&fleet.key_prefix);
    let mut con = redis_con().await;
    let card: u64 = redis::cmd("ZCARD").arg(keys.dead_letters_index()).query_async(&mut con).await.unwrap();
    let records: Vec<String> = redis::cmd("KEYS").arg(keys.dead_letter("*")).query_async(&mut con).await.unwrap();
    let listed = list_all(&fleet, "").await;
    let bodies: Vec<&str> = listed.iter().filter_map(|r| r["raw_body"].as_str()).collect();
    assert_eq!(
        (card, records.len(), bodies.clone()),
        (5, 5, vec!["poison 7", "poison 6", "poison 5", "poison 4", "poison 3"]),
        "the index, the records and the listing keep the newest five"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_made_while_redis_is_down_is_stored_when_it_returns() {
    let redis = fleet_tests::redis_instance::RedisInstance::start(&[]).await;
    let proxy = fleet_tests::proxy::Proxy::start(format!("127.0.0.1:{}", redis.port).parse().unwrap()).await;
    let fleet = spawn_fleet(
        FleetOptions::default()
            .env("FLEET_REDIS_URL", &format!("redis://{}/0", proxy.addr))
            .env("FLEET_REDIS_TIMEOUT", "0.5"),
    )
    .await;
    proxy.cut();
    fleet.publish_raw(b"poison while redis is down", BasicProperties::default()).await;
    wait_for("the poison message dead-lettered onto the queue", Duration::from_secs(20), || async {
        let m = fleet.worker_metrics(0).await;
        (metric(&m, "fleet_dead_letters_total{kind=\"unknown\",reason=\"poison\"}") == 1).then_some(())
    })
    .await;
    // Neither the worker nor the drain can store it now: the queue's confirmed copy holds it.
    proxy.restore();
    // The dispatcher's own Redis connection comes back on its own schedule: until it does, the
    // listing answers 503, which is "not yet" here, not a failure.
    let listed = wait_for("the dead letter stored once Redis is back", Duration::from_secs(30), || async {
        let (status, page) = fleet.get("/v1/dead-letters?limit=200&reason=poison").await;
        let all = page["data"].as_array().cloned().unwrap_or_default();
        (status == 200 && !all.is_empty()).then_some(all)
    })
    .await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["raw_body"], "poison while redis is down");
    wait_for("the dead-letter queue drained", Duration::from_secs(20), || async {
        (fleet.queue_depth(&fleet.topology.dead_letter_queue()).await == 0).then_some(())
    })
    .await;
}
