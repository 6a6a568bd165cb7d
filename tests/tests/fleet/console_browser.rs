//! Headless Chromium drives the real console against a real fleet (over the DevTools protocol,
//! `fleet_tests::cdp`): log in, find a dead letter by its room id, open it, retry it and see the
//! execution succeed; preview and run a bulk redrive of 200 with live progress; a read-only login
//! sees no change buttons and a forged POST is refused; a tool name and a parameter holding
//! `<script>` render as text. With `FLEET_CONSOLE_SCREENSHOTS=<dir>` it also saves each page there
//! (`docs/console/*.png` come from it).
//!
//! The browser helper's own promise is tested here too: reading a page that replaces itself
//! (the redrive's progress refreshes every second) answers from one document or the next, never
//! with an error.
//!
//! Needs `chromium` on PATH (`scripts/ensure-chromium.sh`, run by `make test`, installs it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use fleet_tests::cdp::Chromium;
use fleet_tests::{spawn_fleet, wait_for, FleetOptions, Receiver, Reply};

/// A page that reloads itself at once, counting its loads in the tab's session storage.
const RELOADING: &str = "<!doctype html><html><head><meta http-equiv=\"refresh\" content=\"0\"></head><body>\
    <script>sessionStorage.loads = Number(sessionStorage.loads || 0) + 1</script><b id=\"here\">here</b></body></html>";

const SECRET: &str = "whsec_console_browser_1234";
const XSS: &str = "<script>window.__xss = 1</script>";

fn shot(browser: &mut Chromium, name: &str) {
    if let Ok(dir) = std::env::var("FLEET_CONSOLE_SCREENSHOTS") {
        browser.screenshot(&std::path::Path::new(&dir).join(format!("{name}.png")));
    }
}

/// Logs in with `token` (through the form, as a person would).
fn login(browser: &mut Chromium, api: &str, token: &str) {
    browser.goto(&format!("{api}/console/login"));
    browser.eval(&format!(
        "document.querySelector('input[name=token]').value = {token:?}; document.querySelector('form.login').submit(); true"
    ));
    browser.settle(&format!("{api}/console"));
    browser.wait("document.querySelector('header .who') !== null", Duration::from_secs(10));
}

/// Clicks the button whose text is `label`.
fn click(browser: &mut Chromium, label: &str) {
    let clicked = browser.eval(&format!(
        "(() => {{ const b = [...document.querySelectorAll('button')].find(b => b.textContent.trim().startsWith({label:?})); if (!b) return false; b.click(); return true; }})()"
    ));
    assert_eq!(clicked, json!(true), "no button {label:?} on {}", browser.eval("location.href"));
}

fn buttons(browser: &mut Chromium) -> Vec<String> {
    let v = browser.eval("[...document.querySelectorAll('button')].map(b => b.textContent.trim())");
    v.as_array().unwrap().iter().map(|b| b.as_str().unwrap().to_string()).collect()
}

/// A dead letter written as a foreign process could have (a tool name no registration allows).
async fn plant_dead_letter(fleet: &fleet_tests::Fleet, id: &str) {
    let now = fleet_platform::now_ms();
    let record = json!({
        "execution_id": id, "kind": "tool_call", "tool_name": XSS, "assistant_id": null, "room_id": "room-xss",
        "attempts": 1, "last_error": XSS, "first_attempt_at": null, "last_attempt_at": null, "reason": "permanent",
        "dead_lettered_at": fleet_protocol::timefmt::rfc3339_from_millis(now), "history": [],
        "job": {"kind": "tool_call", "tool_name": XSS, "parameters": {"query": XSS}},
    });
    let mut redis = fleet.redis().await;
    let key = format!("{}{{dead_letters}}:record:{id}", fleet.key_prefix);
    let _: () =
        redis::cmd("SET").arg(&key).arg(record.to_string()).arg("EX").arg(3600).query_async(&mut redis).await.unwrap();
    let index = format!("{}{{dead_letters}}:index", fleet.key_prefix);
    let _: () = redis::cmd("ZADD").arg(&index).arg(now).arg(id).query_async(&mut redis).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_retries_and_redrives_dead_letters_in_a_real_browser() {
    let healthy = Arc::new(AtomicBool::new(false));
    let up = healthy.clone();
    let receiver = Receiver::start(SECRET, move |r, _| {
        if r.path == "/flaky" {
            Reply::status(503)
        } else if up.load(Ordering::SeqCst) {
            Reply::result(json!("ok"))
        } else {
            Reply::status(404)
        }
    })
    .await;
    let (admin, reader) = ("console-admin-token-0123456789", "console-reader-token-0123456789");
    let tokens = format!("{admin},{reader}:console:read");
    let mut fleet = spawn_fleet(FleetOptions::default().env("FLEET_API_TOKENS", &tokens)).await;
    fleet.token = admin.to_string();
    fleet.register_tool("lookup", &receiver.url("/lookup"), SECRET).await;
    let (status, one) = fleet
        .post(
            "/v1/tool-calls",
            &json!({"tool_name": "lookup", "parameters": {"query": XSS}, "room_id": "room-browser-1"}),
        )
        .await;
    assert_eq!(status, 202, "{one}");
    let one = one["data"]["execution_id"].as_str().unwrap().to_string();
    let mut bulk = vec![];
    for n in 0..200 {
        bulk.push(fleet.call_tool("lookup", json!({"query": format!("bulk {n}")})).await);
    }
    wait_for("201 dead letters stored", Duration::from_secs(90), || async {
        let (_, page) = fleet.get("/v1/dead-letters?limit=200&tool_name=lookup").await;
        let n = page["data"].as_array().map_or(0, |d| d.len());
        (n == 200 && page["next_cursor"].is_string()).then_some(())
    })
    .await;
    plant_dead_letter(&fleet, "exec_planted_xss").await;
    // For the tools page: a tool whose circuit opened (its history), and a webhook subscription.
    let breaker = json!({"callback_url": receiver.url("/flaky"), "callback_secret": SECRET,
        "circuit_breaker": {"failure_threshold": 1, "probe_interval_seconds": 600}});
    let (status, _) = fleet.request(reqwest::Method::PUT, "/v1/tools/flaky", Some(&breaker)).await;
    assert_eq!(status, 201);
    fleet.call_tool("flaky", json!({"query": "f"})).await;
    let hook = json!({"url": receiver.url("/events"), "secret": SECRET, "events": ["tool.callback.dead_letter"]});
    let (status, _) = fleet.request(reqwest::Method::PUT, "/v1/webhooks/ops", Some(&hook)).await;
    assert_eq!(status, 201);
    wait_for("the flaky tool's circuit to open", Duration::from_secs(30), || async {
        let (_, tool) = fleet.get("/v1/tools/flaky").await;
        (tool["data"]["health"]["state"] == "open").then_some(())
    })
    .await;
    healthy.store(true, Ordering::SeqCst);
    let api = fleet.api.clone();

    tokio::task::block_in_place(|| {
        let mut b = Chromium::start(1280, 860);
        login(&mut b, &api, admin);
        // The workers report what they finished every few seconds.
        for _ in 0..100 {
            let reported = "(document.getElementById('dead_lettered-15m-tool_call') || {}).textContent !== '0'";
            if b.eval(reported) == json!(true) {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
            b.goto(&format!("{api}/console"));
        }
        shot(&mut b, "overview");
        // Find it by its room, open it, retry it.
        b.goto(&format!("{api}/console/dead-letters?q=room-browser-1"));
        shot(&mut b, "dead-letters");
        let rows = b.eval("document.querySelectorAll('tbody tr').length");
        assert_eq!(rows, json!(1));
        b.eval(&format!("document.querySelector('a[href=\"/console/dead-letters/{one}\"]').click(); true"));
        b.settle(&format!("{api}/console/dead-letters/{one}"));
        assert_eq!(b.eval("window.__xss === undefined"), json!(true), "the parameter ran as script");
        assert_eq!(b.eval(&format!("document.body.innerText.includes({XSS:?})")), json!(true), "shown as text");
        shot(&mut b, "dead-letter");
        click(&mut b, "Retry");
        b.wait("document.querySelector('.notice.ok') !== null", Duration::from_secs(20));
        b.goto(&format!("{api}/console/executions/{one}"));
        let succeeded = "document.getElementById('field-status').textContent === 'succeeded'";
        for _ in 0..200 {
            if b.eval(succeeded) == json!(true) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
            b.goto(&format!("{api}/console/executions/{one}"));
        }
        assert_eq!(b.eval(succeeded), json!(true), "the retried execution succeeded");
        shot(&mut b, "execution");

        // Bulk: preview, then run with progress.
        b.goto(&format!("{api}/console/dead-letters?tool_name=lookup"));
        click(&mut b, "Redrive matching");
        b.settle(&format!("{api}/console/dead-letters/redrive/preview"));
        assert_eq!(b.eval("document.getElementById('match-count').textContent"), json!("200"));
        shot(&mut b, "redrive-preview");
        b.eval("document.querySelector('input[name=rate]').value = '100'; true");
        click(&mut b, "Redrive 200");
        b.settle(&format!("{api}/console/jobs/"));
        let mut progress_seen = vec![];
        for _ in 0..600 {
            let done = b.eval(
                "(() => { const d = document.getElementById('job-done'); return d ? Number(d.textContent) : -1; })()",
            );
            progress_seen.push(done.as_i64().unwrap_or(-1));
            if b.eval("(document.getElementById('job-status') || {}).textContent === 'finished'") == json!(true) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        shot(&mut b, "redrive-progress");
        assert_eq!(b.eval("document.getElementById('job-done').textContent"), json!("200"));
        assert!(progress_seen.iter().any(|d| *d > 0 && *d < 200), "progress shown on the way: {progress_seen:?}");

        // The planted record: a tool name holding markup renders as text.
        b.goto(&format!("{api}/console/dead-letters?q=room-xss"));
        assert_eq!(b.eval("window.__xss === undefined"), json!(true));
        assert_eq!(b.eval("document.querySelectorAll('script').length"), json!(1), "only the console's own script");
        assert_eq!(b.eval(&format!("document.querySelector('tbody').innerText.includes({XSS:?})")), json!(true));

        for (path, name) in [
            ("/console/tools", "tools"),
            ("/console/webhooks", "webhooks"),
            ("/console/audit", "audit"),
            ("/console/executions", "executions"),
        ] {
            b.goto(&format!("{api}{path}"));
            shot(&mut b, name);
        }
        b.goto(&format!("{api}/console/sessions?id=room-browser-1"));
        shot(&mut b, "session");

        // Read-only: no change buttons, and a forged POST is refused.
        click(&mut b, "Log out");
        b.settle(&format!("{api}/console/login"));
        login(&mut b, &api, reader);
        b.goto(&format!("{api}/console/dead-letters/exec_planted_xss"));
        assert_eq!(buttons(&mut b), vec!["Log out".to_string()], "a read-only page has no change buttons");
        b.goto(&format!("{api}/console/dead-letters"));
        assert_eq!(buttons(&mut b), vec!["Log out".to_string(), "Filter".to_string()]);
        let forged = b.eval(
            "(async () => { const csrf = document.querySelector('input[name=csrf]').value; \
             const r = await fetch('/console/dead-letters/exec_planted_xss/delete', {method: 'POST', \
             headers: {'content-type': 'application/x-www-form-urlencoded'}, body: 'csrf=' + csrf}); return r.status; })()",
        );
        assert_eq!(forged, json!(403), "a read-only session's POST is refused");
    });
    let (status, _) = fleet.get("/v1/dead-letters/exec_planted_xss").await;
    assert_eq!(status, 200, "nothing was deleted");
    let (_, audit) = fleet.get("/v1/audit").await;
    let actions: Vec<&str> = audit["data"].as_array().unwrap().iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions, vec!["dead_letters.redrive", "dead_letter.retry"]);
    assert_eq!(audit["data"][0]["count"], 200);
    assert_eq!(audit["data"][0]["via"], "console");
    for id in bulk.iter().take(5) {
        fleet.wait_status(id, "succeeded", Duration::from_secs(30)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_a_page_that_keeps_replacing_itself_never_fails() {
    let site = Receiver::start_verifying(Arc::new(|_, _| Ok(())), |_, _| Reply {
        status: 200,
        body: RELOADING.to_string(),
        delay: Duration::ZERO,
        headers: vec![("content-type".into(), "text/html".into())],
    })
    .await;
    let url = site.url("/reloading");
    tokio::task::block_in_place(|| {
        let mut b = Chromium::start(800, 600);
        b.goto(&url);
        let mut loads = 0;
        // Each read lands before, during or after one of the page's replacements, and answers from
        // the document of that moment: never one older than the last read's.
        while loads < 60 {
            let read = b.eval("Number(sessionStorage.loads || 0)").as_i64().expect("a number of loads");
            assert!(read >= loads, "a read answered {read} loads after one had answered {loads}");
            loads = read;
        }
    });
    assert!(site.received().len() >= 60, "the page was served {} times", site.received().len());
}
