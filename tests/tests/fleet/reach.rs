//! Seed 002's reach in one turn (issue 47's "done when"): the model calls a Python-SDK MCP tool, a
//! TypeScript-SDK MCP tool and two tools that need approval (one approved, one denied), and the
//! turn's final message goes to its output sink. Copies of the paused step are injected before
//! the decisions, and a copy of every job the turn made (its steps, its calls, the decisions'
//! jobs, the delivery) after it finished: each copy is only acked, and every side effect happened
//! once.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::mcp::McpTestServer;
use fleet_tests::tap::JobTap;
use fleet_tests::turn::{llm_fleet, post_turn, session_events, turn_body};
use fleet_tests::{spawn_fleet, wait_for, Fleet, Receiver, Reply};

const SECRET: &str = "whsec_reach_end_to_end_001";
const WORKERS: usize = 2;

/// Every copy the workers counted as a duplicate delivery, of any kind.
async fn duplicates(fleet: &Fleet) -> f64 {
    let mut total = 0.0;
    for index in 0..WORKERS {
        let text = fleet.worker_metrics(index).await;
        total += text
            .lines()
            .filter(|l| l.starts_with("fleet_duplicate_deliveries_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    total
}

async fn register_approval_tool(fleet: &Fleet, name: &str, receiver: &Receiver) {
    let body = json!({"description": name, "callback_url": receiver.url(&format!("/{name}")), "callback_secret": SECRET,
        "parameters": {"type": "object"}, "effects": ["write"], "requires_approval": true});
    let (status, resp) = fleet.request(Method::PUT, &format!("/v1/tools/{name}"), Some(&body)).await;
    assert!(status == 201 || status == 200, "register {name}: {status} {resp}");
}

/// The content of the tool message answering `call_id` in the model's second request.
fn tool_message(llm: &MockLlm, call_id: &str) -> String {
    let second = &llm.requests()[1];
    let message = second.messages().into_iter().find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id);
    message.unwrap_or_else(|| panic!("no tool message for {call_id}"))["content"].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_turn_reaches_two_sdks_servers_two_approvals_and_a_sink_whatever_copies_arrive() {
    let python = McpTestServer::python("tools", &[]).await;
    let typescript = McpTestServer::typescript().await;
    let llm = MockLlm::start(|body, _| {
        if body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool") {
            return LlmReply::text("all done");
        }
        LlmReply::ToolCalls(vec![
            ("call_py".into(), "py__echo".into(), r#"{"text":"hello from python"}"#.into()),
            ("call_ts".into(), "ts__multiply".into(), r#"{"a":6,"b":7}"#.into()),
            ("call_drop".into(), "drop_table".into(), r#"{"table":"users"}"#.into()),
            ("call_purge".into(), "purge_cache".into(), r#"{"scope":"all"}"#.into()),
        ])
    })
    .await;
    let tools = Receiver::start(SECRET, |_, _| Reply::result(json!({"dropped": true}))).await;
    let sink = Receiver::start(SECRET, |r, _| {
        let id = r.json["deliveryId"].as_str().unwrap_or_default();
        let body = json!({"deliveryId": id, "status": "accepted"}).to_string();
        Reply { status: 200, body, delay: Duration::ZERO, headers: vec![] }
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm).workers(WORKERS)).await;
    for (name, server) in [("py", &python), ("ts", &typescript)] {
        let (status, body) = fleet.post("/v1/mcp_servers", &json!({"name": name, "url": server.url})).await;
        assert_eq!(status, 201, "{body}");
    }
    register_approval_tool(&fleet, "drop_table", &tools).await;
    register_approval_tool(&fleet, "purge_cache", &tools).await;
    let hook = json!({"url": sink.url("/deliveries"), "secret": SECRET, "events": ["output.delivery"]});
    assert_eq!(fleet.request(Method::PUT, "/v1/webhooks/reports", Some(&hook)).await.0, 201);

    let tap = JobTap::start(&fleet).await;
    let mut body = turn_body("s_reach", "reach everything", &["py.echo", "ts.multiply", "drop_table", "purge_cache"]);
    body["assistant"]["output_sink"] = json!("reports");
    let turn = post_turn(&fleet, &body).await;

    // Paused on two approvals, holding no worker; a copy of the paused step is only acked.
    let stored = fleet_protocol::tenant::session_storage_id(None, "s_reach").into_owned();
    let requests = wait_for("two approval requests", Duration::from_secs(30), || async {
        let events = session_events(&fleet, &stored).await;
        let found: Vec<Value> = events.into_iter().filter(|e| e["type"] == "approval_request").collect();
        (found.len() >= 2).then_some(found)
    })
    .await;
    let step = tap.first("the turn's first step", |t| t.execution_id() == turn).await;
    tap.republish(&step).await;
    let approval_of = |tool: &str| {
        let request = requests.iter().find(|r| r["tool_name"] == tool).unwrap_or_else(|| panic!("{requests:?}"));
        format!("/v1/approvals/{}", request["approval_id"].as_str().unwrap())
    };
    let approve = json!({"decision": "approve", "reason": "backup checked"});
    let deny = json!({"decision": "deny", "reason": "not during business hours"});
    assert_eq!(fleet.post(&approval_of("drop_table"), &approve).await.0, 200);
    assert_eq!(fleet.post(&approval_of("purge_cache"), &deny).await.0, 200);

    let done = fleet.wait_status(&turn, "succeeded", Duration::from_secs(60)).await;
    assert_eq!(done["turn"]["final_message"]["content"], "all done", "{done}");
    assert!(tool_message(&llm, "call_py").contains("hello from python"), "{}", tool_message(&llm, "call_py"));
    assert!(tool_message(&llm, "call_ts").contains("42"), "{}", tool_message(&llm, "call_ts"));
    assert!(tool_message(&llm, "call_drop").contains("dropped"), "{}", tool_message(&llm, "call_drop"));
    assert!(tool_message(&llm, "call_purge").contains("APPROVAL_DENIED"), "{}", tool_message(&llm, "call_purge"));
    let delivered = wait_for("the delivery", Duration::from_secs(30), || async { sink.received().into_iter().next() }).await;
    assert_eq!(delivered.json["message"]["content"], "all done");
    let delivery_id = delivered.json["deliveryId"].as_str().unwrap().to_string();
    let record = fleet.wait_status(&delivery_id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(record["result"]["status"], "accepted", "{record}");

    // Now a copy of every job the turn made, at once: each is only acked.
    let before = duplicates(&fleet).await;
    let seen = tap.seen().await;
    let kinds: Vec<&str> = seen.iter().map(|t| t.kind()).collect();
    println!("copying {} jobs: {kinds:?}", seen.len());
    for job in &seen {
        tap.republish(job).await;
    }
    let copies = seen.len() as f64;
    wait_for("every copy counted as a duplicate", Duration::from_secs(60), || async {
        (duplicates(&fleet).await - before >= copies).then_some(())
    })
    .await;
    assert_eq!(python.count("tools/call").await, 1, "the Python tool was called once");
    assert_eq!(typescript.count("tools/call").await, 1, "the TypeScript tool was called once");
    let sent: Vec<String> = tools.received().iter().map(|r| r.path.clone()).collect();
    assert_eq!(sent, ["/drop_table"], "the approved tool called once, the denied one never");
    assert_eq!(sink.received().len(), 1, "delivered once");
    assert_eq!(llm.requests().len(), 2, "one model call per round");
    let events = session_events(&fleet, &stored).await;
    // Announced and answered under one name, the fleet tool's (not `py__echo`, the model's).
    let named = |kinds: &[&str]| {
        let mut names: Vec<String> = events.iter().filter(|e| kinds.iter().any(|k| e["type"] == *k))
            .map(|e| e["tool_call"]["tool_name"].as_str().or(e["error"]["tool_name"].as_str()).unwrap_or_default().to_string())
            .collect();
        names.sort();
        names
    };
    // (The denied call's answer is an `error` event naming its call and `APPROVAL_DENIED`.)
    let denied = events.iter().find(|e| e["type"] == "error").unwrap();
    assert_eq!(denied["error"]["code"], "APPROVAL_DENIED", "{denied}");
    assert_eq!(named(&["tool_call"]), ["drop_table", "purge_cache", "py.echo", "ts.multiply"]);
    assert_eq!(named(&["tool_call"]), named(&["tool_result", "error"]));
    let dones = events.iter().filter(|e| e["type"] == "done").count();
    assert_eq!(dones, 1, "the turn finished once");
    tap.close().await;
}
