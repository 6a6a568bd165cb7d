//! `fleet-console-bench` (`make bench-console`): the console's pages and the list APIs against a
//! Redis of its own holding 100,000 dead letters, 1,000,000 executions, 20,000 webhook deliveries
//! and 15 minutes of workers' activity reports (written straight into the store's keys, as the
//! fleet writes them). Prints each page's server time (median of 5, the
//! request timed from the test process on loopback). Settings: FLEET_BENCH_EXECUTIONS (1000000),
//! FLEET_BENCH_DEAD_LETTERS (100000).

use std::time::{Duration, Instant};

use serde_json::json;

use fleet_protocol::keys::{dead_letter_count_field, dead_letter_facet, Keys};
use fleet_tests::redis_instance::RedisInstance;
use fleet_tests::{spawn_fleet, FleetOptions};

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

const STATUSES: [&str; 4] = ["succeeded", "succeeded", "failed", "dead_lettered"];

/// Writes `n` execution records and their index entries, 1,000 per pipeline.
async fn fill_executions(redis: &mut redis::aio::MultiplexedConnection, keys: &Keys, n: usize, now: i64) {
    let mut pipe = redis::pipe();
    for i in 0..n {
        let id = format!("exec_{i:032x}");
        let at = now - (n - i) as i64 * 10;
        let (tool, room, status) = (format!("tool_{}", i % 50), format!("room_{}", i % 20_000), STATUSES[i % 4]);
        pipe.cmd("HSET")
            .arg(keys.execution(&id))
            .arg("kind")
            .arg("tool_call")
            .arg("status")
            .arg(status)
            .arg("tool_name")
            .arg(&tool)
            .arg("room_id")
            .arg(&room)
            .arg("created_at_ms")
            .arg(at)
            .arg("updated_at_ms")
            .arg(at)
            .arg("attempts")
            .arg(1)
            .ignore();
        for (dim, value) in [("all", ""), ("kind", "tool_call"), ("tool", tool.as_str()), ("room", room.as_str())] {
            pipe.cmd("ZADD").arg(keys.executions_index(dim, value)).arg(at).arg(&id).ignore();
        }
        if i % 1_000 == 999 || i == n - 1 {
            let _: () = pipe.query_async(redis).await.unwrap();
            pipe = redis::pipe();
        }
    }
}

/// The overview's and the webhooks page's data: 15 minutes of activity buckets (every kind and
/// tally) with 50 workers' running reports, and 20,000 webhook deliveries (a quarter of them
/// dead-lettered) in the executions index.
async fn fill_activity_and_webhooks(redis: &mut redis::aio::MultiplexedConnection, keys: &Keys, now: i64) {
    use fleet_protocol::activity::{self, Tally};
    let mut pipe = redis::pipe();
    for bucket in activity::window(now) {
        for kind in ["tool_call", "webhook", "turn"] {
            for tally in Tally::ALL {
                pipe.cmd("HSET").arg(keys.activity_bucket(bucket)).arg(activity::field(kind, tally)).arg(40).ignore();
            }
        }
    }
    for w in 0..50 {
        let worker = format!("worker-{w}");
        pipe.cmd("HSET").arg(keys.activity_running()).arg(&worker).arg("tool_call=7,turn=2").ignore();
        pipe.cmd("ZADD").arg(keys.activity_workers()).arg(now).arg(&worker).ignore();
    }
    let _: () = pipe.query_async(&mut *redis).await.unwrap();
    let mut pipe = redis::pipe();
    for i in 0..20_000usize {
        let id = format!("exec_wh{i:029x}");
        let at = now - (20_000 - i) as i64 * 10;
        let status = if i % 4 == 0 { "dead_lettered" } else { "succeeded" };
        pipe.cmd("HSET")
            .arg(keys.execution(&id))
            .arg(&[("kind", "webhook"), ("status", status), ("attempts", "5"), ("last_error", "HTTP 500")])
            .arg("created_at_ms")
            .arg(at)
            .arg("updated_at_ms")
            .arg(at)
            .ignore();
        for (dim, value) in [("all", ""), ("kind", "webhook")] {
            pipe.cmd("ZADD").arg(keys.executions_index(dim, value)).arg(at).arg(&id).ignore();
        }
        if i % 1_000 == 999 {
            let _: () = pipe.query_async(&mut *redis).await.unwrap();
            pipe = redis::pipe();
        }
    }
}

/// Writes `n` dead-letter records and their index, 1,000 per pipeline.
async fn fill_dead_letters(redis: &mut redis::aio::MultiplexedConnection, keys: &Keys, n: usize, now: i64) {
    let mut pipe = redis::pipe();
    for i in 0..n {
        let id = format!("exec_dl{i:029x}");
        let at = now - (n - i) as i64 * 10;
        let record = json!({
            "execution_id": id, "kind": "tool_call", "tool_name": format!("tool_{}", i % 50), "assistant_id": "asst_1",
            "room_id": format!("room_{i}"), "attempts": 6, "last_error": "HTTP 503", "first_attempt_at": null,
            "last_attempt_at": null, "reason": if i % 3 == 0 { "permanent" } else { "exhausted" },
            "dead_lettered_at": fleet_protocol::timefmt::rfc3339_from_millis(at), "history": [],
            "job": {"kind": "tool_call", "tool_name": format!("tool_{}", i % 50), "parameters": {"query": format!("q{i}")}},
        });
        pipe.cmd("SET").arg(keys.dead_letter(&id)).arg(record.to_string()).arg("EX").arg(86_400).ignore();
        pipe.cmd("ZADD").arg(keys.dead_letters_index()).arg(at).arg(&id).ignore();
        // The facet and counts the store's insert script keeps.
        let (reason, tool) = (record["reason"].as_str().unwrap(), record["tool_name"].as_str().unwrap());
        pipe.cmd("HSET").arg(keys.dead_letters_facets()).arg(&id).arg(dead_letter_facet(reason, Some(tool))).ignore();
        for (r, t) in [(None, None), (Some(reason), None), (None, Some(tool)), (Some(reason), Some(tool))] {
            pipe.cmd("HINCRBY").arg(keys.dead_letters_counts()).arg(dead_letter_count_field(r, t)).arg(1).ignore();
        }
        if i % 1_000 == 999 || i == n - 1 {
            let _: () = pipe.query_async(redis).await.unwrap();
            pipe = redis::pipe();
        }
    }
}

/// The median time of 5 GETs of `path` with the session cookie.
async fn time_get(http: &reqwest::Client, base: &str, path: &str, cookie: &str) -> (Duration, u16) {
    let mut times = vec![];
    let mut status = 0;
    for _ in 0..5 {
        let started = Instant::now();
        let r = http.get(format!("{base}{path}")).header("cookie", cookie).send().await.unwrap();
        status = r.status().as_u16();
        let _ = r.bytes().await;
        times.push(started.elapsed());
    }
    times.sort();
    (times[2], status)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (executions, dead) =
        (setting("FLEET_BENCH_EXECUTIONS", 1_000_000), setting("FLEET_BENCH_DEAD_LETTERS", 100_000));
    let redis_server = RedisInstance::start(&[]).await;
    let fleet = spawn_fleet(FleetOptions::default().workers(0).env("FLEET_REDIS_URL", &redis_server.url())).await;
    let keys = Keys::new(fleet.key_prefix.clone());
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(60)));
    let client = redis::Client::open(redis_server.url()).unwrap();
    let mut redis = client.get_multiplexed_async_connection_with_config(&config).await.unwrap();
    let now = fleet_platform::now_ms();
    let started = Instant::now();
    fill_executions(&mut redis, &keys, executions, now).await;
    fill_dead_letters(&mut redis, &keys, dead, now).await;
    fill_activity_and_webhooks(&mut redis, &keys, now).await;
    let dbsize: u64 = redis::cmd("DBSIZE").query_async(&mut redis).await.unwrap();
    println!("filled {executions} executions and {dead} dead letters ({dbsize} keys) in {:.1?}", started.elapsed());

    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let login = fleet_tests::console_login(&http, &fleet.api, &fleet.token, false).await;
    let cookie = login.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    let token_cookie = cookie.clone();
    let newest_dead = format!("/console/dead-letters/exec_dl{:029x}", dead - 1);
    let pages = [
        "/console",
        "/console/dead-letters",
        "/console/dead-letters?tool_name=tool_7",
        "/console/dead-letters?reason=permanent",
        "/console/dead-letters?q=room_99998",
        "/console/dead-letters?q=no-such-thing",
        newest_dead.as_str(),
        "/console/executions",
        "/console/executions?status=dead_lettered",
        "/console/executions?room_id=room_777",
        "/console/executions?tool_name=tool_3&status=failed",
        "/console/executions/exec_00000000000000000000000000000001",
        "/console/tools",
        "/console/webhooks",
        "/console/audit",
    ];
    println!("| page | status | server time (median of 5) |\n|---|---|---|");
    for page in pages {
        let (t, status) = time_get(&http, &fleet.api, page, &token_cookie).await;
        println!("| `{page}` | {status} | {:.1} ms |", t.as_secs_f64() * 1000.0);
    }
    for path in ["/v1/executions?limit=50", "/v1/executions?status=failed&limit=50", "/v1/dead-letters?limit=50"] {
        let started = Instant::now();
        let r = http.get(format!("{}{path}", fleet.api)).bearer_auth(&fleet.token).send().await.unwrap();
        let status = r.status().as_u16();
        let _ = r.bytes().await;
        println!("| `{path}` (API) | {status} | {:.1} ms |", started.elapsed().as_secs_f64() * 1000.0);
    }
    // The bulk previews: from the counts kept per reason and tool, or a bounded scan for a search.
    let page = http.get(format!("{}/console/dead-letters", fleet.api)).header("cookie", &cookie).send().await.unwrap();
    let body = page.text().await.unwrap();
    let csrf = body.split("name=\"csrf\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_string();
    let previews: [&[(&str, &str)]; 6] = [
        &[],
        &[("tool_name", "tool_7")],
        &[("reason", "permanent")],
        &[("reason", "permanent"), ("tool_name", "tool_7")],
        &[("q", "room_99998")],
        &[("since", "2000-01-01T00:00:00Z")],
    ];
    for filter in previews {
        let mut form = vec![("csrf", csrf.as_str())];
        form.extend_from_slice(filter);
        let mut times = vec![];
        let mut shown = String::new();
        for _ in 0..5 {
            let started = Instant::now();
            let r = http
                .post(format!("{}/console/dead-letters/redrive/preview", fleet.api))
                .header("cookie", &cookie)
                .form(&form)
                .send()
                .await
                .unwrap();
            let body = r.text().await.unwrap();
            times.push(started.elapsed());
            let at = body.split("<p class=\"preview\">").nth(1).unwrap_or_default();
            shown = at
                .split(" dead letters")
                .next()
                .unwrap_or_default()
                .replace("<b id=\"match-count\">", "")
                .replace("</b>", "");
        }
        times.sort();
        let named: Vec<String> = filter.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "| redrive preview `{}` (shows \"{shown}\") | 200 | {:.1} ms |",
            if named.is_empty() { "all".into() } else { named.join(" ") },
            times[2].as_secs_f64() * 1000.0
        );
    }
}
