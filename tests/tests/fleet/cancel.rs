//! `POST /v1/executions/{id}/cancel`: a queued tool call or turn never runs; a turn waiting on a
//! slow tool ends at once (`error` `cancelled`, then `done`; no further model call; its session's
//! next turn runs); a tool call already sent is not unsent (409 `already_sent`); an unknown id is
//! 404.

use std::time::Duration;

use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, post_turn, read_until_done, turn_body};
use fleet_tests::{spawn_fleet, wait_for, Fleet, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_cancel_secret_0001";

async fn cancel(fleet: &Fleet, id: &str) -> (u16, Value) {
    fleet.post(&format!("/v1/executions/{id}/cancel"), &json!({})).await
}

/// Waits until worker `index` counts a job of `kind` that ended `cancelled`.
async fn wait_cancelled_metric(fleet: &Fleet, index: usize, kind: &str) {
    let line = format!("fleet_jobs_finished_total{{kind=\"{kind}\",outcome=\"cancelled\"}} 1");
    wait_for(&line, Duration::from_secs(20), || async {
        fleet.worker_metrics(index).await.contains(&line).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_tool_call_is_cancelled_and_never_reaches_its_receiver() {
    let receiver = Receiver::echo(SECRET).await;
    let mut fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    fleet.register_tool("search", &receiver.url("/search"), SECRET).await;
    let id = fleet.call_tool("search", json!({"query": "never sent"})).await;

    let (status, answer) = cancel(&fleet, &id).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["data"], json!({"execution_id": id, "status": "cancelled"}));
    let (_, view) = fleet.get(&format!("/v1/executions/{id}")).await;
    assert_eq!(view["data"]["status"], "cancelled");
    // Asking again answers the same.
    let (status, again) = cancel(&fleet, &id).await;
    assert_eq!((status, &again["data"]["status"]), (202, &json!("cancelled")), "{again}");

    // A worker now receives the job: it ends cancelled with nothing sent.
    let worker = fleet.spawn_worker().await;
    wait_cancelled_metric(&fleet, worker, "tool_call").await;
    let after = fleet.call_tool("search", json!({"query": "sent"})).await;
    fleet.wait_status(&after, "succeeded", Duration::from_secs(20)).await;
    let received: Vec<String> = receiver.received().iter().map(|r| r.execution_id().to_string()).collect();
    assert_eq!(received, vec![after], "only the call that was not cancelled reached the receiver");
    let (_, view) = fleet.get(&format!("/v1/executions/{id}")).await;
    assert_eq!(view["data"]["status"], "cancelled");
    assert_eq!(view["data"]["attempts"], json!([]), "no attempt was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_already_sent_cannot_be_unsent() {
    let slow = Receiver::start(SECRET, |_, _| Reply::result(json!("done")).after(Duration::from_millis(1500))).await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("slow", &slow.url("/slow"), SECRET).await;
    let id = fleet.call_tool("slow", json!({"query": "q"})).await;
    wait_for("the call to reach its receiver", Duration::from_secs(20), || async {
        (!slow.received().is_empty()).then_some(())
    })
    .await;

    let (status, answer) = cancel(&fleet, &id).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["code"], "already_sent");
    assert!(answer["error"]["message"].as_str().unwrap().contains("cannot be unsent"), "{answer}");
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(slow.received().len(), 1);

    let (status, answer) = cancel(&fleet, &id).await;
    assert_eq!((status, &answer["error"]["code"]), (409, &json!("already_finished")), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_execution_is_not_found() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    for id in ["exec_doesnotexist", "not an id"] {
        let (status, answer) = cancel(&fleet, &id.replace(' ', "%20")).await;
        assert_eq!((status, &answer["error"]["code"]), (404, &json!("not_found")), "{id}: {answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_turn_is_cancelled_before_it_reaches_the_model() {
    let llm = MockLlm::start(|_, _| LlmReply::text("should not run")).await;
    let mut fleet = spawn_fleet(llm_fleet(&llm).workers(0)).await;
    let id = post_turn(&fleet, &turn_body("s_queued", "never", &[])).await;
    let (status, answer) = cancel(&fleet, &id).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["data"]["status"], "queued", "a turn ends when a step sees the request");
    assert!(answer["data"]["note"].as_str().unwrap().contains("next model call"), "{answer}");

    fleet.spawn_worker().await;
    fleet.wait_status(&id, "cancelled", Duration::from_secs(20)).await;
    let frames = read_until_done(&fleet, "s_queued", Some("0-0")).await;
    let events: Vec<&str> = frames.iter().map(|f| f.2.as_str()).collect();
    assert_eq!(events, ["error", "done"], "{frames:?}");
    assert_eq!(frames[0].3["error"]["code"], "cancelled");
    assert!(llm.requests().is_empty(), "the model was never called");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_waiting_on_a_slow_tool_ends_cancelled_and_its_session_moves_on() {
    let llm = MockLlm::start(|body, _| {
        let asks_to_wait = body["messages"].as_array().unwrap().iter().any(|m| m["content"] == "wait on the tool");
        let has_tool_result = body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool");
        if asks_to_wait && !has_tool_result {
            LlmReply::ToolCalls(vec![("call_slow".into(), "slow".into(), r#"{"query":"s"}"#.into())])
        } else {
            LlmReply::text("the next turn ran")
        }
    })
    .await;
    let slow = Receiver::start(SECRET, |_, _| Reply::result(json!("late")).after(Duration::from_secs(6))).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    fleet.register_tool("slow", &slow.url("/slow"), SECRET).await;
    let id = post_turn(&fleet, &turn_body("s_cancel", "wait on the tool", &["slow"])).await;
    wait_for("the turn's tool call", Duration::from_secs(20), || async { (!slow.received().is_empty()).then_some(()) })
        .await;
    let tool_exec = slow.received()[0].execution_id().to_string();

    let (status, answer) = cancel(&fleet, &id).await;
    assert_eq!(status, 202, "{answer}");
    fleet.wait_status(&id, "cancelled", Duration::from_secs(20)).await;
    let (_, tool) = fleet.get(&format!("/v1/executions/{tool_exec}")).await;
    assert_eq!(tool["data"]["status"], "running", "the turn ended without waiting for its tool");

    let frames = read_until_done(&fleet, "s_cancel", Some("0-0")).await;
    let tail: Vec<(&str, &Value)> = frames.iter().rev().take(2).map(|f| (f.2.as_str(), &f.3)).collect();
    assert_eq!(tail[0].0, "done", "{frames:?}");
    assert_eq!((tail[1].0, &tail[1].1["error"]["code"]), ("error", &json!("cancelled")), "{frames:?}");

    // The session is free: its next turn runs while the cancelled turn's tool is still out.
    let next = post_turn(&fleet, &turn_body("s_cancel", "and now?", &[])).await;
    let done = fleet.wait_status(&next, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(done["turn"]["final_message"]["content"], "the next turn ran");

    // The tool's late answer does not wake the cancelled turn: no model call reads it.
    fleet.wait_status(&tool_exec, "succeeded", Duration::from_secs(20)).await;
    // Counted once the tool call told its turn.
    let told = "fleet_jobs_finished_total{kind=\"tool_call\",outcome=\"success\"} 1";
    wait_for(told, Duration::from_secs(20), || async { fleet.worker_metrics(0).await.contains(told).then_some(()) })
        .await;
    let (_, view) = fleet.get(&format!("/v1/executions/{id}")).await;
    assert_eq!(view["data"]["status"], "cancelled");
    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "one model call for each turn, none after the cancel");
    assert!(
        requests.iter().all(|r| !r.messages().iter().any(|m| m["role"] == "tool")),
        "no tool result reached the model"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_turns_still_queued_tool_call_is_never_sent() {
    let llm = MockLlm::start(|body, _| {
        let has_tool_result = body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool");
        if has_tool_result {
            LlmReply::text("should not run")
        } else {
            LlmReply::ToolCalls(vec![
                ("call_a".into(), "slow".into(), r#"{"query":"a"}"#.into()),
                ("call_b".into(), "slow".into(), r#"{"query":"b"}"#.into()),
            ])
        }
    })
    .await;
    let slow = Receiver::start(SECRET, |_, _| Reply::result(json!("late")).after(Duration::from_secs(3))).await;
    // One job at a time: while one call is out, the other waits in its queue.
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_WORKER_CONCURRENCY", "1")).await;
    fleet.register_tool("slow", &slow.url("/slow"), SECRET).await;
    let id = post_turn(&fleet, &turn_body("s_fanout", "two calls", &["slow"])).await;
    wait_for("one call out", Duration::from_secs(20), || async { (!slow.received().is_empty()).then_some(()) }).await;

    let (status, answer) = cancel(&fleet, &id).await;
    assert_eq!(status, 202, "{answer}");
    let view = fleet.wait_status(&id, "cancelled", Duration::from_secs(30)).await;
    let calls: Vec<String> = view["turn"]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["execution_id"].as_str().expect("a fanned-out call has its execution").to_string())
        .collect();
    assert_eq!(calls.len(), 2, "{view}");
    let sent = slow.received()[0].execution_id().to_string();
    let queued = calls.iter().find(|c| **c != sent).unwrap().clone();
    fleet.wait_status(&sent, "succeeded", Duration::from_secs(20)).await;
    fleet.wait_status(&queued, "cancelled", Duration::from_secs(20)).await;
    wait_cancelled_metric(&fleet, 0, "tool_call").await;
    assert_eq!(slow.received().len(), 1, "the queued call was never sent");
    assert_eq!(llm.requests().len(), 1, "no model call after the cancel");
}
