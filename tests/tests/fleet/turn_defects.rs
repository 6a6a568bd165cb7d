//! A model's tool call too large to travel as a job: it reaches the model as an error result, and
//! its turn goes on. A tool changed just before a turn is what that turn's model is offered.

use std::time::Duration;

use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
use fleet_tests::{spawn_fleet, Receiver, Reply};

const SECRET: &str = "whsec_turn_defects_secret_1";

/// Oversized tool arguments reach the model as an error. A tool call whose arguments make its job
/// larger than the envelope limit is not published (the worker would dead-letter it as poison and
/// the turn wait for it for ever): it reaches the model as an error result while its sibling call
/// runs normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_tool_arguments_reach_the_model_as_an_error() {
    let huge = "x".repeat(fleet_protocol::envelope::MAX_ENVELOPE_BYTES + 1024);
    let big_args = json!({"query": huge}).to_string();
    let llm = MockLlm::start(move |body, _| {
        if body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool") {
            LlmReply::text("handled")
        } else {
            LlmReply::ToolCalls(vec![
                ("call_big".into(), "search".into(), big_args.clone()),
                ("call_small".into(), "search".into(), r#"{"query":"small"}"#.into()),
            ])
        }
    })
    .await;
    let search =
        Receiver::start(SECRET, |r, _| Reply::result(json!({"hit": r.json["parameters"]["query"].clone()}))).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    fleet.register_tool("search", &search.url("/search"), SECRET).await;
    let id = post_turn(&fleet, &turn_body("s_oversized", "search both", &["search"])).await;

    let done =
        tokio::time::timeout(Duration::from_secs(30), fleet.wait_status(&id, "succeeded", Duration::from_secs(3600)));
    if done.await.is_err() {
        let (_, body) = fleet.get(&format!("/v1/executions/{id}")).await;
        let (_, dead) = fleet.get("/v1/dead-letters").await;
        let reasons: Vec<&Value> =
            dead["data"].as_array().map(|a| a.iter().map(|d| &d["reason"]).collect()).unwrap_or_default();
        panic!(
            "turn {id} is {} after 30 s; model calls: {}; receiver calls: {}; dead letters: {reasons:?}",
            body["data"]["status"],
            llm.requests().len(),
            search.received().len()
        );
    }
    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "the model was called again with both results");
    let tools: Vec<Value> = requests[1].messages().into_iter().filter(|m| m["role"] == "tool").collect();
    let content = |call: &str| {
        tools.iter().find(|m| m["tool_call_id"] == call).map(|m| m["content"].as_str().unwrap_or("").to_string())
    };
    let big = content("call_big").expect("the oversized call is answered");
    assert!(big.contains("error") && big.contains("limit"), "the model is told why: {big}");
    assert!(big.len() < 2048, "the error does not echo the arguments: {} bytes", big.len());
    assert!(content("call_small").expect("the small call is answered").contains("small"));
    let received = search.received();
    assert_eq!(received.len(), 1, "only the small call reached the tool");
    assert_eq!(received[0].json["parameters"]["query"], "small");
    let (_, dead) = fleet.get("/v1/dead-letters").await;
    assert_eq!(dead["data"], json!([]), "nothing was dead-lettered");
}

/// A tool's description changed before a message reaches the model answering it. The worker
/// caches the registry for `FLEET_REGISTRY_CACHE`; before the fix a turn sent after a tool's
/// change (or a data source's new semantic mappings) was offered the tool as the cache held it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_new_description_reaches_the_next_turns_model() {
    let llm = MockLlm::start(|_, _| LlmReply::text("noted")).await;
    let search = Receiver::start(SECRET, |_, _| Reply::result(json!({}))).await;
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_REGISTRY_CACHE", "600")).await;
    let mut offered = Vec::new();
    for (n, description) in ["the first description", "the second description"].into_iter().enumerate() {
        let tool = json!({"description": description, "parameters": {"type": "object"},
            "callback_url": search.url("/search"), "callback_secret": SECRET});
        let (status, body) = fleet.request(reqwest::Method::PUT, "/v1/tools/search", Some(&tool)).await;
        assert!(status == 200 || status == 201, "{body}");
        let id = post_turn(&fleet, &turn_body(&format!("s_described_{n}"), "hello", &["search"])).await;
        fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
        let asked: Value = llm.requests().last().unwrap().body.clone();
        offered.push(asked["tools"][0]["function"]["description"].clone());
    }
    assert_eq!(offered, [json!("the first description"), json!("the second description")]);
}
