//! Opening a session's stream: a short-lived stream token in the query string (for a browser's
//! `EventSource`), accepted by that session's stream alone and by every dispatcher sharing the
//! secrets key; `?since=start`, `?last_event_id=` and `?until=done`.

use std::time::Duration;

use serde_json::json;

use fleet_protocol::secrets::SecretsKey;
use fleet_protocol::stream_token;
use fleet_tests::fleet::TEST_SECRETS_KEY;
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::sse::{open_stream, Frame, Next, SseReader};
use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
use fleet_tests::{spawn_fleet, FleetOptions};

/// A token signed here, with the subkey any dispatcher derives from the fleet's secrets key.
fn token_signed_here(session: &str, expires_at_ms: i64) -> String {
    let key = SecretsKey::parse(TEST_SECRETS_KEY).unwrap().subkey("stream-token");
    stream_token::sign(&key, session, expires_at_ms)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_token_opens_its_sessions_stream_and_nothing_else() {
    let mut fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    let http = reqwest::Client::new();
    let (status, body) = fleet.post("/v1/sessions/s_tok/stream-token", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["expires_in"], 60);
    assert_eq!(body["data"]["session_id"], "s_tok");
    let token = body["data"]["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("st1."), "{token}");

    let resp = open_stream(&http, &fleet, "s_tok", &format!("?token={token}"), &[]).await;
    assert_eq!(resp.status(), 200, "the token opens the stream without a bearer token");
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert_eq!(resp.headers()["access-control-allow-origin"], "*", "a page on another origin may read it");
    SseReader::new(resp).opened(Duration::from_secs(10)).await;

    // No other session's stream, and no other route, takes it (or any token) from the query.
    let refused = |path: String| {
        let req = http.get(format!("{}{path}", fleet.api));
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(refused(format!("/v1/sessions/s_other/stream?token={token}")).await, 401);
    assert_eq!(refused(format!("/v1/sessions/s_tok/messages?token={token}")).await, 401);
    assert_eq!(refused(format!("/v1/executions/exec_1?token={token}")).await, 401);
    assert_eq!(refused(format!("/v1/tools?token={token}")).await, 401);
    let post = http.post(format!("{}/v1/sessions/s_tok/stream-token?token={token}", fleet.api)).send().await.unwrap();
    assert_eq!(post.status(), 401, "a stream token does not mint stream tokens");
    let delete = http.delete(format!("{}/v1/sessions/s_tok?token={token}", fleet.api)).send().await.unwrap();
    assert_eq!(delete.status(), 401);
    // The API token itself is not accepted in a URL.
    assert_eq!(refused(format!("/v1/sessions/s_tok/stream?token={}", fleet.token)).await, 401);
    assert_eq!(refused("/v1/sessions/s_tok/stream".to_string()).await, 401);

    // Tampered and expired tokens are refused, saying why.
    let mut tampered = token.clone();
    let last = tampered.pop().unwrap();
    tampered.push(if last == '0' { '1' } else { '0' });
    assert_eq!(refused(format!("/v1/sessions/s_tok/stream?token={tampered}")).await, 401);
    let expired = token_signed_here("s_tok", now_ms() - 1);
    let resp = http.get(format!("{}/v1/sessions/s_tok/stream?token={expired}", fleet.api)).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let error: serde_json::Value = resp.json().await.unwrap();
    assert!(error["error"]["message"].as_str().unwrap().contains("expired"), "{error}");

    // Nothing is kept per process: a token signed elsewhere with the shared key is good, and so is
    // one issued before a restart (another replica, as far as the token can tell).
    let elsewhere = token_signed_here("s_tok", now_ms() + 30_000);
    let resp = open_stream(&http, &fleet, "s_tok", &format!("?token={elsewhere}"), &[]).await;
    assert_eq!(resp.status(), 200);
    drop(resp);
    fleet.stop_dispatcher(libc::SIGTERM, Duration::from_secs(10)).await;
    fleet.start_dispatcher(None).await;
    let resp = open_stream(&http, &fleet, "s_tok", &format!("?token={token}"), &[]).await;
    assert_eq!(resp.status(), 200, "a token outlives the dispatcher that issued it");

    // Minting needs the bearer token.
    let anonymous = http.post(format!("{}/v1/sessions/s_tok/stream-token", fleet.api)).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
}

/// All frames until the body ends, which `?until=done` makes it do right after `done`.
async fn frames_until_end(reader: &mut SseReader) -> Vec<Frame> {
    let mut frames = Vec::new();
    loop {
        match reader.next(Duration::from_secs(30)).await {
            Next::Frame(f) => frames.push(f),
            Next::End => return frames,
            Next::Broken(e) => panic!("the stream broke: {e} after {frames:?}"),
        }
    }
}

fn ids(frames: &[Frame]) -> Vec<(String, String)> {
    frames.iter().map(|f| (f.id.clone(), f.event.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn since_start_last_event_id_and_until_done_choose_what_is_sent() {
    let llm = MockLlm::start(|_, _| LlmReply::text("one two three four")).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let http = reqwest::Client::new();
    let id = post_turn(&fleet, &turn_body("s_query", "hi", &[])).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;

    // The retained window from its start, ending after `done`.
    let resp = open_stream(&http, &fleet, "s_query", "?since=start&until=done", &[]).await;
    assert_eq!(resp.status(), 200);
    let first_turn = frames_until_end(&mut SseReader::new(resp)).await;
    let events: Vec<&str> = first_turn.iter().map(|f| f.event.as_str()).collect();
    assert_eq!(events.iter().filter(|e| **e == "token").count(), 4, "{events:?}");
    assert_eq!(events.last(), Some(&"done"), "it ends right after done: {events:?}");

    // `last_event_id` resumes after that event, like the header; the header wins over it.
    let resume = format!("?last_event_id={}&until=done", first_turn[1].id);
    let resp = open_stream(&http, &fleet, "s_query", &resume, &[]).await;
    assert_eq!(ids(&frames_until_end(&mut SseReader::new(resp)).await), ids(&first_turn[2..]));
    let resp = open_stream(&http, &fleet, "s_query", &resume, &[("Last-Event-ID", &first_turn[3].id)]).await;
    assert_eq!(ids(&frames_until_end(&mut SseReader::new(resp)).await), ids(&first_turn[4..]));

    // From now (the default) with `until=done`: only the next turn's events, then the end.
    let resp = open_stream(&http, &fleet, "s_query", "?until=done", &[]).await;
    let mut live = SseReader::new(resp);
    live.opened(Duration::from_secs(10)).await;
    let second = post_turn(&fleet, &turn_body("s_query", "again", &[])).await;
    let second_turn = frames_until_end(&mut live).await;
    fleet.wait_status(&second, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(second_turn.last().map(|f| f.event.as_str()), Some("done"));
    assert!(second_turn.iter().all(|f| !ids(&first_turn).contains(&(f.id.clone(), f.event.clone()))));
    assert_eq!(second_turn.len(), first_turn.len(), "the same shape of turn: {:?}", ids(&second_turn));

    // Bad values are refused by name.
    for (query, name) in
        [("?since=yesterday", "since"), ("?last_event_id=abc", "last_event_id"), ("?until=end", "until")]
    {
        let resp = open_stream(&http, &fleet, "s_query", query, &[]).await;
        assert_eq!(resp.status(), 400, "{query}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert!(body["error"]["message"].as_str().unwrap().contains(name), "{body}");
    }
}
