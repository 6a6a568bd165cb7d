//! Approvals (issue 47): a model's call of a tool with `requires_approval` pauses its turn, holding
//! no worker, until an operator decides. The session gets `approval_request`; nothing is sent to
//! the tool before the decision. Approved, the callback goes out once and the model reads its
//! result; denied, nothing is sent and the model reads `APPROVAL_DENIED`; undecided by the
//! deadline, the tool's `approval_timeout_outcome` applies. Copies of the paused step and of the
//! decision are only acked; another tenant's token neither lists nor decides; a different second
//! decision is a 409; an unknown effect is a 400 naming it.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::tap::JobTap;
use fleet_tests::turn::{llm_fleet, session_events};
use fleet_tests::{spawn_fleet, wait_for, Fleet, Receiver, Reply};

const SECRET: &str = "whsec_approvals_secret_0001";
const ADMIN: &str = "approvals-admin-token-0123456789";
const ACME: &str = "approvals-acme-token-0123456789";
const BETA: &str = "approvals-beta-token-0123456789";

/// A model that calls each of `tools` once (arguments carrying a secret-named field), then answers.
async fn calling_model(tools: &'static [&'static str]) -> MockLlm {
    MockLlm::start(move |body, _| {
        let answered = body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool");
        if answered {
            return LlmReply::text("all done");
        }
        let calls = tools
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("call_{i}"), t.to_string(), r#"{"table":"users","api_key":"k-123"}"#.to_string()))
            .collect();
        LlmReply::ToolCalls(calls)
    })
    .await
}

/// Registers `name` as a callback tool to `receiver` with the given approval settings.
async fn register(fleet: &Fleet, token: &str, name: &str, receiver: &Receiver, settings: Value) {
    let mut body = json!({"description": "drops a table", "callback_url": receiver.url(&format!("/{name}")),
        "callback_secret": SECRET, "parameters": {"type": "object"}});
    body.as_object_mut().unwrap().extend(settings.as_object().unwrap().clone());
    let (status, resp) = fleet.request_as(token, &Method::PUT, &format!("/v1/tools/{name}"), Some(&body)).await;
    assert!(status == 201 || status == 200, "register {name}: {status} {resp}");
}

async fn start_turn(fleet: &Fleet, token: &str, session: &str, tools: &[&str]) -> String {
    let body = json!({
        "session_id": session,
        "assistant": {"id": "asst_1", "instructions": "Be careful.", "model_config": {"provider": "openai", "model": "test-model"}, "enabled_tools": tools},
        "messages": [{"role": "user", "content": "clean up"}]
    });
    let (status, resp) = fleet.request_as(token, &Method::POST, "/v1/turns", Some(&body)).await;
    assert_eq!(status, 202, "{resp}");
    resp["data"]["execution_id"].as_str().unwrap().to_string()
}

async fn wait_status(fleet: &Fleet, token: &str, id: &str, status: &str) -> Value {
    wait_for(&format!("execution {id} {status}"), Duration::from_secs(30), || async {
        let (_, resp) = fleet.request_as(token, &Method::GET, &format!("/v1/executions/{id}"), None).await;
        (resp["data"]["status"] == status).then(|| resp["data"].clone())
    })
    .await
}

/// The session's `approval_request` events, once there are `n`.
async fn approval_requests(fleet: &Fleet, stored_session: &str, n: usize) -> Vec<Value> {
    wait_for("approval_request events", Duration::from_secs(30), || async {
        let events = session_events(fleet, stored_session).await;
        let found: Vec<Value> = events.into_iter().filter(|e| e["type"] == "approval_request").collect();
        (found.len() >= n).then_some(found)
    })
    .await
}

/// What the model's second request carried as the result of call `call_id`.
fn tool_message(llm: &MockLlm, call_id: &str) -> String {
    let second = llm.requests().into_iter().nth(1).expect("a second model call");
    let tool = second.messages().into_iter().find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id);
    tool.expect("the call's result")["content"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_call_is_sent_once_after_its_decision_whatever_copies_arrive() {
    let llm = calling_model(&["drop_table"]).await;
    let receiver = Receiver::start(SECRET, |_, _| Reply::result(json!({"dropped": true}))).await;
    let tokens = format!("{ADMIN},{ACME}@acme,{BETA}@beta");
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_API_TOKENS", &tokens)).await;

    // An unknown effect is refused, naming it; the known ones are shown with the tool.
    let bad = json!({"callback_url": receiver.url("/x"), "callback_secret": SECRET, "effects": ["write", "teleport"]});
    let (status, resp) = fleet.request_as(ADMIN, &Method::PUT, "/v1/tools/drop_table", Some(&bad)).await;
    assert_eq!(status, 400, "{resp}");
    assert!(resp["error"]["message"].as_str().unwrap().contains("teleport"), "{resp}");
    register(&fleet, ADMIN, "drop_table", &receiver, json!({"effects": ["write", "execute"], "requires_approval": true}))
        .await;
    let (_, tool) = fleet.request_as(ACME, &Method::GET, "/v1/tools/drop_table", None).await;
    assert_eq!(tool["data"]["effects"], json!(["write", "execute"]), "{tool}");
    assert_eq!(tool["data"]["requires_approval"], true);

    let tap = JobTap::start(&fleet).await;
    let turn = start_turn(&fleet, ACME, "s_approve", &["drop_table"]).await;
    let stored = fleet_protocol::tenant::session_storage_id(Some("acme"), "s_approve").into_owned();
    let request = approval_requests(&fleet, &stored, 1).await.remove(0);
    let id = request["approval_id"].as_str().unwrap().to_string();
    assert_eq!(request["tool_call"]["parameters"], json!({"table": "users", "api_key": "****"}), "{request}");
    assert!(request["deadline"].is_string());

    // Paused, holding no worker: nothing sent, and a copy of the paused step is only acked.
    let step = tap.first("the turn's first step", |t| t.execution_id() == turn).await;
    tap.republish(&step).await;
    let (_, listed) = fleet.request_as(ACME, &Method::GET, "/v1/approvals?status=pending", None).await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["data"][0]["session_id"], "s_approve");
    assert!(receiver.received().is_empty(), "nothing is sent before the decision");

    // Another tenant sees nothing of it and cannot decide it.
    let (_, theirs) = fleet.request_as(BETA, &Method::GET, "/v1/approvals", None).await;
    assert_eq!(theirs["data"], json!([]), "{theirs}");
    let path = format!("/v1/approvals/{id}");
    assert_eq!(fleet.request_as(BETA, &Method::GET, &path, None).await.0, 404);
    let approve = json!({"decision": "approve", "reason": "checked the backup"});
    assert_eq!(fleet.request_as(BETA, &Method::POST, &path, Some(&approve)).await.0, 404);

    let (status, decided) = fleet.request_as(ACME, &Method::POST, &path, Some(&approve)).await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["data"]["status"], "approved");
    assert_eq!(decided["data"]["decided"]["reason"], "checked the backup");
    // The same decision again is answered as it stands (its job published again, a copy); a
    // different one conflicts.
    let (status, again) = fleet.request_as(ACME, &Method::POST, &path, Some(&approve)).await;
    assert_eq!((status, &again["data"]["status"]), (200, &json!("approved")), "{again}");
    let (status, conflict) = fleet.request_as(ACME, &Method::POST, &path, Some(&json!({"decision": "deny"}))).await;
    assert_eq!((status, &conflict["error"]["code"]), (409, &json!("approval_decided")), "{conflict}");

    wait_status(&fleet, ACME, &turn, "succeeded").await;
    assert!(tool_message(&llm, "call_0").contains("dropped"), "{}", tool_message(&llm, "call_0"));
    // The decision's copy, the paused step's copy and the deadline's job: one callback.
    tap.republish(&step).await;
    let call = approval_call(&fleet, ADMIN, &id).await;
    wait_status(&fleet, ADMIN, &call, "succeeded").await;
    assert_eq!(receiver.received().len(), 1, "the callback is sent exactly once");
    assert_eq!(receiver.side_effects(&call), 1);

    let (_, audit) = fleet.request_as(ADMIN, &Method::GET, "/v1/audit", None).await;
    let entries = audit["data"].as_array().unwrap();
    let approved: Vec<&Value> = entries.iter().filter(|e| e["action"] == "approval.approve").collect();
    assert_eq!(approved.len(), 1, "one decision, audited once: {audit}");
    assert_eq!(approved[0]["target"], id.as_str());
    tap.close().await;
}

async fn approval_call(fleet: &Fleet, token: &str, id: &str) -> String {
    let (_, approval) = fleet.request_as(token, &Method::GET, &format!("/v1/approvals/{id}"), None).await;
    approval["data"]["call_execution_id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_call_is_never_sent_and_the_model_reads_approval_denied() {
    let llm = calling_model(&["drop_table"]).await;
    let receiver = Receiver::start(SECRET, |_, _| Reply::result(json!({"dropped": true}))).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let token = fleet.token.clone();
    register(&fleet, &token, "drop_table", &receiver, json!({"effects": ["write"], "requires_approval": true})).await;
    let turn = start_turn(&fleet, &token, "s_deny", &["drop_table"]).await;
    let request = approval_requests(&fleet, "s_deny", 1).await.remove(0);
    let path = format!("/v1/approvals/{}", request["approval_id"].as_str().unwrap());

    let deny = json!({"decision": "deny", "reason": "not during business hours"});
    let (status, decided) = fleet.request_as(&token, &Method::POST, &path, Some(&deny)).await;
    assert_eq!((status, &decided["data"]["status"]), (200, &json!("denied")), "{decided}");
    wait_status(&fleet, &token, &turn, "succeeded").await;
    let told = tool_message(&llm, "call_0");
    assert!(told.contains("APPROVAL_DENIED") && told.contains("not during business hours"), "{told}");
    assert!(told.contains("failed"), "{told}");
    assert!(receiver.received().is_empty(), "a denied call is never sent");
    let events = session_events(&fleet, "s_deny").await;
    let error = events.iter().find(|e| e["type"] == "error").expect("the call's error event");
    assert_eq!(error["error"]["code"], "APPROVAL_DENIED", "{error}");
    assert_eq!(error["error"]["message"], "not during business hours", "{error}");
    let (status, _) = fleet.request_as(&token, &Method::POST, &path, Some(&json!({"decision": "approve"}))).await;
    assert_eq!(status, 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecided_call_takes_its_tools_timeout_outcome_at_the_deadline() {
    let llm = calling_model(&["refused_late", "allowed_late"]).await;
    let receiver = Receiver::start(SECRET, |_, _| Reply::result(json!({"ran": true}))).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let token = fleet.token.clone();
    let deny = json!({"requires_approval": true, "approval_timeout_secs": 1});
    register(&fleet, &token, "refused_late", &receiver, deny).await;
    let approve =
        json!({"requires_approval": true, "approval_timeout_secs": 2, "approval_timeout_outcome": "approve"});
    register(&fleet, &token, "allowed_late", &receiver, approve).await;

    let turn = start_turn(&fleet, &token, "s_late", &["refused_late", "allowed_late"]).await;
    let requests = approval_requests(&fleet, "s_late", 2).await;
    assert!(receiver.received().is_empty());
    wait_status(&fleet, &token, &turn, "succeeded").await;
    let refused = tool_message(&llm, "call_0");
    assert!(refused.contains("APPROVAL_TIMEOUT"), "{refused}");
    assert!(tool_message(&llm, "call_1").contains("ran"), "{}", tool_message(&llm, "call_1"));
    let sent = receiver.received();
    assert_eq!(sent.len(), 1, "only the call whose deadline approves is sent");
    assert_eq!(sent[0].json["tool_name"], "allowed_late");
    for request in requests {
        let path = format!("/v1/approvals/{}", request["approval_id"].as_str().unwrap());
        let (_, approval) = fleet.request_as(&token, &Method::GET, &path, None).await;
        assert_eq!(approval["data"]["status"], "timed_out", "{approval}");
        assert_eq!(approval["data"]["decided"]["by"], "deadline");
        let (status, _) = fleet.request_as(&token, &Method::POST, &path, Some(&json!({"decision": "approve"}))).await;
        assert_eq!(status, 409, "the deadline decided it");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_client_call_becomes_pending_for_the_client_only_once_approved() {
    let llm = MockLlm::start(|body, _| {
        let answered = body["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool");
        match answered {
            None => LlmReply::ToolCalls(vec![("call_1".into(), "wipe_device".into(), r#"{"confirm":true}"#.into())]),
            Some(tool) => LlmReply::text(&format!("wiped: {}", tool["content"].as_str().unwrap())),
        }
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let tool = json!({"description": "Wipes the user's device", "execution": "client", "effects": ["execute"],
        "requires_approval": true, "parameters": {"type": "object"}});
    let (status, resp) = fleet.request(Method::PUT, "/v1/tools/wipe_device", Some(&tool)).await;
    assert!(status == 200 || status == 201, "{resp}");
    let agent = json!({"name": "device_agent", "title": "Device", "instructions": "Help.", "enabled_tools": ["wipe_device"]});
    assert_eq!(fleet.post("/v1/agents/assistants", &agent).await.0, 201);
    fleet_tests::turn::send_agent_input(&fleet, "device_agent", "s_client", "wipe it").await;

    let request = approval_requests(&fleet, "s_client", 1).await.remove(0);
    let pending = |events: &[Value]| events.iter().any(|e| e["type"] == "client_tool_pending");
    assert!(!pending(&session_events(&fleet, "s_client").await), "not the client's before the decision");
    let path = format!("/v1/approvals/{}", request["approval_id"].as_str().unwrap());
    let (status, decided) = fleet.request(Method::POST, &path, Some(&json!({"decision": "approve"}))).await;
    assert_eq!(status, 200, "{decided}");
    let events = wait_for("the call pending for the client", Duration::from_secs(30), || async {
        let events = session_events(&fleet, "s_client").await;
        pending(&events).then_some(events)
    })
    .await;
    let announced = events.iter().find(|e| e["type"] == "client_tool_pending").unwrap();
    let event_id = announced["pending_calls"][0]["event_id"].as_str().unwrap().to_string();
    let answer = json!({"type": "tool_output", "tool_outputs": [{"event_id": event_id, "type": "success", "output": {"wiped": true}}]});
    let (status, resp) = fleet.post(&fleet_tests::agent_events::events_path("device_agent", "s_client"), &answer).await;
    assert_eq!(status, 201, "{resp}");
    let text = resp.to_string();
    assert!(text.contains("wiped: "), "{resp}");
}
