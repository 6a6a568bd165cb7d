//! The operator's views across processes: `GET /v1/executions` (filters, cursor paging, the
//! index's retention), the audit log every operator route writes (`GET /v1/audit`), and the
//! console served at `/console` (login, read-only sessions, CSRF, escaping).

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{json, Value};

use fleet_tests::console::{ConsoleClient, Login};
use fleet_tests::{spawn_fleet, wait_for, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_console_tests_12345";

fn ids(page: &Value) -> Vec<String> {
    page["data"].as_array().unwrap().iter().map(|e| e["execution_id"].as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executions_are_listed_newest_first_by_every_filter_with_cursor_paging() {
    let receiver =
        Receiver::start(
            SECRET,
            |r, _| if r.path == "/broken" { Reply::status(404) } else { Reply::result(json!("ok")) },
        )
        .await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    fleet.register_tool("broken", &receiver.url("/broken"), SECRET).await;
    let mut echoes = vec![];
    for n in 0..3 {
        echoes.push(fleet.call_tool("echo", json!({"query": format!("{n}")})).await);
    }
    let (status, other) = fleet
        .post(
            "/v1/tool-calls",
            &json!({"tool_name": "echo", "parameters": {"query": "x"}, "room_id": "room_x", "assistant_id": "asst_x"}),
        )
        .await;
    assert_eq!(status, 202, "{other}");
    let other = other["data"]["execution_id"].as_str().unwrap().to_string();
    let broken = fleet.call_tool("broken", json!({"query": "b"})).await;
    for id in echoes.iter().chain([&other]) {
        fleet.wait_status(id, "succeeded", Duration::from_secs(20)).await;
    }
    fleet.wait_status(&broken, "dead_lettered", Duration::from_secs(20)).await;

    let (status, all) = fleet.get("/v1/executions").await;
    assert_eq!(status, 200, "{all}");
    let newest_first: Vec<String> = [&broken, &other].into_iter().chain(echoes.iter().rev()).cloned().collect();
    assert_eq!(ids(&all), newest_first);
    assert_eq!(all["next_cursor"], Value::Null);
    let first = &all["data"][0];
    assert_eq!((first["status"].as_str(), first["tool_name"].as_str()), (Some("dead_lettered"), Some("broken")));
    assert_eq!(first["attempts"], 1);

    let (_, by_tool) = fleet.get("/v1/executions?tool_name=echo").await;
    assert_eq!(ids(&by_tool).len(), 4);
    let (_, by_room) = fleet.get("/v1/executions?room_id=room_x").await;
    assert_eq!(ids(&by_room), vec![other.clone()]);
    let (_, by_session) = fleet.get("/v1/executions?session_id=room_x&assistant_id=asst_x").await;
    assert_eq!(ids(&by_session), vec![other.clone()]);
    let (_, by_status) = fleet.get("/v1/executions?status=dead_lettered&kind=tool_call").await;
    assert_eq!(ids(&by_status), vec![broken.clone()]);
    let (_, none) = fleet.get("/v1/executions?kind=turn").await;
    assert!(ids(&none).is_empty());
    let (_, future) = fleet.get("/v1/executions?since=2999-01-01T00:00:00Z").await;
    assert!(ids(&future).is_empty());
    let (_, past) = fleet.get("/v1/executions?until=2000-01-01T00:00:00Z").await;
    assert!(ids(&past).is_empty());

    // Two at a time: every execution once, in order.
    let mut seen = vec![];
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/executions?limit=2&cursor={c}"),
            None => "/v1/executions?limit=2".to_string(),
        };
        let (status, page) = fleet.get(&path).await;
        assert_eq!(status, 200, "{page}");
        seen.extend(ids(&page));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, newest_first);

    for bad in ["status=done", "cursor=nonsense", "since=yesterday", "limit=0", "room_id=a&session_id=b"] {
        let (status, body) = fleet.get(&format!("/v1/executions?{bad}")).await;
        assert_eq!(status, 422, "{bad}: {body}");
        assert!(body["error"]["message"].is_string());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_executions_index_is_bounded_by_its_retention() {
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default().workers(0).env("FLEET_EXECUTION_INDEX_MAX", "3")).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let mut calls = vec![];
    for n in 0..5 {
        calls.push(fleet.call_tool("echo", json!({"query": format!("{n}")})).await);
    }
    let (_, page) = fleet.get("/v1/executions").await;
    let newest: Vec<String> = calls.iter().rev().take(3).cloned().collect();
    assert_eq!(ids(&page), newest, "only the newest three are kept");
    let mut redis = fleet.redis().await;
    for set in ["all", "kind:tool_call", "tool:echo", "room:room_1", "assistant:asst_1"] {
        let key = format!("{}{{executions}}:{set}", fleet.key_prefix);
        let n: u64 = redis::cmd("ZCARD").arg(&key).query_async(&mut redis).await.unwrap();
        assert_eq!(n, 3, "{key}");
        let ttl: i64 = redis::cmd("TTL").arg(&key).query_async(&mut redis).await.unwrap();
        assert!(ttl > 0, "{key} expires when idle");
    }
}

/// The audit entries, newest first.
async fn audit(fleet: &fleet_tests::Fleet) -> Vec<Value> {
    let (status, page) = fleet.get("/v1/audit?limit=200").await;
    assert_eq!(status, 200, "{page}");
    page["data"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operator_change_is_written_to_the_audit_log() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(404)).await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("broken", &receiver.url("/broken"), SECRET).await;
    let mut dead = vec![];
    for n in 0..4 {
        dead.push(fleet.call_tool("broken", json!({"query": format!("{n}")})).await);
    }
    for id in &dead {
        fleet.wait_status(id, "dead_lettered", Duration::from_secs(20)).await;
    }
    wait_for("the dead letters stored", Duration::from_secs(20), || async {
        let (_, page) = fleet.get("/v1/dead-letters?tool_name=broken").await;
        (page["data"].as_array().unwrap().len() == 4).then_some(())
    })
    .await;
    let (status, _) = fleet.post(&format!("/v1/dead-letters/{}/retry", dead[0]), &json!({})).await;
    assert_eq!(status, 202);
    fleet.wait_status(&dead[0], "dead_lettered", Duration::from_secs(20)).await;
    let (status, _) = fleet.request(reqwest::Method::DELETE, &format!("/v1/dead-letters/{}", dead[1]), None).await;
    assert_eq!(status, 204);
    let (status, report) = fleet.post("/v1/dead-letters/purge", &json!({"execution_ids": [dead[2], dead[3]]})).await;
    assert_eq!((status, report["data"]["done"].as_u64()), (200, Some(2)), "{report}");
    let (status, closed) = fleet.post("/v1/tools/broken/circuit/close", &json!({})).await;
    assert_eq!((status, closed["data"]["was_open"].as_bool()), (200, Some(false)), "{closed}");
    let (status, _) = fleet.request(reqwest::Method::DELETE, "/v1/sessions/sess_audit", None).await;
    assert_eq!(status, 204);
    let (status, _) = fleet.post(&format!("/v1/executions/{}/cancel", dead[1]), &json!({})).await;
    assert_eq!(status, 409, "a dead-lettered execution has ended: nothing changes, nothing is audited");

    let entries = audit(&fleet).await;
    let seen: Vec<(&str, &str, u64)> = entries
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["target"].as_str().unwrap(), e["count"].as_u64().unwrap()))
        .collect();
    let purge_target = format!("execution_ids={},{}", dead[2], dead[3]);
    assert_eq!(
        seen,
        vec![
            ("session.forget", "sess_audit", 1),
            ("circuit.close", "broken", 0),
            ("dead_letters.purge", purge_target.as_str(), 2),
            ("dead_letter.delete", dead[1].as_str(), 1),
            ("dead_letter.retry", dead[0].as_str(), 1),
        ]
    );
    let token_digest = fleet_tests::token_digest_prefix(&fleet.token);
    for e in &entries {
        assert_eq!(e["actor"], format!("token:{token_digest}"), "who: a digest, never the token");
        assert_eq!(e["via"], "api");
        assert!(e["at"].as_str().unwrap().ends_with('Z'));
        assert!(!e.to_string().contains(&fleet.token));
    }
    let (_, first) = fleet.get("/v1/audit?limit=2").await;
    let cursor = first["next_cursor"].as_str().expect("a next page").to_string();
    let (_, rest) = fleet.get(&format!("/v1/audit?limit=10&cursor={cursor}")).await;
    let all: HashSet<String> = first["data"]
        .as_array()
        .unwrap()
        .iter()
        .chain(rest["data"].as_array().unwrap())
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(all.len(), 5);
    let (status, _) = fleet.get("/v1/audit?cursor=x").await;
    assert_eq!(status, 422);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_checks_sessions_csrf_schemas_and_confirmations_and_audits_changes() {
    let receiver = Receiver::start(SECRET, |r, _| {
        if r.json["parameters"]["query"] == "fixed" {
            Reply::result(json!("ok"))
        } else {
            Reply::status(404)
        }
    })
    .await;
    let (admin, reader, other) =
        ("console-admin-0123456789ab", "console-reader-0123456789ab", "tools-only-0123456789ab");
    let tokens = format!("{admin},{reader}:console:read,{other}:tools:read");
    let mut fleet = spawn_fleet(FleetOptions::default().env("FLEET_API_TOKENS", &tokens)).await;
    fleet.token = admin.to_string();
    fleet.register_tool("lookup", &receiver.url("/lookup"), SECRET).await;
    let mut dead = vec![];
    for q in ["<script>alert(1)</script>", "b", "purge-me"] {
        dead.push(fleet.call_tool("lookup", json!({"query": q})).await);
    }
    for id in &dead {
        fleet.wait_status(id, "dead_lettered", Duration::from_secs(20)).await;
    }
    wait_for("the dead letters stored", Duration::from_secs(20), || async {
        let (_, page) = fleet.get("/v1/dead-letters?tool_name=lookup").await;
        (page["data"].as_array().unwrap().len() == 3).then_some(())
    })
    .await;

    // A forged login (another site's form: neither the login form's token nor its cookie) is
    // refused, and so is a form token without its cookie.
    let forged = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    for form in [vec![("token", admin)], vec![("token", admin), ("csrf", &"a".repeat(64))]] {
        let r = forged.post(format!("{}/console/login", fleet.api)).form(&form).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 403, "{form:?}");
        let set = r.headers().get_all("set-cookie").iter().map(|v| v.to_str().unwrap().to_string()).collect::<Vec<_>>();
        assert!(set.iter().all(|c| !c.starts_with("fleet_console=")), "no session: {set:?}");
    }
    assert_eq!(ConsoleClient::login(&fleet.api, "wrong-token-0123456789", true).await.status, 401);
    assert_eq!(ConsoleClient::login(&fleet.api, other, true).await.status, 403, "no console scope");
    let Login { client: console, set_cookie: cookie, .. } = ConsoleClient::login(&fleet.api, admin, true).await;
    let console = console.unwrap();
    for attribute in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/console"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    let (status, _) = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(format!("{}/console/dead-letters", fleet.api))
        .send()
        .await
        .map(|r| (r.status().as_u16(), ()))
        .unwrap();
    assert_eq!(status, 303, "no session: to the login page");

    // Escaped, and the search finds it by a parameter substring.
    let (status, page) = console.get(&format!("/console/dead-letters/{}", dead[0])).await;
    assert_eq!(status, 200);
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;") && !page.contains("<script>alert"));
    let (_, found) = console.get("/console/dead-letters?q=alert").await;
    assert!(found.contains(&dead[0]) && !found.contains(&dead[1]));

    let csrf = console.csrf().await;
    let (status, _) = console.post(&format!("/console/dead-letters/{}/retry", dead[1]), &[]).await;
    assert_eq!(status, 403, "no CSRF token");
    let (status, _) = console.post(&format!("/console/dead-letters/{}/retry", dead[1]), &[("csrf", "forged")]).await;
    assert_eq!(status, 403, "a wrong CSRF token");

    // Retry with edited parameters: checked against the schema, then retried and audited.
    let edit = format!("/console/dead-letters/{}/retry-edited", dead[1]);
    let (status, page) = console.post(&edit, &[("csrf", &csrf), ("parameters", "{\"query\": 5}")]).await;
    assert_eq!(status, 422, "{page}");
    assert!(page.contains("query"), "names the failing path");
    let (status, page) = console.post(&edit, &[("csrf", &csrf), ("parameters", "{\"query\": \"fixed\"}")]).await;
    assert_eq!(status, 200, "{page}");
    fleet.wait_status(&dead[1], "succeeded", Duration::from_secs(20)).await;

    // Purge: the confirmation must name the count.
    let (_, preview) = console.post("/console/dead-letters/purge/preview", &[("csrf", &csrf), ("q", "purge-me")]).await;
    assert!(preview.contains("<b id=\"match-count\">1</b>"), "{preview}");
    let (status, _) =
        console.post("/console/dead-letters/purge", &[("csrf", &csrf), ("q", "purge-me"), ("confirm", "yes")]).await;
    assert_eq!(status, 422);
    let (status, _) = console
        .post("/console/dead-letters/purge", &[("csrf", &csrf), ("q", "purge-me"), ("confirm", "purge 1")])
        .await;
    assert_eq!(status, 200);
    let (status, _) = fleet.get(&format!("/v1/dead-letters/{}", dead[2])).await;
    assert_eq!(status, 404, "purged");

    // Read-only: pages without change forms; changes refused.
    let ro = ConsoleClient::login(&fleet.api, reader, true).await.client;
    let ro = ro.unwrap();
    let (_, page) = ro.get(&format!("/console/dead-letters/{}", dead[0])).await;
    assert!(!page.contains("/retry") && !page.contains("Delete") && page.contains("read-only"));
    let ro_csrf = ro.csrf().await;
    let (status, _) = ro.post(&format!("/console/dead-letters/{}/delete", dead[0]), &[("csrf", &ro_csrf)]).await;
    assert_eq!(status, 403);

    let entries = audit(&fleet).await;
    let seen: Vec<(&str, &str, &str)> = entries
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["via"].as_str().unwrap(), e["target"].as_str().unwrap()))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("dead_letters.purge", "console", "q=purge-me"),
            ("dead_letter.retry_edited", "console", dead[1].as_str())
        ]
    );
    assert_eq!(entries[1]["detail"]["parameters_after"], json!({"query": "fixed"}));
    assert_eq!(entries[1]["detail"]["parameters_before"], json!({"query": "b"}));
}

/// The number a bulk preview shows, with "at least " before it when it is a lower bound.
async fn preview(console: &ConsoleClient, csrf: &str, filter: &[(&str, &str)]) -> String {
    let mut form = vec![("csrf", csrf)];
    form.extend_from_slice(filter);
    let (status, page) = console.post("/console/dead-letters/redrive/preview", &form).await;
    assert_eq!(status, 200, "{page}");
    let before = page.split("<b id=\"match-count\">").next().unwrap();
    let lead = if before.ends_with("at least ") { "at least " } else { "" };
    let n = page.split("<b id=\"match-count\">").nth(1).unwrap().split('<').next().unwrap();
    format!("{lead}{n}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_previews_count_from_counts_kept_per_reason_and_tool() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(404)).await;
    let admin = "console-admin-0123456789ab";
    let mut fleet =
        spawn_fleet(FleetOptions::default().env("FLEET_API_TOKENS", admin).env("FLEET_DEAD_LETTER_MAX", "4")).await;
    fleet.token = admin.to_string();
    fleet.register_tool("alpha", &receiver.url("/a"), SECRET).await;
    fleet.register_tool("beta", &receiver.url("/b"), SECRET).await;
    // Five dead letters, one at a time so the fifth's insert trims the oldest (the maximum is 4).
    let mut dead = vec![];
    for (tool, q) in [("alpha", "qx1"), ("alpha", "qx2"), ("alpha", "qx3"), ("beta", "qy1"), ("beta", "qy2")] {
        let id = fleet.call_tool(tool, json!({"query": q})).await;
        fleet.wait_status(&id, "dead_lettered", Duration::from_secs(20)).await;
        wait_for("the dead letter stored", Duration::from_secs(20), || async {
            (fleet.get(&format!("/v1/dead-letters/{id}")).await.0 == 200).then_some(())
        })
        .await;
        dead.push(id);
    }
    assert_eq!(fleet.get(&format!("/v1/dead-letters/{}", dead[0])).await.0, 404, "trimmed");
    let console = ConsoleClient::login(&fleet.api, admin, true).await.client;
    let console = console.unwrap();
    let csrf = console.csrf().await;

    // Counted in Redis: what the trim dropped is uncounted with it.
    let counts = format!("{}{{dead_letters}}:counts", fleet.key_prefix);
    let mut redis = fleet.redis().await;
    let all: u64 = redis::cmd("HGET").arg(&counts).arg("all").query_async(&mut redis).await.unwrap();
    assert_eq!(all, 4, "the fifth insert trimmed the oldest");
    assert_eq!(preview(&console, &csrf, &[]).await, "4");
    assert_eq!(preview(&console, &csrf, &[("tool_name", "alpha")]).await, "2");
    assert_eq!(preview(&console, &csrf, &[("tool_name", "beta")]).await, "2");
    assert_eq!(preview(&console, &csrf, &[("reason", "permanent")]).await, "4");
    assert_eq!(preview(&console, &csrf, &[("reason", "exhausted")]).await, "0");
    assert_eq!(preview(&console, &csrf, &[("reason", "permanent"), ("tool_name", "beta")]).await, "2");
    // A search is counted by a bounded scan: exact while it reads everything. (The parameters
    // hold letters no hexadecimal execution id has, so only one record matches.)
    assert_eq!(preview(&console, &csrf, &[("q", "qy1")]).await, "1");

    // A delete (API) and a purge (console) lower the counts.
    let (status, _) = fleet.request(reqwest::Method::DELETE, &format!("/v1/dead-letters/{}", dead[1]), None).await;
    assert!(status == 200 || status == 204, "{status}");
    assert_eq!(preview(&console, &csrf, &[("tool_name", "alpha")]).await, "1");
    let purge = [("csrf", csrf.as_str()), ("tool_name", "beta"), ("confirm", "purge 2")];
    let (status, page) = console.post("/console/dead-letters/purge", &purge).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(preview(&console, &csrf, &[]).await, "1");
    assert_eq!(preview(&console, &csrf, &[("tool_name", "beta")]).await, "0");

    // An index entry the counts do not cover (a dead letter stored before they existed): the
    // preview no longer trusts them and scans instead.
    let index = format!("{}{{dead_letters}}:index", fleet.key_prefix);
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let _: () = redis::cmd("ZADD").arg(&index).arg(now_ms).arg("exec_legacy").query_async(&mut redis).await.unwrap();
    assert_eq!(preview(&console, &csrf, &[("tool_name", "alpha")]).await, "1");
}

/// The number in the overview's cell `id` (`-1` if the page has none).
fn cell(page: &str, id: &str) -> i64 {
    let marker = format!("id=\"{id}\">");
    page.split(&marker).nth(1).and_then(|rest| rest.split('<').next()).and_then(|n| n.parse().ok()).unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_shows_jobs_in_flight_and_what_finished_in_the_last_minutes() {
    let receiver = Receiver::start(SECRET, |r, _| match r.path.as_str() {
        "/slow" => Reply::result(json!("late")).after(Duration::from_secs(15)),
        "/unavailable" => Reply::status(503),
        "/broken" => Reply::status(404),
        _ => Reply::result(json!("ok")),
    })
    .await;
    let admin = "console-admin-0123456789ab";
    let mut fleet =
        spawn_fleet(FleetOptions::default().env("FLEET_API_TOKENS", admin).env("FLEET_RETRY_DELAYS", "0.2,0.4")).await;
    fleet.token = admin.to_string();
    for tool in ["echo", "slow", "unavailable", "broken"] {
        fleet.register_tool(tool, &receiver.url(&format!("/{tool}")), SECRET).await;
    }
    let slow = fleet.call_tool("slow", json!({"query": "s"})).await;
    let mut ok = vec![];
    for n in 0..3 {
        ok.push(fleet.call_tool("echo", json!({"query": format!("{n}")})).await);
    }
    let exhausted = fleet.call_tool("unavailable", json!({"query": "u"})).await;
    let broken = fleet.call_tool("broken", json!({"query": "b"})).await;
    for id in &ok {
        fleet.wait_status(id, "succeeded", Duration::from_secs(20)).await;
    }
    for id in [&exhausted, &broken] {
        fleet.wait_status(id, "dead_lettered", Duration::from_secs(20)).await;
    }
    let console = ConsoleClient::login(&fleet.api, admin, true).await.client;
    let console = console.unwrap();

    // The slow call runs on a worker while the others have finished: reported within seconds.
    let page =
        wait_for("the overview to show the finished jobs and the one in flight", Duration::from_secs(20), || async {
            let (status, page) = console.get("/console").await;
            assert_eq!(status, 200);
            let shown = [
                cell(&page, "running-tool_call"),
                cell(&page, "succeeded-15m-tool_call"),
                cell(&page, "failed-15m-tool_call"),
                cell(&page, "dead_lettered-15m-tool_call"),
            ];
            (shown == [1, 3, 2, 2]).then_some(page)
        })
        .await;
    assert_eq!(cell(&page, "succeeded-1m-tool_call"), 3, "all of it within the last minute");
    assert_eq!(cell(&page, "dead_lettered-1m-tool_call"), 2);
    assert_eq!((cell(&page, "running-webhook"), cell(&page, "succeeded-15m-webhook")), (0, 0));
    assert!(page.contains("29% of finished tool_call jobs were dead-lettered"), "FleetErrorRatioHigh's condition");

    // Once it has finished: nothing in flight, one more success.
    fleet.wait_status(&slow, "succeeded", Duration::from_secs(30)).await;
    wait_for("the overview to show the slow call finished", Duration::from_secs(20), || async {
        let (_, page) = console.get("/console").await;
        (cell(&page, "running-tool_call") == 0 && cell(&page, "succeeded-15m-tool_call") == 4).then_some(())
    })
    .await;
    // Counted from each worker's report under one hash tag: no key per job.
    let mut redis = fleet.redis().await;
    let buckets: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}{{activity}}:finished:*", fleet.key_prefix))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(!buckets.is_empty() && buckets.len() <= 8, "{buckets:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_circuits_history_shows_it_opened_half_opened_and_who_closed_it() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(503)).await;
    let admin = "console-admin-0123456789ab";
    let mut fleet = spawn_fleet(
        FleetOptions::default().env("FLEET_API_TOKENS", admin).env("FLEET_RETRY_DELAYS", "0.2,0.4,0.8,1.6,3.2"),
    )
    .await;
    fleet.token = admin.to_string();
    let body = json!({"callback_url": receiver.url("/flaky"), "callback_secret": SECRET,
        "circuit_breaker": {"failure_threshold": 2, "probe_interval_seconds": 1}});
    let (status, resp) = fleet.request(reqwest::Method::PUT, "/v1/tools/flaky", Some(&body)).await;
    assert_eq!(status, 201, "{resp}");
    for n in 0..3 {
        fleet.call_tool("flaky", json!({"n": n})).await;
    }
    let history = wait_for("the circuit to open and a probe to half-open it", Duration::from_secs(30), || async {
        let (_, tool) = fleet.get("/v1/tools/flaky").await;
        let history = tool["data"]["health"]["history"].as_array().cloned().unwrap_or_default();
        let states: Vec<&str> = history.iter().map(|e| e["state"].as_str().unwrap()).collect();
        (states == ["half_open", "open"]).then_some(history)
    })
    .await;
    let opened = &history[1];
    let why = opened["why"].as_str().unwrap();
    assert!(why.starts_with("failures in a row: 2 (threshold 2)") && why.contains("503"), "{why}");
    assert!(opened["at"].is_string() && opened.get("by").is_none());
    assert!(history[0]["execution_id"].as_str().unwrap().starts_with("exec_"), "the probe call");
    assert!(history[0]["probes"].as_u64().unwrap() >= 1);

    // An operator closes it in the console: the history says who.
    let console = ConsoleClient::login(&fleet.api, admin, true).await.client;
    let console = console.unwrap();
    let csrf = console.csrf().await;
    let (status, page) = console.post("/console/tools/flaky/close-circuit", &[("csrf", &csrf)]).await;
    assert_eq!(status, 200, "{page}");
    let actor = format!("token:{}", fleet_tests::token_digest_prefix(admin));
    let (_, tool) = fleet.get("/v1/tools/flaky").await;
    let newest = &tool["data"]["health"]["history"][0];
    assert_eq!((newest["state"].as_str(), newest["by"].as_str()), (Some("closed"), Some(actor.as_str())), "{tool}");
    assert_eq!(newest["why"], "closed by an operator");
    let (_, page) = console.get("/console/tools").await;
    let shown = page.split("id=\"circuit-history\"").nth(1).unwrap();
    for text in ["closed by an operator", &actor, "half_open", "failures in a row: 2"] {
        assert!(shown.contains(text), "{text:?} not on the tools page");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhooks_page_lists_subscriptions_and_their_failed_deliveries() {
    let tool = Receiver::start(SECRET, |_, _| Reply::status(404)).await;
    let hooks = Receiver::start(SECRET, |_, _| Reply::status(500)).await;
    let admin = "console-admin-0123456789ab";
    let mut fleet =
        spawn_fleet(FleetOptions::default().env("FLEET_API_TOKENS", admin).env("FLEET_RETRY_DELAYS", "0.2,0.4")).await;
    fleet.token = admin.to_string();
    fleet.register_tool("lookup", &tool.url("/lookup"), SECRET).await;
    let events = ["tool.callback.failed", "tool.callback.dead_letter"];
    let url = format!("{}?token=s3cret-in-query", hooks.url("/events"));
    let (status, body) = fleet
        .request(
            reqwest::Method::PUT,
            "/v1/webhooks/ops",
            Some(&json!({"url": url, "secret": SECRET, "events": events})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let id = fleet.call_tool("lookup", json!({"query": "x"})).await;
    fleet.wait_status(&id, "dead_lettered", Duration::from_secs(20)).await;

    let console = ConsoleClient::login(&fleet.api, admin, true).await.client;
    let console = console.unwrap();
    let page = wait_for("both deliveries dead-lettered on the webhooks page", Duration::from_secs(30), || async {
        let (status, page) = console.get("/console/webhooks").await;
        assert_eq!(status, 200);
        (page.contains("id=\"failed-ops\">2<")).then_some(page)
    })
    .await;
    assert!(page.contains(&hooks.url("/events")) && !page.contains("s3cret-in-query"), "the URL without its query");
    for event in events {
        assert!(page.contains(event), "{event}");
    }
    // Each failed delivery links to its dead letter, which names the subscription.
    let delivery = page.split("href=\"/console/dead-letters/").nth(1).unwrap().split('"').next().unwrap().to_string();
    let (status, record) = fleet.get(&format!("/v1/dead-letters/{delivery}")).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["data"]["kind"], "webhook");
    let (_, only) = console.get("/console/webhooks?webhook_id=someone-else").await;
    assert!(!only.contains("href=\"/console/dead-letters/"), "filtered to one subscription");
}
