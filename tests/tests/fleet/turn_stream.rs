//! The model stream, exactly: bytes decoded as one UTF-8 event stream whatever the network splits,
//! `finish_reason: "length"` kept, `max_tokens` sent, a runaway response bounded, in-stream errors
//! and cut streams retried with the client told which tokens to drop, every model attempt recorded,
//! and no provider URL in any error.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, post_turn, read_until_done, turn_body};
use fleet_tests::{free_port, spawn_fleet, FleetOptions};

fn chunk(delta: Value, finish_reason: Value) -> String {
    json!({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})
        .to_string()
}

fn frame(data: &str) -> Vec<u8> {
    format!("data: {data}\n\n").into_bytes()
}

/// Cuts `bytes` at the given offsets into pieces sent as separate network writes.
fn cut(bytes: &[u8], at: &[usize]) -> Vec<Vec<u8>> {
    let mut pieces = Vec::new();
    let mut from = 0;
    for &to in at.iter().chain(std::iter::once(&bytes.len())) {
        pieces.push(bytes[from..to].to_vec());
        from = to;
    }
    pieces
}

/// The text a client keeps: tokens grouped by `message_id`, minus the messages named by `retry`.
fn kept_text(frames: &[(String, String, String, Value)]) -> HashMap<String, String> {
    let retried: Vec<&str> =
        frames.iter().filter(|f| f.2 == "retry").filter_map(|f| f.3["message_id"].as_str()).collect();
    let mut text: HashMap<String, String> = HashMap::new();
    let mut next_index: HashMap<String, u64> = HashMap::new();
    for (_, _, event, data) in frames.iter().filter(|f| f.2 == "token") {
        assert_eq!(event, "token");
        let id = data["message_id"].as_str().unwrap().to_string();
        let index = next_index.entry(id.clone()).or_insert(0);
        assert_eq!(data["index"].as_u64(), Some(*index), "indexes count up within a message: {data}");
        *index += 1;
        if !retried.contains(&id.as_str()) {
            text.entry(id).or_default().push_str(data["token"].as_str().unwrap());
        }
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn characters_split_across_reads_and_multi_line_data_are_decoded_exactly() {
    let mut stream = Vec::new();
    stream.extend(b": keep-alive\n\n");
    stream.extend(frame(&chunk(json!({"role": "assistant", "content": ""}), Value::Null)));
    stream.extend(b"event: message\n");
    stream.extend(frame(&chunk(json!({"content": "Café ☕"}), Value::Null)));
    // One event whose JSON spans two `data:` lines (joined by a newline, as SSE says).
    stream.extend(b"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\n");
    stream
        .extend(b"data: \"choices\":[{\"index\":0,\"delta\":{\"content\":\" for Ada\"},\"finish_reason\":null}]}\n\n");
    stream.extend(frame(&chunk(json!({}), json!("stop"))));
    stream.extend(frame("[DONE]"));
    // Cut inside `é` (2 bytes) and inside `☕` (3 bytes).
    let e_acute = stream.windows(2).position(|w| w == "é".as_bytes()).unwrap();
    let cup = stream.windows(3).position(|w| w == "☕".as_bytes()).unwrap();
    let pieces = cut(&stream, &[e_acute + 1, cup + 1, cup + 2]);
    let llm = MockLlm::start(move |_, _| LlmReply::Raw(pieces.clone())).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let reader = read_until_done(&fleet, "s_utf8", None);
    let (frames, id) = tokio::join!(reader, async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        post_turn(&fleet, &turn_body("s_utf8", "hi", &[])).await
    });
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(done["turn"]["final_message"]["content"], "Café ☕ for Ada", "the stored message");
    let complete = frames.iter().find(|f| f.2 == "message_complete").expect("message_complete").3.clone();
    assert_eq!(complete["message"]["content"], "Café ☕ for Ada");
    let kept = kept_text(&frames);
    let message_id = complete["message"]["id"].as_str().unwrap();
    assert_eq!(kept.get(message_id).map(String::as_str), Some("Café ☕ for Ada"), "the streamed tokens");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_length_cut_answer_is_kept_as_such_and_max_tokens_is_sent() {
    let mut stream = frame(&chunk(json!({"role": "assistant", "content": "Once upon a"}), Value::Null));
    stream.extend(frame(&chunk(json!({}), json!("length"))));
    stream.extend(frame("[DONE]"));
    let llm = MockLlm::start(move |_, _| LlmReply::Raw(vec![stream.clone()])).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let id = post_turn(&fleet, &turn_body("s_length", "tell me a story", &[])).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    let message = &done["turn"]["final_message"];
    assert_eq!(message["content"], "Once upon a");
    assert_eq!(message["finish_reason"], "length", "a cut answer says so: {message}");
    assert_eq!(llm.requests()[0].body["max_tokens"], 4096, "the default FLEET_LLM_MAX_TOKENS is sent");

    let mut body = turn_body("s_length_2", "short please", &[]);
    body["assistant"]["model_config"]["max_tokens"] = json!(50);
    let id = post_turn(&fleet, &body).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(llm.requests()[1].body["max_tokens"], 50, "model_config.max_tokens is sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_response_is_bounded_and_ends_the_turn_with_a_clear_error() {
    let llm = MockLlm::start(|_, _| LlmReply::Runaway).await;
    let fleet =
        spawn_fleet(llm_fleet(&llm).env("FLEET_RETRY_DELAYS", "0.2").env("FLEET_LLM_MAX_RESPONSE_BYTES", "65536"))
            .await;
    let id = post_turn(&fleet, &turn_body("s_runaway", "sing", &[])).await;
    let done = fleet.wait_status(&id, "dead_lettered", Duration::from_secs(30)).await;
    let attempts = done["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    for attempt in attempts {
        let error = attempt["error"].as_str().unwrap();
        assert!(error.contains("FLEET_LLM_MAX_RESPONSE_BYTES"), "the error names the limit: {error}");
        assert!(attempt["duration_ms"].as_u64().unwrap() < 20_000);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_stream_errors_and_cut_streams_are_retried_and_the_client_is_told() {
    let llm = MockLlm::start(|_, n| match n {
        0 => {
            let mut s = frame(&chunk(json!({"role": "assistant", "content": "Hel"}), Value::Null));
            s.extend(frame(&json!({"error": {"message": "overloaded", "code": 503}}).to_string()));
            LlmReply::Raw(vec![s])
        }
        // Cut: no finish_reason, no [DONE].
        1 => LlmReply::Raw(vec![
            frame(&chunk(json!({"content": "Hel"}), Value::Null)),
            frame(&chunk(json!({"content": "lo"}), Value::Null)),
        ]),
        _ => LlmReply::text("Hello world"),
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_RETRY_DELAYS", "0.3,0.3,0.3")).await;
    let reader = read_until_done(&fleet, "s_retry", None);
    let (frames, id) = tokio::join!(reader, async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        post_turn(&fleet, &turn_body("s_retry", "hi", &[])).await
    });
    let retries: Vec<&Value> = frames.iter().filter(|f| f.2 == "retry").map(|f| &f.3).collect();
    assert_eq!(
        retries.len(),
        2,
        "one retry event per abandoned attempt: {:?}",
        frames.iter().map(|f| &f.3).collect::<Vec<_>>()
    );
    let complete = frames.iter().find(|f| f.2 == "message_complete").expect("message_complete").3.clone();
    let message_id = complete["message"]["id"].as_str().unwrap();
    assert!(retries.iter().all(|r| r["message_id"] != message_id), "each attempt streams under its own message id");
    let kept = kept_text(&frames);
    assert_eq!(kept.len(), 1, "only the final attempt's tokens are kept: {kept:?}");
    assert_eq!(kept[message_id], "Hello world");
    assert_eq!(complete["message"]["content"], "Hello world");

    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    let attempts = done["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3, "every model attempt is recorded: {attempts:?}");
    assert!(attempts[0]["error"].as_str().unwrap().contains("overloaded"), "{}", attempts[0]);
    assert!(attempts[1]["error"].as_str().unwrap().contains("[DONE]"), "{}", attempts[1]);
    assert_eq!(attempts[2]["outcome"], "success");
    assert_eq!(attempts[2]["completion_tokens"], 3, "tokens are recorded per attempt: {}", attempts[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_errors_never_carry_the_provider_url() {
    let port = free_port();
    let fleet = spawn_fleet(
        FleetOptions::default()
            .env("FLEET_LLM_BASE_URL", &format!("http://user:pw@127.0.0.1:{port}/v1?api-key=sekrit"))
            .env("FLEET_RETRY_DELAYS", "0.2"),
    )
    .await;
    let reader = read_until_done(&fleet, "s_url", None);
    let (frames, id) = tokio::join!(reader, async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        post_turn(&fleet, &turn_body("s_url", "hi", &[])).await
    });
    let done = fleet.wait_status(&id, "dead_lettered", Duration::from_secs(20)).await;
    let (_, dead) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
    let seen = format!("{done} {dead} {frames:?}");
    for secret in ["sekrit", "api-key", &format!("127.0.0.1:{port}"), "user:pw"] {
        assert!(!seen.contains(secret), "{secret:?} leaked into a record or frame: {seen}");
    }
    assert!(done["attempts"][0]["error"].as_str().unwrap().contains("LLM"), "{}", done["attempts"][0]);
}
