//! A reasoning model through seed 001's session events: what it thought (streamed as
//! `reasoning_content`, or `reasoning` as some servers name it, or whole) is one `reasoning` event
//! before the answer's, never part of the answer, its tokens or a later prompt. Real dispatcher,
//! worker, broker and Redis; the model is scripted.

use serde_json::{json, Value};

use fleet_tests::agent_events::{events_path, input, kinds, only};
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::spawn_fleet;
use fleet_tests::turn::llm_fleet;

/// What the model thinks in each turn: a marker the later prompts must not hold.
const THOUGHTS: [&str; 3] = ["THOUGHT-ONE", "THOUGHT-TWO", "THOUGHT-THREE"];

/// Turn n reasons about `THOUGHTS[n]` (streamed under `reasoning_content`, streamed under
/// `reasoning`, then whole), then answers `answer n`.
fn reasoning_model(_: &Value, n: usize) -> LlmReply {
    let thought = ["Let me think about ", THOUGHTS[n % 3], "."];
    let answer = format!("answer {n}");
    match n % 3 {
        0 => LlmReply::reasoning(&thought, LlmReply::text(&answer)),
        1 => LlmReply::reasoning(&thought, LlmReply::text(&answer)).reasoning_as("reasoning"),
        _ => LlmReply::reasoning(&thought, LlmReply::Whole(answer)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reasoning_models_thoughts_are_one_event_never_the_answer_nor_a_later_prompt() {
    let llm = MockLlm::start(reasoning_model).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let agent = json!({"name": "thinker", "title": "Thinker", "instructions": "You are helpful."});
    let (status, resp) = fleet.post("/v1/agents/assistants", &agent).await;
    assert_eq!(status, 201, "{resp}");

    let mut inputs = Vec::new();
    for (n, thought) in THOUGHTS.iter().enumerate() {
        let (status, resp) = fleet.post(&events_path("thinker", "r1"), &input(&format!("question {n}"))).await;
        assert_eq!(status, 201, "{resp}");
        inputs.push(only(&resp, "input_message")["id"].as_str().unwrap().strip_prefix("aev_").unwrap().to_string());
        assert_eq!(kinds(&resp), ["input_message", "reasoning", "agent_output"], "turn {n}: {resp}");
        let reasoning = only(&resp, "reasoning");
        assert_eq!(reasoning["content"], format!("Let me think about {thought}."), "turn {n}: {resp}");
        for field in ["id", "session_key", "created_at"] {
            assert!(reasoning[field].is_string(), "turn {n}: the reasoning event has {field}: {reasoning}");
        }
        assert_eq!(reasoning["session_key"], "r1");
        assert_eq!(only(&resp, "agent_output")["content"], format!("answer {n}"), "turn {n}: {resp}");
    }

    // Each later prompt holds the earlier answers and none of the thoughts.
    let requests = llm.requests();
    assert_eq!(requests.len(), 3);
    for (n, request) in requests.iter().enumerate().skip(1) {
        let sent = request.body.to_string();
        assert!(sent.contains(&format!("answer {}", n - 1)), "turn {n} sees the last answer: {sent}");
        for thought in THOUGHTS {
            assert!(!sent.contains(thought), "turn {n}'s prompt holds no reasoning: {sent}");
        }
    }

    // Seed 000's stream of each turn: the thoughts are no answer token, nor in any answer.
    for (n, since) in inputs.iter().enumerate() {
        let frames = fleet_tests::turn::read_until_done(&fleet, "r1", Some(since)).await;
        for (_, _, kind, data) in &frames {
            if kind == "token" || kind == "message_complete" {
                let text = data.to_string();
                assert!(THOUGHTS.iter().all(|t| !text.contains(t)), "{kind} holds no reasoning: {text}");
            }
        }
        let complete = frames.iter().find(|(_, _, kind, _)| kind == "message_complete").expect("the answer");
        assert_eq!(complete.3["message"]["content"], format!("answer {n}"));
    }
}

/// An agent that asks for it (`replay_reasoning`) has its model's reasoning sent back with each
/// answer in later prompts, as `reasoning_content`; the event is the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_asks_for_it_has_its_reasoning_replayed() {
    let llm = MockLlm::start(reasoning_model).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let agent = json!({"name": "replaying", "title": "R", "instructions": "Think.", "replay_reasoning": true});
    let (status, resp) = fleet.post("/v1/agents/assistants", &agent).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(resp["data"]["replay_reasoning"], true, "{resp}");
    let (status, first) = fleet.post(&events_path("replaying", "s1"), &input("first")).await;
    assert_eq!(status, 201, "{first}");
    assert!(only(&first, "reasoning")["content"].as_str().unwrap().contains(THOUGHTS[0]));
    let (status, _) = fleet.post(&events_path("replaying", "s1"), &input("second")).await;
    assert_eq!(status, 201);
    let replayed = llm.requests()[1].messages();
    let answer = replayed.iter().find(|m| m["role"] == "assistant").expect("the first answer in the prompt");
    assert_eq!(answer["content"], "answer 0");
    assert!(answer["reasoning_content"].as_str().unwrap().contains(THOUGHTS[0]), "{answer}");
}
