//! Seed 001's session events, as a client written from the seed uses them: an input answered 201
//! with the turn's events (each with `id`, `session_key`, `created_at`, `type`); 409 while the
//! session runs unless `behavior` or `since` says how to queue; `since` (an event id, or `start`);
//! SSE with `stream_response`; client-side tools answered with `tool_output` (once); compaction of
//! the older history with the session's model. Real dispatcher, workers, broker and Redis; the
//! model is scripted.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use fleet_tests::agent_events::{events_path, input, kinds, of_type};
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::llm_fleet;
use fleet_tests::{spawn_fleet, Fleet};

/// Creates an agent (a seed 000 assistant) named `name` with `tools` enabled.
async fn create_agent(fleet: &Fleet, name: &str, tools: &[&str]) -> String {
    let body = json!({"name": name, "title": "Support", "instructions": "You are helpful.", "enabled_tools": tools});
    let (status, resp) = fleet.post("/v1/agents/assistants", &body).await;
    assert_eq!(status, 201, "{resp}");
    resp["data"]["id"].as_str().or(resp["id"].as_str()).unwrap().to_string()
}

/// Posts an event body; the status and the answer's `events`.
async fn send(fleet: &Fleet, agent: &str, session: &str, body: &Value) -> (u16, Value) {
    fleet.post(&events_path(agent, session), body).await
}

/// A model that answers each conversation by echoing its last user message.
fn echo(body: &Value, _: usize) -> LlmReply {
    let last = body["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "user").unwrap();
    LlmReply::text(&format!("echo: {}", last["content"].as_str().unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_is_answered_with_its_turns_events_each_with_the_seeds_base_fields() {
    let llm = MockLlm::start(echo).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let agent_id = create_agent(&fleet, "support_agent", &[]).await;

    let (status, resp) = send(&fleet, "support_agent", "s1", &input("Hello")).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(kinds(&resp), ["input_message", "agent_output"], "{resp}");
    for event in resp["events"].as_array().unwrap() {
        assert!(event["id"].as_str().unwrap().starts_with("aev_"), "{event}");
        assert_eq!(event["session_key"], "s1", "{event}");
        assert!(
            event["created_at"].as_str().and_then(fleet_protocol::timefmt::millis_from_rfc3339).is_some(),
            "{event}"
        );
    }
    assert_eq!(of_type(&resp, "input_message")[0]["messages"], json!([{"type": "text", "content": "Hello"}]));
    assert_eq!(of_type(&resp, "agent_output")[0]["content"], "echo: Hello");

    // The agent key may be the assistant's id too; the session remembers the first exchange.
    let (status, resp) = send(&fleet, &agent_id, "s1", &input("again")).await;
    assert_eq!(status, 201, "{resp}");
    let seen = llm.requests()[1].contents();
    assert!(seen.contains(&"Hello".to_string()) && seen.contains(&"echo: Hello".to_string()), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_session_refuses_input_unless_behavior_or_since_says_how_to_queue() {
    // The first answer takes a while, so the session is running while the others arrive.
    let llm =
        MockLlm::start(|body, n| if n == 0 { echo(body, n).after(Duration::from_millis(1500)) } else { echo(body, n) })
            .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    create_agent(&fleet, "busy_agent", &[]).await;

    let mut steer = input("also this");
    steer["behavior"] = json!("steer");
    let while_running = async {
        wait_until(|| llm.requests().len() == 1).await;
        let refused = send(&fleet, "busy_agent", "s2", &input("second")).await;
        (refused, send(&fleet, "busy_agent", "s2", &steer).await)
    };
    let first_input = input("first");
    let ((status, first), ((refused, resp), (status_steered, steered))) =
        tokio::join!(send(&fleet, "busy_agent", "s2", &first_input), while_running);
    assert_eq!((refused, resp["error"]["code"].as_str()), (409, Some("session_running")), "{resp}");
    assert_eq!(status_steered, 201, "{steered}");
    assert_eq!(status, 201, "{first}");
    // The steer joined the running turn: one more model call saw both messages.
    let outputs: Vec<&str> = of_type(&steered, "agent_output").iter().map(|e| e["content"].as_str().unwrap()).collect();
    assert_eq!(outputs.last(), Some(&"echo: also this"), "{steered}");
    let calls = llm.requests();
    assert!(calls.last().unwrap().contents().contains(&"first".to_string()), "the steer joined the first turn");

    let mut follow = input("later");
    follow["behavior"] = json!("follow_up");
    let (status, resp) = send(&fleet, "busy_agent", "s2", &follow).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(of_type(&resp, "agent_output").last().unwrap()["content"], "echo: later");

    // `since: start` answers every event of the session, the input itself included.
    let mut since = input("all of it");
    since["since"] = json!("start");
    let (status, resp) = send(&fleet, "busy_agent", "s2", &since).await;
    assert_eq!(status, 201, "{resp}");
    let inputs: Vec<&Value> = of_type(&resp, "input_message");
    let texts: Vec<&str> = inputs.iter().map(|e| e["messages"][0]["content"].as_str().unwrap()).collect();
    assert_eq!(texts, ["first", "also this", "later", "all of it"], "{resp}");
    // `since: <id>` answers what came after that event.
    let cursor = of_type(&resp, "input_message")[2]["id"].as_str().unwrap().to_string();
    let mut after = input("after the cursor");
    after["since"] = json!(cursor);
    let (_, resp) = send(&fleet, "busy_agent", "s2", &after).await;
    let texts: Vec<&str> =
        of_type(&resp, "input_message").iter().map(|e| e["messages"][0]["content"].as_str().unwrap()).collect();
    assert_eq!(texts, ["all of it", "after the cursor"], "{resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_tools_wait_for_the_clients_tool_output_which_is_taken_once() {
    let llm = MockLlm::start(|body, _| {
        let answered = body["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool");
        match answered {
            None => LlmReply::ToolCalls(vec![("call_1".into(), "get_location".into(), r#"{"precise":true}"#.into())]),
            Some(tool) => LlmReply::text(&format!("you are at {}", tool["content"].as_str().unwrap())),
        }
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let tool = json!({"description": "The user's location, from the user's device", "execution": "client",
        "parameters": {"type": "object", "properties": {"precise": {"type": "boolean"}}}});
    let (status, resp) = fleet.request(reqwest::Method::PUT, "/v1/tools/get_location", Some(&tool)).await;
    assert!(status == 200 || status == 201, "{resp}");
    create_agent(&fleet, "geo_agent", &["get_location"]).await;

    let (status, resp) = send(&fleet, "geo_agent", "s3", &input("where am I?")).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(kinds(&resp), ["input_message", "tool_input", "client_tool_pending"], "{resp}");
    let tool_input = of_type(&resp, "tool_input")[0];
    assert_eq!(
        (&tool_input["tool_name"], &tool_input["tool_input"]),
        (&json!("get_location"), &json!({"precise": true}))
    );
    let pending = &of_type(&resp, "client_tool_pending")[0]["pending_calls"][0];
    assert_eq!(pending["event_id"], tool_input["id"], "the pending call names its tool_input event");
    assert_eq!(pending["arguments"], json!({"precise": true}));
    let event_id = pending["event_id"].as_str().unwrap().to_string();
    assert_eq!(llm.requests().len(), 1, "nothing runs while the client holds the call");

    let unknown =
        json!({"type": "tool_output", "tool_outputs": [{"event_id": "aev_1-0", "type": "success", "output": {}}]});
    let (status, resp) = send(&fleet, "geo_agent", "s3", &unknown).await;
    assert_eq!(status, 400, "{resp}");
    assert!(resp["error"]["message"].as_str().unwrap().contains("aev_1-0"), "{resp}");

    let answer = json!({"type": "tool_output", "tool_outputs": [{"event_id": event_id, "type": "success", "output": {"city": "Oslo"}}]});
    let (status, resp) = send(&fleet, "geo_agent", "s3", &answer).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(kinds(&resp), ["tool_output", "agent_output"], "{resp}");
    assert_eq!(of_type(&resp, "tool_output")[0]["tool_output"], json!({"city": "Oslo"}));
    assert_eq!(of_type(&resp, "agent_output")[0]["content"], r#"you are at {"city":"Oslo"}"#);

    let (status, resp) = send(&fleet, "geo_agent", "s3", &answer).await;
    assert_eq!((status, resp["error"]["code"].as_str()), (409, Some("tool_output_already_submitted")), "{resp}");
    assert_eq!(llm.requests().len(), 2, "the repeated answer ran nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_summarises_the_older_history_with_the_sessions_model() {
    let llm = MockLlm::start(|body, n| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        if system.starts_with("Summarise") {
            LlmReply::text(&format!("SUMMARY-{n}"))
        } else {
            echo(body, n)
        }
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    create_agent(&fleet, "long_agent", &[]).await;
    let mut first_input = String::new();
    for text in ["one", "two", "three"] {
        let (status, resp) = send(&fleet, "long_agent", "s4", &input(text)).await;
        assert_eq!(status, 201, "{resp}");
        if text == "one" {
            first_input = of_type(&resp, "input_message")[0]["id"].as_str().unwrap().to_string();
        }
    }

    // Through the first exchange only.
    let anchored = json!({"type": "compaction", "compact_up_to_event_id": first_input});
    let (status, resp) = send(&fleet, "long_agent", "s4", &anchored).await;
    assert_eq!(status, 201, "{resp}");
    let compaction = of_type(&resp, "compaction")[0];
    assert_eq!((&compaction["turns_compacted"], &compaction["events_compacted"]), (&json!(1), &json!(2)), "{resp}");
    let summary_call = llm.requests().into_iter().find(|r| r.contents()[0].starts_with("Summarise")).unwrap();
    let transcript = &summary_call.contents()[1];
    assert!(transcript.contains("user: one") && !transcript.contains("two"), "{transcript}");

    // All but the newest exchange, with the caller's prompt.
    let all = json!({"type": "compaction", "compaction_message": "Summarise tersely."});
    let (status, resp) = send(&fleet, "long_agent", "s4", &all).await;
    assert_eq!(status, 201, "{resp}");
    let compaction = of_type(&resp, "compaction")[0];
    assert_eq!(compaction["turns_compacted"], 2, "the first summary and exchange two: {resp}");
    assert!(compaction["summary_text"].as_str().unwrap().starts_with("SUMMARY-"), "{resp}");
    assert!(compaction["summary_key"].as_str().unwrap().starts_with("sum_"), "{resp}");

    let (status, resp) = send(&fleet, "long_agent", "s4", &input("four")).await;
    assert_eq!(status, 201, "{resp}");
    let seen = llm.requests().last().unwrap().contents();
    assert!(seen.iter().any(|c| c.contains(compaction["summary_text"].as_str().unwrap())), "{seen:?}");
    assert!(!seen.contains(&"one".to_string()) && !seen.contains(&"two".to_string()), "{seen:?}");
    assert!(seen.contains(&"three".to_string()), "the newest exchange is kept: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_response_answers_the_same_events_as_sse() {
    let llm = MockLlm::start(echo).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    create_agent(&fleet, "sse_agent", &[]).await;
    let mut body = input("stream it");
    body["stream_response"] = json!(true);
    let resp = fleet
        .http
        .post(format!("{}{}", fleet.api, events_path("sse_agent", "s5")))
        .bearer_auth(&fleet.token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut text = String::new();
    let mut bytes = resp.bytes_stream();
    // The response ends by itself after the turn's end.
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(30), bytes.next()).await.expect("the turn ends") {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    let frames: Vec<(&str, Value)> = text
        .split("\n\n")
        .filter(|f| f.starts_with("id: "))
        .map(|f| {
            let lines: Vec<&str> = f.lines().collect();
            let event = lines[1].strip_prefix("event: ").unwrap();
            let data: Value = serde_json::from_str(lines[2].strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(lines[0].strip_prefix("id: ").unwrap(), data["id"].as_str().unwrap());
            (event, data)
        })
        .collect();
    let kinds: Vec<&str> = frames.iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, ["input_message", "agent_output"], "{text}");
    assert_eq!(frames[1].1["content"], "echo: stream it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_agents_foreign_sessions_and_malformed_inputs_are_clear_4xx() {
    let llm = MockLlm::start(echo).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    create_agent(&fleet, "agent_a", &[]).await;
    create_agent(&fleet, "agent_b", &[]).await;
    let (status, resp) = send(&fleet, "nobody", "s6", &input("hi")).await;
    assert_eq!((status, resp["error"]["code"].as_str()), (404, Some("agent_not_found")), "{resp}");
    let (status, _) = send(&fleet, "agent_a", "s6", &input("hi")).await;
    assert_eq!(status, 201);
    let (status, resp) = send(&fleet, "agent_b", "s6", &input("hi")).await;
    assert_eq!((status, resp["error"]["code"].as_str()), (404, Some("session_not_found")), "{resp}");
    for (body, names) in [
        (json!({"type": "chat"}), "chat"),
        (json!({"type": "input", "messages": [{"type": "skill", "skill_name": "s"}]}), "messages[0]"),
        (json!({"type": "input", "messages": [{"type": "text", "content": "x"}], "since": "yesterday"}), "since"),
        (json!({"type": "compaction", "compact_up_to_event_id": "aev_1-0"}), "compact_up_to_event_id"),
    ] {
        let (status, resp) = send(&fleet, "agent_a", "s6", &body).await;
        assert_eq!(status, 400, "{body}: {resp}");
        assert!(resp["error"]["message"].as_str().unwrap().contains(names), "{body}: {resp}");
    }
}

/// Waits until `ready` holds (polled every 20 ms, for at most 20 s).
async fn wait_until(ready: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(tokio::time::Instant::now() < deadline, "the condition did not hold in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_timeout_bounds_the_wait_and_the_rest_follows_on_the_stream() {
    let llm = MockLlm::start(|body, n| echo(body, n).after(Duration::from_millis(1500))).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    create_agent(&fleet, "slow_agent", &[]).await;
    let resp = fleet
        .http
        .post(format!("{}{}", fleet.api, events_path("slow_agent", "s7")))
        .bearer_auth(&fleet.token)
        .header("Request-Timeout-Millis", "300")
        .json(&input("take your time"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201, "the input was created");
    let resp: Value = resp.json().await.unwrap();
    assert_eq!(kinds(&resp), ["input_message"], "what came within the wait: {resp}");
    // The answer arrives on the session's stream after the last event the response showed.
    let last = resp["events"][0]["id"].as_str().unwrap().strip_prefix("aev_").unwrap().to_string();
    let frames = fleet_tests::turn::read_until_done(&fleet, "s7", Some(&last)).await;
    let complete = frames.iter().find(|(_, _, kind, _)| kind == "message_complete").expect("the answer");
    assert_eq!(complete.3["message"]["content"], "echo: take your time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_is_a_session_of_its_assistant_and_closed_it_takes_no_input_by_any_route() {
    let llm = MockLlm::start(echo).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let agent_id = create_agent(&fleet, "room_agent", &[]).await;
    create_agent(&fleet, "other_agent", &[]).await;
    let (status, room) = fleet.post(&format!("/v1/agents/{agent_id}/rooms"), &json!({})).await;
    assert_eq!(status, 201, "{room}");
    let room_id = room["data"]["id"].as_str().unwrap().to_string();

    let (status, resp) = send(&fleet, "room_agent", &room_id, &input("in the room")).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(of_type(&resp, "agent_output")[0]["content"], "echo: in the room");
    let (status, resp) = send(&fleet, "other_agent", &room_id, &input("not mine")).await;
    assert_eq!((status, resp["error"]["code"].as_str()), (404, Some("session_not_found")), "{resp}");

    let (status, _) = fleet.post(&format!("/v1/agents/rooms/{room_id}/close"), &json!({})).await;
    assert_eq!(status, 200);
    let (status, resp) = send(&fleet, "room_agent", &room_id, &input("too late")).await;
    assert_eq!((status, resp["error"]["code"].as_str()), (409, Some("room_closed")), "{resp}");
    let turn = fleet_tests::turn::turn_body(&room_id, "too late", &[]);
    let (status, resp) = fleet.post("/v1/turns", &turn).await;
    assert_eq!((status, resp["error"]["code"].as_str()), (409, Some("room_closed")), "{resp}");
    assert_eq!(llm.requests().len(), 1, "nothing ran after the close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_tool_is_not_called_directly_nor_given_a_callback() {
    let fleet = spawn_fleet(fleet_tests::FleetOptions::default()).await;
    let tool = json!({"description": "on the device", "execution": "client"});
    let (status, resp) = fleet.request(reqwest::Method::PUT, "/v1/tools/device_clock", Some(&tool)).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(resp["data"]["execution"], "client", "{resp}");
    let (status, resp) = fleet.post("/v1/tool-calls", &json!({"tool_name": "device_clock", "parameters": {}})).await;
    assert_eq!((status, resp["error"]["code"].as_str()), (422, Some("client_tool")), "{resp}");
    let with_url = json!({"execution": "client", "callback_url": "https://tools.example/x"});
    let (status, resp) = fleet.request(reqwest::Method::PUT, "/v1/tools/device_clock", Some(&with_url)).await;
    assert_eq!(status, 422, "{resp}");
    assert!(resp["error"]["message"].as_str().unwrap().contains("client tool"), "{resp}");
}
