//! Tools as the seed describes them: `POST /v1/tools` registers (201, 409 for a taken name), the
//! returned `id` addresses the tool for GET/PUT/DELETE (a PUT to an id updates, never creates),
//! `parameters` must be a JSON Schema, tool calls are checked against it (422 naming the path), and
//! a model's arguments that fail it reach the model as an error instead of a callback.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
use fleet_tests::{spawn_fleet, FleetOptions, Receiver};

const SECRET: &str = "whsec_tools_test_secret_1";

/// The seed's registration body ("Register a Tool"), for `name` calling back to `url`.
fn seed_tool(name: &str, url: &str) -> Value {
    json!({
        "name": name,
        "description": "Search the product catalog by query and optional category",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Search query for product names or descriptions"},
                "category": {"type": "string", "description": "Product category to filter by",
                             "enum": ["electronics", "clothing", "home", "sports"]},
                "max_results": {"type": "integer", "description": "Maximum number of results to return", "default": 10}
            },
            "required": ["query"]
        },
        "callback_url": url,
        "callback_secret": SECRET,
    })
}

/// Registers by name (the SPEC's route), so the checks below do not depend on `POST /v1/tools`.
async fn register(fleet: &fleet_tests::Fleet, body: &Value) {
    let path = format!("/v1/tools/{}", body["name"].as_str().unwrap());
    let (status, resp) = fleet.request(Method::PUT, &path, Some(body)).await;
    assert_eq!(status, 201, "{resp}");
}

fn error_message(body: &Value) -> String {
    body["error"]["message"].as_str().unwrap_or_else(|| panic!("a JSON error body: {body}")).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_registers_a_tool_and_a_taken_name_is_409() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    let (status, created) = fleet.post("/v1/tools", &seed_tool("search_products", "https://tools.example.com/s")).await;
    assert_eq!(status, 201, "POST /v1/tools with the seed's body: {created}");
    let data = &created["data"];
    assert_eq!(data["name"], "search_products");
    assert_eq!(data["description"], "Search the product catalog by query and optional category");
    assert!(data["id"].as_str().is_some_and(|id| id.starts_with("tool_")), "{data}");
    assert!(data["created_at"].is_string(), "{data}");
    assert!(!created.to_string().contains(SECRET), "the secret is never returned");

    let (status, again) = fleet.post("/v1/tools", &seed_tool("search_products", "https://tools.example.com/t")).await;
    assert_eq!(status, 409, "{again}");
    assert_eq!(again["error"]["code"], "tool_exists");
    assert!(error_message(&again).contains("search_products"), "{again}");
    let (_, got) = fleet.get("/v1/tools/search_products").await;
    assert_eq!(got["data"]["callback_url"], "https://tools.example.com/s", "the 409 changed nothing");
    assert_eq!(got["data"]["id"], data["id"]);

    let mut nameless = seed_tool("x", "https://tools.example.com/s");
    nameless.as_object_mut().unwrap().remove("name");
    let (status, body) = fleet.post("/v1/tools", &nameless).await;
    assert_eq!(status, 422, "{body}");
    assert!(error_message(&body).contains("name"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_id_addresses_the_tool_and_a_put_to_an_id_never_creates() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    // Registered by name (the SPEC's route), addressed by the id it answers with.
    let (status, created) = fleet
        .request(Method::PUT, "/v1/tools/search_products", Some(&seed_tool("search_products", "https://a.example/s")))
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["data"]["id"].as_str().unwrap().to_string();

    let (status, got) = fleet.get(&format!("/v1/tools/{id}")).await;
    assert_eq!(status, 200, "GET /v1/tools/{id}: {got}");
    assert_eq!(got["data"]["name"], "search_products");
    assert_eq!(got["data"]["id"], id.as_str());

    // The seed's "Update Tool": a partial PUT to the id.
    let update = json!({"description": "Updated description with more detail", "callback_url": "https://a.example/v2"});
    let (status, updated) = fleet.request(Method::PUT, &format!("/v1/tools/{id}"), Some(&update)).await;
    assert_eq!(status, 200, "PUT /v1/tools/{id}: {updated}");
    assert_eq!(updated["data"]["name"], "search_products");
    assert_eq!(updated["data"]["id"], id.as_str());
    let (_, list) = fleet.get("/v1/tools").await;
    let names: Vec<&str> = list["data"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["search_products"], "a PUT to the id updated the tool, it made no second one");
    let (_, by_name) = fleet.get("/v1/tools/search_products").await;
    assert_eq!(by_name["data"]["description"], "Updated description with more detail");
    assert_eq!(by_name["data"]["callback_url"], "https://a.example/v2");

    // A PUT by name updates the same tool and keeps its id.
    let (status, renamed) =
        fleet.request(Method::PUT, "/v1/tools/search_products", Some(&json!({"description": "by name"}))).await;
    assert_eq!(status, 200, "{renamed}");
    assert_eq!(renamed["data"]["id"], id.as_str());

    // The body cannot rename through the id.
    let (status, body) = fleet.request(Method::PUT, &format!("/v1/tools/{id}"), Some(&json!({"name": "other"}))).await;
    assert_eq!(status, 422, "{body}");

    let (status, body) = fleet.request(Method::DELETE, &format!("/v1/tools/{id}"), None).await;
    assert_eq!(status, 204, "DELETE /v1/tools/{id}: {body}");
    let (status, _) = fleet.get("/v1/tools/search_products").await;
    assert_eq!(status, 404, "deleted by its id");
    let (status, _) = fleet.get(&format!("/v1/tools/{id}")).await;
    assert_eq!(status, 404);

    // The id of a deleted tool is 404 for a PUT too: nothing is created under it.
    let (status, body) = fleet.request(Method::PUT, &format!("/v1/tools/{id}"), Some(&update)).await;
    assert_eq!(status, 404, "PUT to an unknown id: {body}");
    let (_, list) = fleet.get("/v1/tools").await;
    assert_eq!(list["data"], json!([]), "no tool was created by the PUT to an id");
    let full = seed_tool("search_products", "https://a.example/s");
    let (status, body) = fleet.request(Method::PUT, &format!("/v1/tools/{id}"), Some(&full)).await;
    assert_eq!(status, 404, "a full body to an unknown id does not create either: {body}");

    // Names of an id's shape are not names: they cannot be registered.
    let (status, body) =
        fleet.request(Method::PUT, &format!("/v1/tools/{id}"), Some(&seed_tool(&id, "https://a.example/s"))).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = fleet.post("/v1/tools", &seed_tool(&id, "https://a.example/s")).await;
    assert_eq!(status, 422, "{body}");
    assert!(error_message(&body).contains("reserved"), "{body}");

    // A new registration under the old name gets a new id; the old id stays dead.
    let (status, again) = fleet.post("/v1/tools", &full).await;
    assert_eq!(status, 201, "{again}");
    assert_ne!(again["data"]["id"], id.as_str());
    let (status, _) = fleet.get(&format!("/v1/tools/{id}")).await;
    assert_eq!(status, 404, "an old id never addresses a new tool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameters_must_be_a_json_schema() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    let with = |parameters: Value| {
        let mut body = seed_tool("schemed", "https://a.example/s");
        body["parameters"] = parameters;
        body
    };
    for bad in [
        json!({"type": "strnig"}),
        json!({"type": "object", "properties": {"query": {"type": 5}}}),
        json!({"type": "object", "required": "query"}),
        json!({"type": "object", "properties": {"q": {"type": "string", "pattern": "(unclosed"}}}),
    ] {
        let (status, body) = fleet.request(Method::PUT, "/v1/tools/schemed", Some(&with(bad.clone()))).await;
        assert_eq!(status, 422, "PUT with parameters {bad}: {body}");
        assert!(error_message(&body).starts_with("parameters"), "{body}");
        let (status, body) = fleet.post("/v1/tools", &with(bad.clone())).await;
        assert_eq!(status, 422, "POST with parameters {bad}: {body}");
    }
    // A schema elsewhere is not fetched: the registry holds whole schemas only.
    let remote = json!({"$ref": "https://schemas.example.com/tool.json"});
    let (status, body) = fleet.post("/v1/tools", &with(remote)).await;
    assert_eq!(status, 422, "{body}");
    let (_, list) = fleet.get("/v1/tools").await;
    assert_eq!(list["data"], json!([]), "nothing was registered");

    // A valid one is accepted; an update cannot break it.
    let (status, body) = fleet.post("/v1/tools", &with(json!({"type": "object"}))).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) =
        fleet.request(Method::PUT, "/v1/tools/schemed", Some(&json!({"parameters": {"type": "strnig"}}))).await;
    assert_eq!(status, 422, "{body}");
    let (_, got) = fleet.get("/v1/tools/schemed").await;
    assert_eq!(got["data"]["parameters"], json!({"type": "object"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_parameters_that_fail_the_schema_are_422_naming_the_path() {
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    register(&fleet, &seed_tool("search_products", &receiver.url("/s"))).await;
    let call = |parameters: Value| json!({"tool_name": "search_products", "parameters": parameters, "room_id": "room_1", "assistant_id": "asst_1"});
    for (parameters, path) in [
        (json!({"query": 5}), "parameters/query"),
        (json!({"category": "electronics"}), "query"),
        (json!({"query": "laptop", "max_results": "ten"}), "parameters/max_results"),
        (json!({"query": "laptop", "category": "food"}), "parameters/category"),
    ] {
        let (status, body) = fleet.post("/v1/tool-calls", &call(parameters.clone())).await;
        assert_eq!(status, 422, "parameters {parameters}: {body}");
        assert_eq!(body["error"]["code"], "invalid_parameters", "{body}");
        assert!(error_message(&body).contains(path), "{parameters}: the message names {path:?}: {body}");
    }
    // Only the valid call reaches the tool owner.
    let good = fleet.call_tool("search_products", json!({"query": "laptop", "max_results": 5})).await;
    fleet.wait_status(&good, "succeeded", Duration::from_secs(20)).await;
    let received = receiver.received();
    assert_eq!(received.len(), 1, "one callback, for the valid call only");
    assert_eq!(received[0].json["parameters"], json!({"query": "laptop", "max_results": 5}));

    // An update of the schema applies to the next call.
    let loosened = json!({"parameters": {"type": "object"}});
    let (status, body) = fleet.request(Method::PUT, "/v1/tools/search_products", Some(&loosened)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = fleet.post("/v1/tool-calls", &call(json!({"query": 5}))).await;
    assert_eq!(status, 202, "the loosened schema accepts it: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_arguments_that_fail_the_schema_go_back_to_the_model_as_an_error() {
    let llm = MockLlm::start(|body, _| {
        if body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool") {
            LlmReply::text("Let me ask differently.")
        } else {
            LlmReply::ToolCalls(vec![(
                "call_1".into(),
                "search_products".into(),
                r#"{"query": 42, "category": "food"}"#.into(),
            )])
        }
    })
    .await;
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    register(&fleet, &seed_tool("search_products", &receiver.url("/s"))).await;

    let id = post_turn(&fleet, &turn_body("s_schema", "find a laptop", &["search_products"])).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["turn"]["final_message"]["content"], "Let me ask differently.");
    assert_eq!(receiver.received().len(), 0, "no callback for arguments that fail the schema");

    let second = &llm.requests()[1];
    let tool_message = second.messages().into_iter().find(|m| m["role"] == "tool").expect("a tool message");
    assert_eq!(tool_message["tool_call_id"], "call_1");
    let content = tool_message["content"].as_str().unwrap();
    assert!(content.contains("error"), "an error result: {content}");
    assert!(content.contains("parameters/query"), "it names the failing path: {content}");
    assert!(content.contains("parameters/category"), "every failing path: {content}");
}
