//! Sessions that remember: a follow-up turn's model request carries the session's earlier
//! exchanges, the history is listed with the seed's paging and forgotten on `DELETE`, and its
//! budget drops the oldest whole exchanges (never a tool result without its call).

use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::spawn_fleet;
use fleet_tests::turn::{llm_fleet, post_turn, turn_body};

/// Runs one turn to completion and returns its execution id.
async fn turn(fleet: &fleet_tests::Fleet, session: &str, text: &str) -> String {
    let id = post_turn(fleet, &turn_body(session, text, &[])).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    id
}

/// (role, content) of every message a model request carried.
fn sent(request: &fleet_tests::llm::LlmRequest) -> Vec<(String, String)> {
    request
        .messages()
        .iter()
        .map(|m| (m["role"].as_str().unwrap_or("").to_string(), m["content"].as_str().unwrap_or("").to_string()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(r, c)| (r.to_string(), c.to_string())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_turn_sees_the_earlier_exchange_and_delete_forgets_it() {
    let llm = MockLlm::start(|body, _| {
        let last = body["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
        match last["content"].as_str().unwrap_or("") {
            "my name is Ada" => LlmReply::text("Nice to meet you, Ada."),
            _ => LlmReply::text("Noted."),
        }
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    turn(&fleet, "s_ada", "my name is Ada").await;
    turn(&fleet, "s_ada", "what is my name?").await;
    let requests = llm.requests();
    assert_eq!(
        sent(&requests[1]),
        pairs(&[
            ("system", "You are helpful."),
            ("user", "my name is Ada"),
            ("assistant", "Nice to meet you, Ada."),
            ("user", "what is my name?"),
        ]),
        "the follow-up's model request"
    );

    // The listing: newest first by default, in pages with an opaque cursor.
    let (status, page1) = fleet.get("/v1/sessions/s_ada/messages?limit=3").await;
    assert_eq!(status, 200, "{page1}");
    let contents = |page: &Value| -> Vec<String> {
        page["data"]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(contents(&page1), ["Noted.", "what is my name?", "Nice to meet you, Ada."]);
    assert_eq!(page1["data"]["has_more"], true);
    let cursor = page1["data"]["next_cursor"].as_str().expect("a next_cursor").to_string();
    let (status, page2) = fleet.get(&format!("/v1/sessions/s_ada/messages?limit=3&cursor={cursor}")).await;
    assert_eq!(status, 200, "{page2}");
    assert_eq!(contents(&page2), ["my name is Ada"]);
    assert_eq!(page2["data"]["has_more"], false);
    assert_eq!(page2["data"]["next_cursor"], Value::Null);
    let first = &page2["data"]["messages"][0];
    assert_eq!(first["role"], "user");
    assert!(first["id"].as_str().unwrap().starts_with("msg_"), "{first}");
    assert!(first["created_at"].as_str().unwrap().ends_with('Z'), "{first}");
    let (_, asc) = fleet.get("/v1/sessions/s_ada/messages?order=asc").await;
    assert_eq!(contents(&asc), ["my name is Ada", "Nice to meet you, Ada.", "what is my name?", "Noted."]);
    let (status, bad) = fleet.get("/v1/sessions/s_ada/messages?limit=101").await;
    assert_eq!(status, 422, "{bad}");
    assert!(bad["error"]["message"].as_str().unwrap().contains("limit"), "{bad}");
    let (status, bad) = fleet.get("/v1/sessions/s_ada/messages?order=sideways").await;
    assert!(status == 422 || status == 400, "{status} {bad}");
    let (status, bad) = fleet.get("/v1/sessions/s_ada/messages?cursor=nonsense").await;
    assert!(status == 422 || status == 400, "{status} {bad}");

    // Forgotten: the listing is empty and the next turn starts from nothing.
    let (status, _) = fleet.request(Method::DELETE, "/v1/sessions/s_ada", None).await;
    assert_eq!(status, 204);
    let (status, empty) = fleet.get("/v1/sessions/s_ada/messages").await;
    assert_eq!(status, 200);
    assert_eq!(contents(&empty), Vec::<String>::new());
    assert_eq!(empty["data"]["has_more"], false);
    turn(&fleet, "s_ada", "who am I?").await;
    assert_eq!(
        sent(&llm.requests()[2]),
        pairs(&[("system", "You are helpful."), ("user", "who am I?")]),
        "after DELETE"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_budget_drops_the_oldest_whole_exchanges() {
    // The first turn calls a tool the assistant has not enabled: its exchange is four messages
    // (user, assistant with the call, the tool's refusal, the final answer).
    let llm = MockLlm::start(|body, _| {
        let messages = body["messages"].as_array().unwrap();
        let last = messages.last().unwrap();
        if last["content"] == "first" {
            LlmReply::ToolCalls(vec![("call_1".into(), "not_enabled".into(), "{}".into())])
        } else if last["role"] == "tool" {
            LlmReply::text("tool refused")
        } else {
            LlmReply::text(&format!("ok {}", last["content"].as_str().unwrap_or("")))
        }
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_SESSION_HISTORY_MAX_MESSAGES", "4")).await;
    turn(&fleet, "s_budget", "first").await;
    turn(&fleet, "s_budget", "second").await;
    let second = llm.requests().last().unwrap().messages();
    let roles: Vec<&str> = second.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant", "user"], "{second:?}");
    assert_eq!(second[2]["tool_calls"][0]["id"], "call_1");
    assert_eq!(second[3]["tool_call_id"], "call_1");

    // 4 + 2 messages exceed the budget of 4: the first exchange goes, whole.
    turn(&fleet, "s_budget", "third").await;
    assert_eq!(
        sent(llm.requests().last().unwrap()),
        pairs(&[("system", "You are helpful."), ("user", "second"), ("assistant", "ok second"), ("user", "third")]),
        "the oldest exchange was dropped whole"
    );
    let (_, listed) = fleet.get("/v1/sessions/s_budget/messages?order=asc").await;
    let roles: Vec<&str> =
        listed["data"]["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant"], "{listed}");
}
