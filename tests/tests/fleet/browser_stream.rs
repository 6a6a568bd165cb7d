//! A real browser reads a session's stream: headless Chromium loads a page (served by this test on
//! its own origin) that opens an `EventSource` with a stream token through a TCP proxy to the
//! dispatcher, and reports every event it gets back to the test. The proxy drops the connection
//! mid-turn; the browser reconnects on its own (sending `Last-Event-ID`) and the test checks it saw
//! exactly the events a direct reader saw, none lost and none twice. And seed 000's own browser
//! snippet (a `streaming_token`, then `EventSource` with `?token=`) prints a room's reply.
//!
//! Needs `chromium` on PATH (`scripts/ensure-chromium.sh`, run by `make test`, installs it).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::response::Html;
use axum::routing::{get, post};
use serde_json::Value;

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::proxy::Proxy;
use fleet_tests::sse::{open_stream, stream_token, SseReader};
use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
use fleet_tests::{spawn_fleet, wait_for};

/// Every event a turn can stream, so the page listens for each by name.
const EVENT_TYPES: &[&str] = &["token", "retry", "tool_call", "tool_result", "message_complete", "error", "done"];

/// The page: opens the stream, reports `open`, `error` and each event (id, type) in order.
fn page(stream_url: &str) -> String {
    let types = serde_json::to_string(EVENT_TYPES).unwrap();
    format!(
        r#"<!doctype html><html><body><script>
let seq = 0;
const report = (r) => fetch("/report", {{method: "POST", headers: {{"content-type": "text/plain"}}, body: JSON.stringify(Object.assign({{seq: seq++}}, r))}});
const source = new EventSource({stream_url:?});
source.onopen = () => report({{kind: "open"}});
// The seed's `error` event shares its name with EventSource's own connection `error`: only a
// MessageEvent is one the server sent.
source.onerror = (e) => {{ if (!(e instanceof MessageEvent)) report({{kind: "error", state: source.readyState}}); }};
for (const type of {types}) {{
  source.addEventListener(type, (e) => {{
    if (!(e instanceof MessageEvent)) return;
    report({{kind: "event", id: e.lastEventId, type: e.type}});
    if (e.type === "done") source.close();
  }});
}}
</script></body></html>"#
    )
}

type Reports = Arc<Mutex<Vec<Value>>>;

/// Serves the page and collects its reports; returns its origin.
async fn serve_page(html: String, reports: Reports) -> SocketAddr {
    let app = axum::Router::new()
        .route("/", get(move || async move { Html(html) }))
        .route(
            "/report",
            post(|State(reports): State<Reports>, body: String| async move {
                reports.lock().unwrap().push(serde_json::from_str(&body).unwrap());
            }),
        )
        .with_state(reports);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Headless Chromium on a page, killed (with its profile directory removed) on drop.
struct Browser {
    child: Child,
    profile: std::path::PathBuf,
}

impl Browser {
    fn open(url: &str) -> Browser {
        let profile = std::env::temp_dir().join(format!("fleet-test-chromium-{}", uuid::Uuid::new_v4().simple()));
        let child = Command::new("chromium")
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"])
            .args(["--disable-background-networking", "--remote-debugging-port=0"])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(url)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium on PATH (scripts/ensure-chromium.sh installs it)");
        Browser { child, profile }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// The reports so far, in the page's order.
fn reports_in_order(reports: &Reports) -> Vec<Value> {
    let mut all = reports.lock().unwrap().clone();
    all.sort_by_key(|r| r["seq"].as_u64());
    all
}

fn count(reports: &[Value], kind: &str, event: Option<&str>) -> usize {
    reports.iter().filter(|r| r["kind"] == kind && event.is_none_or(|e| r["type"] == e)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_event_source_streams_a_turn_and_resumes_after_a_dropped_connection() {
    let tokens: Vec<String> = (0..16).map(|n| format!("w{n} ")).collect();
    let llm =
        MockLlm::start(move |_, _| LlmReply::Text { tokens: tokens.clone(), delay: Duration::from_millis(250) }).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let proxy = Proxy::start(fleet.api.trim_start_matches("http://").parse().unwrap()).await;
    let session = "s_browser";
    let token = stream_token(&fleet, session).await;
    let stream_url = format!("http://{}/v1/sessions/{session}/stream?token={token}", proxy.addr);
    let reports: Reports = Arc::default();
    let origin = serve_page(page(&stream_url), reports.clone()).await;
    let _browser = Browser::open(&format!("http://{origin}/"));
    wait_for("the browser's stream to open", Duration::from_secs(60), || {
        let n = count(&reports_in_order(&reports), "open", None);
        async move { (n >= 1).then_some(()) }
    })
    .await;

    // A direct reader, never interrupted, sees what the browser should.
    let http = reqwest::Client::new();
    let mut direct = SseReader::new(open_stream(&http, &fleet, session, "", &[]).await);
    direct.opened(Duration::from_secs(10)).await;
    let id = post_turn(&fleet, &turn_body(session, "count slowly", &[])).await;
    wait_for("the browser to receive some tokens", Duration::from_secs(30), || {
        let n = count(&reports_in_order(&reports), "event", Some("token"));
        async move { (n >= 3).then_some(()) }
    })
    .await;
    // Drop the browser's connection mid-turn; new connections get through again at once.
    proxy.cut();
    proxy.restore();
    let expected = direct.until_done(Duration::from_secs(30)).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    // The page reports each event with a fetch of its own, and fetches can arrive out of order:
    // the reports are complete once `done` is in and no report before it is still on its way.
    let seen = wait_for("the browser to receive done, every report in", Duration::from_secs(30), || {
        let seen = reports_in_order(&reports);
        let complete = seen.iter().enumerate().all(|(n, r)| r["seq"].as_u64() == Some(n as u64));
        async move { (complete && count(&seen, "event", Some("done")) >= 1).then_some(seen) }
    })
    .await;
    // What the browser reported, in order, for the record: `open`, events as `type#id`, `error`.
    let transcript: Vec<String> = seen
        .iter()
        .map(|r| match r["kind"].as_str().unwrap() {
            "event" => format!("{}#{}", r["type"].as_str().unwrap(), r["id"].as_str().unwrap()),
            other => other.to_string(),
        })
        .collect();
    println!("the browser saw: {}", transcript.join(" "));
    let received: Vec<(String, String)> = seen
        .iter()
        .filter(|r| r["kind"] == "event")
        .map(|r| (r["id"].as_str().unwrap().to_string(), r["type"].as_str().unwrap().to_string()))
        .collect();
    let expected: Vec<(String, String)> = expected.iter().map(|f| (f.id.clone(), f.event.clone())).collect();
    assert_eq!(received, expected, "the browser got every event once, in order; it saw: {}", transcript.join(" "));
    assert_eq!(count(&seen, "event", Some("token")), 16);
    // It really reconnected mid-turn: an error, then a second open, with events on both sides.
    let kinds: Vec<&str> = seen.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    let reopened = kinds.iter().enumerate().filter(|(_, k)| **k == "open").nth(1).map(|(i, _)| i);
    let reopened = reopened.unwrap_or_else(|| panic!("the browser reconnected: {kinds:?}"));
    assert!(kinds[..reopened].contains(&"error"), "{kinds:?}");
    assert!(kinds[..reopened].contains(&"event") && kinds[reopened..].contains(&"event"), "{kinds:?}");
    assert!(proxy.accepted() >= 2, "the browser connected twice through the proxy");
}

/// Seed 000's "Authentication for Streaming / Option 1: Short-Lived Token in Query Parameter" in
/// the browser, as the seed writes it but for the base URL (and `{room_id}`, which the seed's
/// fetch forgot to interpolate): the page fetches `streaming_token` from its own origin's
/// `/api/v1/…` (which this test's server forwards to the dispatcher, as a site serving the API
/// under its own origin would) and opens the room's stream on the fleet with `?token=`. The
/// lines after the seed's two steps report what the stream brings.
fn seed_page(base: &str, token: &str, room_id: &str) -> String {
    format!(
        r#"<!doctype html><html><body><script type="module">
const report = (r) => fetch("/report", {{method: "POST", headers: {{"content-type": "text/plain"}}, body: JSON.stringify(r)}});
const accessToken = {token:?};
const roomId = {room_id:?};

// 1. Get a short-lived streaming token (valid 60 seconds)
const {{ streaming_token }} = await fetch(`/api/v1/agents/rooms/${{roomId}}/stream-token`, {{
  method: 'POST',
  headers: {{ 'Authorization': `Bearer ${{accessToken}}` }}
}}).then(r => r.json());

// 2. Connect with token in query string
const eventSource = new EventSource(
  `{base}/agents/rooms/${{roomId}}/stream?token=${{streaming_token}}`
);

let text = "";
eventSource.onopen = () => report({{kind: "open"}});
eventSource.addEventListener("token", (e) => {{ text += JSON.parse(e.data).token; }});
eventSource.addEventListener("message_complete", (e) => report({{kind: "complete", content: JSON.parse(e.data).message.content}}));
eventSource.addEventListener("done", () => {{ report({{kind: "done", text}}); eventSource.close(); }});
</script></body></html>"#
    )
}

/// Serves the seed page, collects its reports, and forwards `POST /api/v1/…` to the dispatcher's
/// `/v1/…` with the page's `Authorization`; returns its origin.
async fn serve_seed_page(html: String, reports: Reports, api: String) -> SocketAddr {
    use axum::extract::Path;
    use axum::http::HeaderMap;
    use axum::response::IntoResponse;
    let forward = move |Path(rest): Path<String>, headers: HeaderMap| {
        let api = api.clone();
        async move {
            let mut req = reqwest::Client::new().post(format!("{api}/v1/{rest}"));
            if let Some(auth) = headers.get("authorization") {
                req = req.header("authorization", auth.as_bytes());
            }
            let resp = req.send().await.unwrap();
            let status = axum::http::StatusCode::from_u16(resp.status().as_u16()).unwrap();
            let body = resp.text().await.unwrap();
            (status, [("content-type", "application/json")], body).into_response()
        }
    };
    let app = axum::Router::new()
        .route("/", get(move || async move { Html(html) }))
        .route("/api/v1/{*rest}", post(forward))
        .route(
            "/report",
            post(|State(reports): State<Reports>, body: String| async move {
                reports.lock().unwrap().push(serde_json::from_str(&body).unwrap());
            }),
        )
        .with_state(reports);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_browser_event_source_with_a_streaming_token_prints_a_room_reply() {
    const REPLY: &str = "Hello! How can I help you today?";
    let llm = MockLlm::start(|_, _| LlmReply::text(REPLY)).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let (status, a) = fleet
        .post(
            "/v1/agents/assistants",
            &serde_json::json!({"name": "helper", "title": "Helper", "instructions": "Be brief."}),
        )
        .await;
    assert_eq!(status, 201, "{a}");
    let assistant_id = a["data"]["id"].as_str().unwrap();
    let (status, r) = fleet.post(&format!("/v1/agents/{assistant_id}/rooms"), &serde_json::json!({})).await;
    assert_eq!(status, 201, "{r}");
    let room_id = r["data"]["id"].as_str().unwrap().to_string();

    let reports: Reports = Arc::default();
    let html = seed_page(&format!("{}/v1", fleet.api), &fleet.token, &room_id);
    let origin = serve_seed_page(html, reports.clone(), fleet.api.clone()).await;
    let _browser = Browser::open(&format!("http://{origin}/"));
    let kinds = |kind: &'static str| {
        let reports = reports.clone();
        move || {
            let found = reports.lock().unwrap().iter().find(|r| r["kind"] == kind).cloned();
            async move { found }
        }
    };
    wait_for("the browser's stream to open", Duration::from_secs(60), kinds("open")).await;
    let (status, m) = fleet
        .post(
            &format!("/v1/agents/rooms/{room_id}/messages"),
            &serde_json::json!({"content": "Hello!", "role": "user"}),
        )
        .await;
    assert_eq!(status, 201, "{m}");
    let done = wait_for("the browser to receive done", Duration::from_secs(30), kinds("done")).await;
    let complete = wait_for("message_complete", Duration::from_secs(30), kinds("complete")).await;
    println!("the browser printed: {} / message_complete: {}", done["text"], complete["content"]);
    assert_eq!(done["text"], REPLY, "the tokens make the reply");
    assert_eq!(complete["content"], REPLY);
}
