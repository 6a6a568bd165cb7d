//! Seed 001's agent as a client written from the seed uses it: steps entered by `entry_step` or
//! carried by the session, handoffs as `step_transition` events with the next step's prompt and
//! tools, the transition limit; skills loaded by name; answers checked against output schemas
//! (`structured_output`, or an error event); secrets stored sealed and shown only as `****`; and
//! every bad definition or input refused naming its field, changing nothing. Real dispatcher,
//! workers, broker and Redis; the model is scripted.

use serde_json::{json, Value};

use fleet_tests::agent_events::{events_path, input, kinds, of_type};
use fleet_tests::fleet::redis_values_containing;
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::llm_fleet;
use fleet_tests::{spawn_fleet, Fleet, Receiver, Reply};

const SECRET: &str = "sk-crm-7f3a9c41e2b8d6";

/// A support agent in two steps: triage may hand off to billing, whose answers end with an invoice.
fn stepped_agent(name: &str) -> Value {
    json!({
        "name": name, "title": "Support", "instructions": "You are helpful.",
        "steps": {
            "triage": {"instructions": "TRIAGE: find out what the user needs.", "next_steps": ["billing"]},
            "billing": {"instructions": "BILLING: settle the bill.", "description": "money matters", "output_schema": "invoice"}
        },
        "first_step_name": "triage",
        "skills": {"refunds": {"description": "refund policy", "content": "REFUND POLICY: refunds take 5 days."}},
        "secrets": {"crm_key": SECRET},
        "output_schemas": {"invoice": {"type": "object", "properties": {"total": {"type": "number"}}, "required": ["total"]}},
        "transition_limit": 2
    })
}

async fn create(fleet: &Fleet, body: &Value) -> Value {
    let (status, resp) = fleet.post("/v1/agents/assistants", body).await;
    assert_eq!(status, 201, "{resp}");
    resp["data"].clone()
}

/// The system prompt of a model request.
fn system_of(body: &Value) -> String {
    body["messages"][0]["content"].as_str().unwrap_or_default().to_string()
}

fn tool_names(body: &Value) -> Vec<String> {
    body["tools"].as_array().into_iter().flatten().map(|t| t["function"]["name"].as_str().unwrap().to_string()).collect()
}

fn handoff(to: &str, message: &str) -> LlmReply {
    let arguments = json!({"step_name": to, "handoff_message": message}).to_string();
    LlmReply::ToolCalls(vec![("call_1".into(), "transition_to_step".into(), arguments)])
}

/// A model that hands off from triage to billing, then answers billing with an invoice (or, asked
/// for "bad invoice", with text that is not one).
fn support_model(body: &Value, _: usize) -> LlmReply {
    let system = system_of(body);
    let last_user = body["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "user").unwrap();
    let said = last_user["content"].as_str().unwrap_or_default().to_string();
    let answered_handoff = body["messages"].as_array().unwrap().last().is_some_and(|m| m["role"] == "tool");
    if system.contains("TRIAGE") && !answered_handoff {
        return handoff("billing", "The user wants their invoice.");
    }
    if said.contains("bad invoice") {
        return LlmReply::text("I cannot say.");
    }
    LlmReply::text("{\"total\": 42.5}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_hand_off_and_the_session_stays_in_its_step_with_checked_structured_output() {
    let llm = MockLlm::start(support_model).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    create(&fleet, &stepped_agent("support")).await;

    let (status, resp) = fleet.post(&events_path("support", "s1"), &input("Where is my invoice?")).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(kinds(&resp), ["input_message", "step_transition", "structured_output", "agent_output"], "{resp}");
    let transition = of_type(&resp, "step_transition")[0];
    assert_eq!(
        (&transition["from_step"], &transition["to_step"], &transition["content"]),
        (&json!("triage"), &json!("billing"), &json!("The user wants their invoice.")),
        "{transition}"
    );
    let structured = of_type(&resp, "structured_output")[0];
    assert_eq!((&structured["schema_name"], &structured["content"]), (&json!("invoice"), &json!({"total": 42.5})));
    println!("steps: {}", serde_json::to_string(&resp["events"]).unwrap());

    // The first call was triage's (with the handoff tool), the second billing's (with its schema).
    let calls = llm.requests();
    assert!(system_of(&calls[0].body).contains("## Current step: triage"), "{}", system_of(&calls[0].body));
    assert!(system_of(&calls[0].body).contains("- billing: money matters"));
    assert_eq!(tool_names(&calls[0].body), ["transition_to_step"]);
    assert!(calls[0].body.get("response_format").is_none(), "triage has no output schema");
    assert!(system_of(&calls[1].body).contains("## Current step: billing"));
    assert!(tool_names(&calls[1].body).is_empty(), "billing is final: no handoff");
    assert_eq!(calls[1].body["response_format"]["json_schema"]["name"], "invoice");

    // The session stays in billing: the next input starts there, and an answer that does not
    // match the schema ends with an error event naming it, never a silent pass.
    let (status, resp) = fleet.post(&events_path("support", "s1"), &input("bad invoice please")).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(kinds(&resp), ["input_message", "error", "agent_output"], "{resp}");
    let error = of_type(&resp, "error")[0];
    assert_eq!(error["code"], "structured_output_invalid", "{error}");
    assert!(error["messages"][0].as_str().unwrap().contains("output schema \"invoice\""), "{error}");
    assert!(system_of(&llm.requests()[2].body).contains("## Current step: billing"));

    // The session says which step it is in.
    let (status, shown) = fleet.get("/v2/agents/support/sessions/s1").await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!((&shown["current_step_name"], &shown["running"]), (&json!("billing"), &json!(false)), "{shown}");
    let (status, _) = fleet.get("/v2/agents/support/sessions/never_used").await;
    assert_eq!(status, 404);

    // `entry_step` enters a step before the input.
    let mut entered = input("Hello again");
    entered["entry_step"] = json!("triage");
    let (status, resp) = fleet.post(&events_path("support", "s1"), &entered).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(of_type(&resp, "step_transition")[0]["from_step"], "triage", "{resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_past_its_transition_limit_ends_with_the_limits_error() {
    // A model that never stops handing off between two steps.
    let llm = MockLlm::start(|body, _| {
        if system_of(body).contains("Current step: ping") {
            handoff("pong", "over")
        } else {
            handoff("ping", "back")
        }
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let body = json!({"name": "bouncer", "title": "B", "instructions": "Bounce.",
        "steps": {"ping": {"instructions": "ping", "next_steps": ["pong"]}, "pong": {"instructions": "pong", "next_steps": ["ping"]}},
        "first_step_name": "ping", "transition_limit": 2});
    create(&fleet, &body).await;
    let (status, resp) = fleet.post(&events_path("bouncer", "s1"), &input("go")).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(
        kinds(&resp),
        ["input_message", "step_transition", "step_transition", "transition_limit_exceeded"],
        "{resp}"
    );
    let limit = of_type(&resp, "transition_limit_exceeded")[0];
    assert_eq!(limit["transition_limit"], 2, "{limit}");
    assert!(limit["message"].as_str().unwrap().contains("transition_limit"), "{limit}");
    println!("limit: {limit}");
    assert_eq!(llm.requests().len(), 3, "the third handoff was not made");
    // The session is free again: the next input runs (and starts in the step the turn left it in).
    let mut next = input("again");
    next["behavior"] = json!("follow_up");
    let (status, _) = fleet.post(&events_path("bouncer", "s1"), &next).await;
    assert_eq!(status, 201);
    assert!(system_of(&llm.requests()[3].body).contains("Current step: ping"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_input_loads_its_content_and_the_event_records_it() {
    let llm = MockLlm::start(|_, _| LlmReply::text("{\"total\": 1}")).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    create(&fleet, &stepped_agent("skilled")).await;
    let body = json!({"type": "input", "entry_step": "billing", "messages": [
        {"type": "skill", "skill_name": "refunds"}, {"type": "text", "content": "Can I get my money back?"}]});
    let (status, resp) = fleet.post(&events_path("skilled", "s1"), &body).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(kinds(&resp)[..2], ["input_message", "skill_load"], "{resp}");
    assert_eq!(of_type(&resp, "input_message")[0]["messages"][0], json!({"type": "skill", "skill_name": "refunds"}));
    let loaded = of_type(&resp, "skill_load")[0];
    assert_eq!(
        (&loaded["skill_name"], &loaded["content"]),
        (&json!("refunds"), &json!("REFUND POLICY: refunds take 5 days."))
    );
    println!("skill: {loaded}");
    let seen = llm.requests()[0].contents();
    assert!(seen.iter().any(|c| c.contains("REFUND POLICY")), "the model read the skill: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_sealed_masked_and_bad_definitions_and_inputs_name_their_field() {
    let llm = MockLlm::start(|_, _| LlmReply::text("{\"total\": 1}")).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let created = create(&fleet, &stepped_agent("vault")).await;
    assert_eq!(created["secrets"], json!({"crm_key": "****"}), "{created}");
    assert_eq!(created["first_step_name"], "triage");
    let id = created["id"].as_str().unwrap().to_string();
    let (_, shown) = fleet.get(&format!("/v1/agents/assistants/{id}")).await;
    assert_eq!(shown["data"]["secrets"], json!({"crm_key": "****"}), "{shown}");
    // A secret is set by name and removed with null; the others stay.
    let (status, updated) =
        fleet.request(reqwest::Method::PUT, &format!("/v1/agents/assistants/{id}"), Some(&json!({"secrets": {"extra": "x-value-2"}}))).await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(updated["data"]["secrets"], json!({"crm_key": "****", "extra": "****"}));
    let (_, updated) = fleet.request(reqwest::Method::PUT, &format!("/v1/agents/assistants/{id}"), Some(&json!({"secrets": {"extra": null}}))).await;
    assert_eq!(updated["data"]["secrets"], json!({"crm_key": "****"}));

    let refused = [
        (json!({"first_step_name": "nowhere"}), "first_step_name \"nowhere\""),
        (json!({"steps": {"a": {"instructions": "x", "next_steps": ["b"]}}, "first_step_name": "a"}), "steps.a.next_steps[0]"),
        (json!({"output_schemas": {"invoice": {"type": "object"}, "bad": {"type": "object", "properties": {"q": {"type": 5}}}}}),
            "output_schemas.bad"),
        (json!({"tool_configurations": {"c": {"tool_name": "t", "argument_overrides": {"k": {"$ref": "secrets.missing"}}}}}),
            "tool_configurations.c.argument_overrides.k"),
        (json!({"transition_limit": 0}), "transition_limit"),
    ];
    for (change, field) in refused {
        let (status, resp) = fleet.request(reqwest::Method::PUT, &format!("/v1/agents/assistants/{id}"), Some(&change)).await;
        assert_eq!(status, 422, "{change}: {resp}");
        assert!(resp["error"]["message"].as_str().unwrap().contains(field), "{change}: {resp}");
    }
    let (_, unchanged) = fleet.get(&format!("/v1/agents/assistants/{id}")).await;
    assert_eq!(unchanged["data"]["version"], 3, "a refused update changed nothing: {unchanged}");

    let bad_inputs = [
        (json!({"type": "input", "entry_step": "nowhere", "messages": [{"type": "text", "content": "x"}]}), "entry_step \"nowhere\""),
        (json!({"type": "input", "messages": [{"type": "skill", "skill_name": "juggling"}]}), "messages[0].skill_name \"juggling\""),
    ];
    for (body, field) in bad_inputs {
        let (status, resp) = fleet.post(&events_path("vault", "s9"), &body).await;
        assert_eq!(status, 400, "{body}: {resp}");
        assert!(resp["error"]["message"].as_str().unwrap().contains(field), "{body}: {resp}");
    }
    let (status, resp) = fleet.post(&events_path("vault", "s1"), &input("hi")).await;
    assert_eq!(status, 201, "{resp}");

    // The secret's value is nowhere: not in Redis (only sealed), not in any answer, not in a log.
    assert_eq!(redis_values_containing(&fleet, SECRET).await, Vec::<String>::new());
    assert!(!resp.to_string().contains(SECRET));
    assert!(!fleet.logs().contains(SECRET), "a log line holds the secret");
}

/// Registers `crm` (run by the fleet: its owner echoes what it got) and `fetch` (client-executed).
async fn register_tools(fleet: &Fleet, crm: &Receiver) {
    let parameters = json!({"type": "object", "properties": {
        "query": {"type": "string"}, "region": {"type": "string"}, "account": {"type": "string"}, "ref": {"type": "string"},
        "auth": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}},
        "required": ["query", "auth"]});
    let tool = json!({"description": "the CRM", "parameters": parameters, "callback_url": crm.url("/crm"),
        "callback_secret": "whsec_test_crm_secret_000000000000"});
    let (status, resp) = fleet.request(reqwest::Method::PUT, "/v1/tools/crm", Some(&tool)).await;
    assert!(status == 200 || status == 201, "{resp}");
    let client = json!({"description": "fetch on the device", "execution": "client",
        "parameters": {"type": "object", "properties": {"url": {"type": "string"}, "token": {"type": "string"}}}});
    let (status, resp) = fleet.request(reqwest::Method::PUT, "/v1/tools/fetch", Some(&client)).await;
    assert!(status == 200 || status == 201, "{resp}");
}

/// A model that looks up the CRM, follows up on the record it found, has the client fetch, then
/// answers.
fn configured_model(body: &Value, n: usize) -> LlmReply {
    let call = |name: &str, args: Value| LlmReply::ToolCalls(vec![(format!("call_{n}"), name.into(), args.to_string())]);
    let _ = body;
    match n {
        0 => call("crm_lookup", json!({"query": "who is A-17?"})),
        1 => call("crm_follow", json!({"query": "their orders"})),
        2 => call("fetcher", json!({"url": "https://device.local/file"})),
        _ => LlmReply::text("done"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_configurations_fill_overrides_from_secrets_metadata_and_prior_outputs() {
    let llm = MockLlm::start(configured_model).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    // The CRM echoes what it got (the secret included): the fleet must keep none of it.
    let crm = Receiver::start("whsec_test_crm_secret_000000000000", |r, _| {
        Reply::result(json!({"id": "rec-9", "got": r.json["parameters"].clone()}))
    })
    .await;
    register_tools(&fleet, &crm).await;
    let agent = json!({"name": "crm_agent", "title": "CRM", "instructions": "Use the CRM.",
        "secrets": {"crm_key": SECRET},
        "tool_configurations": {
            "crm_lookup": {"tool_name": "crm", "description": "Look a customer up", "argument_overrides": {
                "auth.key": {"$ref": "secrets.crm_key"}, "region": "eu", "account": {"$ref": "metadata.account_id"}}},
            "crm_follow": {"tool_name": "crm", "argument_overrides": {
                "auth.key": {"$ref": "secrets.crm_key"}, "ref": {"$ref": "tool_outputs.crm_lookup.id"}}},
            "fetcher": {"tool_name": "fetch", "argument_overrides": {"token": {"$ref": "secrets.crm_key"}}}
        }});
    let created = create(&fleet, &agent).await;
    let (status, room) = fleet
        .post(&format!("/v1/agents/{}/rooms", created["id"].as_str().unwrap()), &json!({"metadata": {"account_id": "A-17"}}))
        .await;
    assert_eq!(status, 201, "{room}");
    let session = room["data"]["id"].as_str().or(room["id"].as_str()).unwrap().to_string();
    let tap = fleet_tests::tap::JobTap::start(&fleet).await;

    let (status, resp) = fleet.post(&events_path("crm_agent", &session), &input("Look up my account")).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(
        kinds(&resp),
        ["input_message", "tool_input", "tool_output", "tool_input", "tool_output", "tool_input", "client_tool_pending"],
        "{resp}"
    );
    // The model saw each configuration as a tool, without the overridden arguments.
    let specs = llm.requests()[0].body["tools"].clone();
    let lookup = specs.as_array().unwrap().iter().find(|t| t["function"]["name"] == "crm_lookup").unwrap();
    assert_eq!(lookup["function"]["parameters"]["required"], json!(["query"]), "{lookup}");
    assert!(lookup["function"]["parameters"]["properties"].get("auth").is_none(), "an object left empty goes: {lookup}");
    assert!(lookup["function"]["parameters"]["properties"].get("region").is_none());

    let inputs = of_type(&resp, "tool_input");
    assert_eq!(
        (&inputs[0]["tool_configuration_name"], &inputs[0]["tool_name"], &inputs[0]["tool_input"]),
        (&json!("crm_lookup"), &json!("crm"), &json!({"query": "who is A-17?"}))
    );
    assert_eq!(inputs[0]["argument_override_paths"], json!(["account", "auth.key", "region"]));
    let outputs = of_type(&resp, "tool_output");
    assert_eq!(
        outputs[0]["resolved_argument_overrides"],
        json!({"account": "A-17", "auth.key": "****", "region": "eu"}),
        "{}",
        outputs[0]
    );
    assert_eq!(outputs[1]["resolved_argument_overrides"], json!({"auth.key": "****", "ref": "rec-9"}));
    println!("tool_input: {}\ntool_output: {}", inputs[0], outputs[0]);

    // The tool got the overrides laid over the model's arguments, the secret itself included.
    let got: Vec<Value> = crm.received().iter().map(|r| r.json["parameters"].clone()).collect();
    assert_eq!(got[0], json!({"query": "who is A-17?", "region": "eu", "account": "A-17", "auth": {"key": SECRET}}));
    assert_eq!(got[1], json!({"query": "their orders", "ref": "rec-9", "auth": {"key": SECRET}}));

    // The client gets its call's arguments unmasked: it must run the tool with them.
    let pending = &of_type(&resp, "client_tool_pending")[0]["pending_calls"][0];
    assert_eq!(
        (&pending["tool_configuration_name"], &pending["tool_name"]),
        (&json!("fetcher"), &json!("fetch")),
        "{pending}"
    );
    assert_eq!(pending["arguments"], json!({"url": "https://device.local/file", "token": SECRET}));
    let answer = json!({"type": "tool_output", "tool_outputs": [
        {"event_id": pending["event_id"], "type": "success", "output": {"bytes": 12}}]});
    let (status, resp) = fleet.post(&events_path("crm_agent", &session), &answer).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(kinds(&resp), ["tool_output", "agent_output"], "{resp}");
    assert_eq!(of_type(&resp, "tool_output")[0]["resolved_argument_overrides"], json!({"token": "****"}));

    // No job carried it: a configured call's job names its configuration, not its values.
    let jobs = tap.seen().await;
    assert!(jobs.iter().any(|j| j.kind() == "tool_call"), "the tap saw the calls' jobs");
    for job in &jobs {
        assert!(!job.json.to_string().contains(SECRET), "a {} job held the secret", job.kind());
    }
    // The model never read the secret; the fleet keeps it only sealed, logs it nowhere.
    for request in llm.requests() {
        assert!(!request.body.to_string().contains(SECRET), "a model request held the secret");
    }
    assert_eq!(redis_values_containing(&fleet, SECRET).await, Vec::<String>::new());
    assert!(!fleet.logs().contains(SECRET), "a log line holds the secret");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_tools_output_is_checked_against_its_output_schema() {
    let llm = MockLlm::start(|body, _| {
        let answered = body["messages"].as_array().unwrap().last().is_some_and(|m| m["role"] == "tool");
        if answered {
            LlmReply::text("measured")
        } else {
            LlmReply::ToolCalls(vec![("c1".into(), "measure".into(), "{}".into())])
        }
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let tool = json!({"description": "measure on the device", "execution": "client",
        "output_schema": {"type": "object", "properties": {"cm": {"type": "number"}}, "required": ["cm"]}});
    let (status, resp) = fleet.request(reqwest::Method::PUT, "/v1/tools/measure", Some(&tool)).await;
    assert!(status == 200 || status == 201, "{resp}");
    assert_eq!(resp["data"]["output_schema"]["required"], json!(["cm"]), "{resp}");
    let bad_schema = json!({"execution": "client", "output_schema": {"type": "strnig"}});
    let (status, resp) = fleet.request(reqwest::Method::PUT, "/v1/tools/broken", Some(&bad_schema)).await;
    assert_eq!(status, 422, "{resp}");
    assert!(resp["error"]["message"].as_str().unwrap().starts_with("output_schema"), "{resp}");
    create(&fleet, &json!({"name": "measurer", "title": "M", "instructions": "Measure.", "enabled_tools": ["measure"]}))
        .await;

    let (status, resp) = fleet.post(&events_path("measurer", "s1"), &input("how long?")).await;
    assert_eq!(status, 201, "{resp}");
    let event_id = of_type(&resp, "client_tool_pending")[0]["pending_calls"][0]["event_id"].clone();
    let output = |v: Value| json!({"type": "tool_output", "tool_outputs": [{"event_id": event_id, "type": "success", "output": v}]});
    let (status, resp) = fleet.post(&events_path("measurer", "s1"), &output(json!({"cm": "long"}))).await;
    assert_eq!(status, 400, "{resp}");
    assert!(resp["error"]["message"].as_str().unwrap().contains("tool_outputs[0].output"), "{resp}");
    // Refused, it recorded nothing: the right output is still taken.
    let (status, resp) = fleet.post(&events_path("measurer", "s1"), &output(json!({"cm": 12.5}))).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(kinds(&resp), ["tool_output", "agent_output"], "{resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rooms_messages_run_the_same_agent_with_its_steps_and_schema() {
    let llm = MockLlm::start(support_model).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let created = create(&fleet, &stepped_agent("room_support")).await;
    let id = created["id"].as_str().unwrap();
    let (status, room) = fleet.post(&format!("/v1/agents/{id}/rooms"), &json!({"namespace": "user_1"})).await;
    assert_eq!(status, 201, "{room}");
    let room_id = room["data"]["id"].as_str().unwrap().to_string();

    // A seed 000 message to the room: the turn hands off and answers under billing's schema.
    let (status, sent) = fleet
        .post(&format!("/v1/agents/rooms/{room_id}/messages"), &json!({"content": "my invoice?", "role": "user"}))
        .await;
    assert_eq!(status, 201, "{sent}");
    let answered = fleet_tests::wait_for("the room's answer", std::time::Duration::from_secs(20), || async {
        let (_, page) = fleet.get(&format!("/v1/agents/rooms/{room_id}/messages?order=asc&limit=10")).await;
        let messages = page["data"]["messages"].as_array().cloned().unwrap_or_default();
        messages.into_iter().find(|m| m["role"] == "assistant" && m["content"] == "{\"total\": 42.5}")
    })
    .await;
    assert_eq!(answered["role"], "assistant");
    let calls = llm.requests();
    assert!(system_of(&calls[0].body).contains("## Current step: triage"));
    assert_eq!(calls[1].body["response_format"]["json_schema"]["name"], "invoice");
    // The room is a session of the agent: seed 001 sees the same events and step.
    let mut since = input("and now?");
    since["since"] = json!("start");
    let (status, resp) = fleet.post(&events_path("room_support", &room_id), &since).await;
    assert_eq!(status, 201, "{resp}");
    let transitions = of_type(&resp, "step_transition");
    assert_eq!(transitions.len(), 1, "{resp}");
    assert_eq!(of_type(&resp, "structured_output").len(), 2, "{resp}");
}
