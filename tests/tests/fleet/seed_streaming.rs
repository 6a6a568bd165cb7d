//! Seed 000's stream clients read a room's stream unchanged but for the base URL
//! (`tests/seeds/000/stream-*.mjs`, run by Node.js): the `eventsource` package with an
//! `Authorization` header, and `fetch` with the seed's ReadableStream parser, each printing the
//! complete reply. The seed's "Option 1" sets `onmessage`, which receives only unnamed events:
//! every event the fleet streams is named (the seed's own Streaming Contract), so it prints
//! nothing; the one line that makes it print is checked too. The browser's `EventSource` with
//! `?token=` is in `browser_stream.rs`. Also: one `message_id` per assistant message across its
//! events and in the room's messages, and the room's stream token.

use std::time::Duration;

use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::seed::{self, Running};
use fleet_tests::sse::{Frame, SseReader};
use fleet_tests::turn::llm_fleet;
use fleet_tests::{spawn_fleet, Fleet, Receiver, Reply};

const REPLY: &str = "Hello! How can I help you today?";
const MINUTE: Duration = Duration::from_secs(60);

/// An assistant (with `tools` enabled) and a room of it; the room's id.
async fn room(fleet: &Fleet, tools: &[&str]) -> String {
    let name = format!("streamer_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (status, a) = fleet
        .post(
            "/v1/agents/assistants",
            &json!({"name": name, "title": "Streamer", "instructions": "Be brief.", "enabled_tools": tools}),
        )
        .await;
    assert_eq!(status, 201, "{a}");
    let assistant_id = a["data"]["id"].as_str().unwrap();
    let (status, r) = fleet.post(&format!("/v1/agents/{assistant_id}/rooms"), &json!({"namespace": "user_123"})).await;
    assert_eq!(status, 201, "{r}");
    r["data"]["id"].as_str().unwrap().to_string()
}

async fn send(fleet: &Fleet, room_id: &str, content: &str) -> String {
    let (status, m) =
        fleet.post(&format!("/v1/agents/rooms/{room_id}/messages"), &json!({"content": content, "role": "user"})).await;
    assert_eq!(status, 201, "{m}");
    m["data"]["execution_id"].as_str().unwrap().to_string()
}

/// Runs a stream script: waits until its stream is open, sends a message, and reads until `end`;
/// everything it printed.
async fn stream_a_turn(fleet: &Fleet, room_id: &str, script: &str, content: &str, end: &str) -> Vec<String> {
    let mut env = seed::base_env(fleet);
    env.push(("ROOM_ID".into(), room_id.to_string()));
    let mut client = Running::start(seed::node(script, &env));
    // The stream's position is taken before its answer's headers are sent: once open, it misses
    // nothing the turn streams.
    client.until(MINUTE, |l| l == "[harness] open").await;
    let id = send(fleet, room_id, content).await;
    client.until(MINUTE, |l| l.contains(end)).await;
    fleet.wait_status(&id, "succeeded", MINUTE).await;
    let printed = client.stop().await;
    println!("{script} printed:\n{}", printed.join("\n"));
    printed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eventsource_package_with_headers_prints_the_reply_when_it_listens_by_name() {
    let llm = MockLlm::start(|_, _| LlmReply::text(REPLY)).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let room_id = room(&fleet, &[]).await;

    // The seed's Option 1 as written: `onmessage` gets none of the fleet's named events.
    let printed = stream_a_turn(&fleet, &room_id, "stream-option1-onmessage.mjs", "Hi!", "[harness] done").await;
    let own: Vec<&String> = printed.iter().filter(|l| !l.starts_with("[harness]") && !l.is_empty()).collect();
    assert!(own.is_empty(), "onmessage printed {own:?}");

    // The one line more: the same handler, listening by name, prints the reply and the message.
    let printed = stream_a_turn(&fleet, &room_id, "stream-option1-listeners.mjs", "Hi!", "[harness] done").await;
    assert!(printed.iter().any(|l| l == REPLY), "{printed:?}");
    let text = printed.join("\n");
    assert!(text.contains("Complete: {") && text.contains(&format!("content: '{REPLY}'")), "{text}");

    // The seed's Streaming Contract Option 3 (addEventListener('token')) prints the reply.
    let printed = stream_a_turn(&fleet, &room_id, "stream-option3-eventsource.mjs", "Hi!", "[harness] done").await;
    assert!(printed.iter().any(|l| l == REPLY), "{printed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_with_the_seeds_parser_prints_the_reply_and_one_message_id_names_each_message() {
    let llm = MockLlm::start(|_, n| match n {
        0 => LlmReply::ToolCalls(vec![("call_1".into(), "search_products".into(), r#"{"query":"laptop"}"#.into())]),
        _ => LlmReply::text(REPLY),
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let receiver = Receiver::start("your_webhook_secret_here", |_, _| Reply::result(json!({"products": []}))).await;
    fleet.register_tool("search_products", &receiver.url("/search"), "your_webhook_secret_here").await;
    let room_id = room(&fleet, &["search_products"]).await;

    // A reader of the room's stream beside the script, to compare ids.
    let http = reqwest::Client::new();
    let resp = http
        .get(format!("{}/v1/agents/rooms/{room_id}/stream", fleet.api))
        .bearer_auth(&fleet.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut direct = SseReader::new(resp);
    direct.opened(Duration::from_secs(10)).await;

    let printed = stream_a_turn(&fleet, &room_id, "stream-option2-fetch.mjs", "Find a laptop", "[Stream ended]").await;
    assert!(printed.contains(&"[Tool] search_products".to_string()), "{printed:?}");
    assert!(printed.iter().any(|l| l == REPLY), "{printed:?}");
    assert!(printed.contains(&format!("[Complete] {REPLY}")), "{printed:?}");

    // The tool call's events and the message that made it share one id, as do the answer's tokens,
    // its message_complete and done, and the answer as listed.
    let frames: Vec<Frame> = direct.until_done(MINUTE).await;
    let ids_of = |event: &str| -> Vec<String> {
        frames
            .iter()
            .filter(|f| f.event == event)
            .map(|f| f.data["message_id"].as_str().or(f.data["message"]["id"].as_str()).unwrap().to_string())
            .collect()
    };
    let (_, page) = fleet.get(&format!("/v1/agents/rooms/{room_id}/messages?order=asc")).await;
    let listed = page["data"]["messages"].as_array().unwrap().clone();
    let roles: Vec<&str> = listed.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"], "{listed:?}");
    let (calling, answer) = (listed[1]["id"].as_str().unwrap(), listed[3]["id"].as_str().unwrap());
    assert_ne!(calling, answer);
    assert_eq!(ids_of("tool_call"), [calling], "{frames:?}");
    assert_eq!(ids_of("tool_result"), [calling], "{frames:?}");
    let tokens = ids_of("token");
    assert!(!tokens.is_empty() && tokens.iter().all(|id| id == answer), "{frames:?}");
    assert_eq!(ids_of("message_complete"), [answer]);
    assert_eq!(ids_of("done"), [answer]);
    let complete = frames.iter().find(|f| f.event == "message_complete").unwrap();
    assert_eq!(complete.data["message"]["content"], listed[3]["content"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rooms_stream_token_is_the_seeds_streaming_token_for_that_room_alone() {
    let llm = MockLlm::start(|_, _| LlmReply::text(REPLY)).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let room_id = room(&fleet, &[]).await;
    let other = room(&fleet, &[]).await;
    let (status, answer) = fleet.post(&format!("/v1/agents/rooms/{room_id}/stream-token"), &json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let token = answer["streaming_token"].as_str().expect("the seed's top-level streaming_token").to_string();
    assert_eq!(answer["data"]["token"], token.as_str());
    assert_eq!(answer["data"]["room_id"], room_id.as_str());
    assert_eq!(answer["expires_in"], 60);

    let http = reqwest::Client::new();
    let open = |path: String| {
        let req = http.get(format!("{}{path}", fleet.api));
        async move { req.send().await.unwrap() }
    };
    let resp = open(format!("/v1/agents/rooms/{room_id}/stream?token={token}")).await;
    assert_eq!(resp.status(), 200, "the token opens the room's stream without a bearer token");
    assert_eq!(resp.headers()["access-control-allow-origin"], "*");
    let mut reader = SseReader::new(resp);
    reader.opened(Duration::from_secs(10)).await;
    let id = send(&fleet, &room_id, "hi").await;
    let frames = reader.until_done(MINUTE).await;
    let text: String =
        frames.iter().filter(|f| f.event == "token").map(|f| f.data["token"].as_str().unwrap()).collect();
    assert_eq!(text, REPLY);
    fleet.wait_status(&id, "succeeded", MINUTE).await;

    // No other room's stream, and no other route, takes it.
    for path in [
        format!("/v1/agents/rooms/{other}/stream?token={token}"),
        format!("/v1/agents/rooms/{room_id}?token={token}"),
        format!("/v1/agents/rooms/{room_id}/messages?token={token}"),
    ] {
        let resp = open(path.clone()).await;
        assert_eq!(resp.status(), 401, "{path}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthorized", "{path}");
    }
}
