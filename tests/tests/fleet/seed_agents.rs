//! A client written from seed 000 works by changing only its base URL: the seed's own examples
//! (`tests/seeds/000/`: its Quick Start and Steps in bash with curl and jq, its pagination loop in
//! Node.js, its Python tool-callback verifier) run as separate processes against a real
//! dispatcher and worker, the real broker and Redis, and a scripted model. Also: an assistant's
//! update reaches only the messages sent after it, and the refusals (404, 409, 422, 405) in the
//! API's JSON error shape.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::seed::{self, steps, Running};
use fleet_tests::turn::llm_fleet;
use fleet_tests::{spawn_fleet, wait_for, Fleet, Receiver, Reply};

const REPLY: &str = "Hello! How can I help you today?";
const MINUTE: Duration = Duration::from_secs(60);

/// A fleet with one worker whose model answers every turn with `REPLY`.
async fn replying_fleet() -> (MockLlm, Fleet) {
    let llm = MockLlm::start(|_, _| LlmReply::text(REPLY)).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    (llm, fleet)
}

fn data<'a>(v: &'a Value, field: &str) -> &'a str {
    v["data"][field].as_str().unwrap_or_else(|| panic!("data.{field} in {v}"))
}

/// Creates an assistant through the API; its id.
async fn assistant(fleet: &Fleet, body: Value) -> String {
    let (status, a) = fleet.post("/v1/agents/assistants", &body).await;
    assert_eq!(status, 201, "{a}");
    data(&a, "id").to_string()
}

async fn room(fleet: &Fleet, assistant_id: &str, body: Value) -> String {
    let (status, r) = fleet.post(&format!("/v1/agents/{assistant_id}/rooms"), &body).await;
    assert_eq!(status, 201, "{r}");
    data(&r, "id").to_string()
}

/// Sends a user message; the stored message.
async fn send(fleet: &Fleet, room_id: &str, content: &str) -> Value {
    let (status, m) =
        fleet.post(&format!("/v1/agents/rooms/{room_id}/messages"), &json!({"content": content, "role": "user"})).await;
    assert_eq!(status, 201, "{m}");
    m["data"].clone()
}

/// Every message of the room, oldest first.
async fn messages(fleet: &Fleet, room_id: &str) -> Vec<Value> {
    let (status, page) = fleet.get(&format!("/v1/agents/rooms/{room_id}/messages?order=asc&limit=100")).await;
    assert_eq!(status, 200, "{page}");
    page["data"]["messages"].as_array().unwrap().clone()
}

fn is_rfc3339(v: &Value) -> bool {
    v.as_str().and_then(fleet_protocol::timefmt::millis_from_rfc3339).is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_start_runs_as_written() {
    let (_llm, fleet) = replying_fleet().await;
    let (code, out, err) = seed::output(seed::bash("quick-start.sh", &seed::base_env(&fleet)), MINUTE).await;
    println!("the Quick Start printed:\n{out}");
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    let assistant_id = lines[0].strip_prefix("Created assistant: ").expect("the first echo");
    let room_id = lines[1].strip_prefix("Created room: ").expect("the second echo");
    assert!(fleet_protocol::agents::is_id("asst_", assistant_id), "{assistant_id}");
    assert!(fleet_protocol::agents::is_id("room_", room_id), "{room_id}");
    // Step 3's answer: the stored user message, at once.
    let sent: Value = serde_json::from_str(lines[2]).expect("the message as JSON");
    let message = &sent["data"];
    assert_eq!((message["role"].as_str(), message["content"].as_str()), (Some("user"), Some("Hello!")));
    assert!(message["id"].as_str().unwrap().starts_with("msg_"), "{sent}");
    assert!(is_rfc3339(&message["created_at"]), "{sent}");
    // It is listed at once, and the assistant's reply follows it.
    let listed = messages(&fleet, room_id).await;
    assert_eq!(listed[0]["id"], message["id"], "{listed:?}");
    let execution_id = message["execution_id"].as_str().expect("the turn's execution id");
    fleet.wait_status(execution_id, "succeeded", MINUTE).await;
    let listed = messages(&fleet, room_id).await;
    let said: Vec<(&str, &str)> =
        listed.iter().map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap())).collect();
    assert_eq!(said, [("user", "Hello!"), ("assistant", REPLY)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_steps_run_as_the_seed_shows_them() {
    let (_llm, fleet) = replying_fleet().await;
    let mut script = Running::start(seed::bash("steps.sh", &seed::base_env(&fleet)));
    let waiting = script.until(MINUTE, |l| l.starts_with("## waiting for ")).await;
    let execution_id = waiting.strip_prefix("## waiting for ").unwrap().to_string();
    fleet.wait_status(&execution_id, "succeeded", MINUTE).await;
    script.send_line("").await;
    let code = script.to_end(MINUTE).await;
    let out = script.seen.join("\n");
    println!("the Steps printed:\n{out}");
    assert_eq!(code, 0);
    let steps = steps(&script.seen);
    let step = |title: &str| steps.iter().find(|s| s.title == title).unwrap_or_else(|| panic!("step {title}"));
    let answer = |title: &str, status: u16| {
        let s = step(title);
        assert_eq!(s.status, status, "{title}: {}", s.body);
        &s.body
    };

    // Step 1 as written enables tools no one registered: 422 naming them.
    let refused = answer("1 create assistant (its tools are not registered yet)", 422);
    assert_eq!(refused["error"]["code"], "unknown_tool");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("\"search_knowledge_base\"") && message.contains("\"create_ticket\""), "{message}");

    let tool = &answer("2 register a tool", 201)["data"];
    assert!(fleet_protocol::tools::is_tool_id(tool["id"].as_str().unwrap()), "{tool}");
    assert_eq!(tool["name"], "search_products");
    assert_eq!(tool["description"], "Search the product catalog by query and optional category");
    assert!(is_rfc3339(&tool["created_at"]));
    assert_eq!(answer("2 register it again", 409)["error"]["code"], "tool_exists");
    answer("2 register search_knowledge_base", 201);
    answer("2 register create_ticket", 201);

    // The seed's response, field by field.
    let created = &answer("1 create assistant", 201)["data"];
    let id = created["id"].as_str().unwrap();
    assert!(fleet_protocol::agents::is_id("asst_", id), "{created}");
    assert_eq!(created["name"], "support_assistant");
    assert_eq!(created["title"], "Support Assistant");
    assert_eq!(created["description"], "Helps users with support questions");
    assert_eq!(created["model_config"], json!({"provider": "openai", "model": "gpt-4o", "temperature": 0.7}));
    assert_eq!(created["enabled_tools"], json!(["search_knowledge_base", "create_ticket"]));
    assert!(is_rfc3339(&created["created_at"]));
    let listed = &answer("list assistants", 200)["data"]["assistants"];
    assert_eq!(listed.as_array().unwrap().iter().map(|a| &a["id"]).collect::<Vec<_>>(), [&created["id"]]);
    assert_eq!(&answer("get assistant", 200)["data"], created);
    let updated = &answer("update assistant", 200)["data"];
    assert_eq!(updated["instructions"], "Updated instructions with more detail...");
    assert_eq!(updated["model_config"], json!({"provider": "openai", "model": "gpt-4o", "temperature": 0.5}));
    assert_eq!((updated["version"].as_u64(), created["version"].as_u64()), (Some(2), Some(1)));
    assert_eq!(updated["created_at"], created["created_at"]);

    let room = &answer("4 create a room", 201)["data"];
    let room_id = room["id"].as_str().unwrap();
    assert!(fleet_protocol::agents::is_id("room_", room_id), "{room}");
    assert_eq!((room["assistant_id"].as_str(), room["namespace"].as_str()), (Some(id), Some("user_123")));
    assert_eq!(room["status"], "active");
    assert_eq!(room["metadata"], json!({"user_name": "John", "context": "billing_question", "plan": "premium"}));
    assert!(is_rfc3339(&room["created_at"]));
    for title in ["list rooms", "list active rooms for a user"] {
        let rooms = &answer(title, 200)["data"]["rooms"];
        assert_eq!(rooms.as_array().unwrap().iter().map(|r| &r["id"]).collect::<Vec<_>>(), [&room["id"]], "{title}");
    }

    let sent = &answer("5 send a message", 201)["data"];
    assert_eq!((sent["role"].as_str(), sent["execution_id"].as_str()), (Some("user"), Some(execution_id.as_str())));
    assert_eq!(sent["content"], "How do I update my billing information?");
    let page = &answer("list messages", 200)["data"];
    let said: Vec<(&str, &str)> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    assert_eq!(said, [("assistant", REPLY), ("user", "How do I update my billing information?")], "newest first");
    assert_eq!((page["has_more"].as_bool(), page["next_cursor"].is_null()), (Some(false), true));
    assert_eq!(page["messages"][0]["tool_calls"], json!([]), "the seed's assistant message has tool_calls");
    let got = &answer("get room", 200)["data"];
    assert_eq!(got["message_count"], 2);
    assert_eq!(got["last_message_at"], page["messages"][0]["created_at"]);
    assert_eq!(got["metadata"], room["metadata"]);

    let closed = &answer("close room", 200)["data"];
    assert_eq!(closed["status"], "closed");
    assert_eq!(&answer("close room again", 200)["data"]["closed_at"], &closed["closed_at"], "closing is idempotent");
    let refused = answer("send a message to the closed room", 409);
    assert_eq!(refused["error"]["code"], "room_closed");
    let history = &answer("list messages of the closed room", 200)["data"]["messages"];
    assert_eq!(history.as_array().unwrap().len(), 2, "a closed room's history stays readable");
    assert_eq!(history[0]["role"], "user");
    let rooms = &answer("list closed rooms for a user", 200)["data"]["rooms"];
    assert_eq!(rooms.as_array().unwrap().iter().map(|r| &r["id"]).collect::<Vec<_>>(), [&room["id"]]);

    assert_eq!(answer("list tools", 200)["data"].as_array().unwrap().len(), 3);
    assert_eq!(answer("get tool", 200)["data"]["name"], "search_products", "a tool by its id");
    let changed = &answer("update tool", 200)["data"];
    assert_eq!(changed["description"], "Updated description with more detail");
    assert_eq!(changed["callback_url"], "https://yourapp.com/api/v2/tools/search_products");
    answer("delete tool", 204);
    let deleted = &answer("delete assistant", 200)["data"];
    assert_eq!((deleted["deleted"].as_bool(), deleted["rooms_closed"].as_u64()), (Some(true), Some(0)));
    assert_eq!(answer("get deleted assistant", 404)["error"]["code"], "not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pagination_loop_reads_every_message_of_a_long_room() {
    let (_llm, fleet) = replying_fleet().await;
    let assistant_id =
        assistant(&fleet, json!({"name": "pager", "title": "Pager", "instructions": "Answer briefly."})).await;
    let room_id = room(&fleet, &assistant_id, json!({"namespace": "user_123"})).await;
    // 55 messages, each answered: 110 messages, more than one page of 100.
    let mut last = None;
    for i in 0..55 {
        last = Some(send(&fleet, &room_id, &format!("message {i}")).await);
    }
    let last = last.unwrap();
    fleet.wait_status(last["execution_id"].as_str().unwrap(), "succeeded", Duration::from_secs(120)).await;
    let (_, got) = fleet.get(&format!("/v1/agents/rooms/{room_id}")).await;
    assert_eq!(got["data"]["message_count"], 110, "{got}");

    let mut env = seed::base_env(&fleet);
    env.push(("ROOM_ID".into(), room_id.clone()));
    let (code, out, err) = seed::output(seed::node("get-all-messages.mjs", &env), MINUTE).await;
    assert_eq!(code, 0, "{err}");
    let fetched: Value = serde_json::from_str(out.trim()).expect("one JSON line");
    println!("getAllMessages fetched {} messages", fetched["count"]);
    assert_eq!(fetched["count"], 110);
    let ids: Vec<&str> = fetched["ids"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    let distinct: std::collections::HashSet<&&str> = ids.iter().collect();
    assert_eq!(distinct.len(), 110, "no message twice");
    // Newest first, as the listing's default order; the oldest is the first message sent.
    let (_, newest) = fleet.get(&format!("/v1/agents/rooms/{room_id}/messages?limit=1")).await;
    assert_eq!(ids[0], newest["data"]["messages"][0]["id"].as_str().unwrap());
    assert_eq!(fetched["roles"][0], "assistant");
    assert_eq!(fetched["roles"][109], "user");
    let (_, oldest) = fleet.get(&format!("/v1/agents/rooms/{room_id}/messages?limit=1&order=asc")).await;
    assert_eq!(oldest["data"]["messages"][0]["content"], "message 0");
    assert_eq!(ids[109], oldest["data"]["messages"][0]["id"].as_str().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_python_verifier_takes_a_rooms_tool_call() {
    let llm = MockLlm::start(|_, n| match n {
        0 => LlmReply::ToolCalls(vec![(
            "call_1".into(),
            "search_products".into(),
            r#"{"query":"laptop","category":"electronics","max_results":5}"#.into(),
        )]),
        _ => LlmReply::text("The MacBook Pro 14\" and the Dell XPS 15 are in stock."),
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let secret = "your_webhook_secret_here";
    let port = fleet_tests::free_port();
    let env = vec![("TOOL_CALLBACK_SECRET".to_string(), secret.to_string()), ("PORT".to_string(), port.to_string())];
    let mut owner = Running::start(seed::python("tool-owner.py", &env));
    let http = reqwest::Client::new();
    wait_for("the Flask tool owner to listen", MINUTE, || {
        let http = http.clone();
        async move { http.get(format!("http://127.0.0.1:{port}/")).send().await.ok().map(|_| ()) }
    })
    .await;

    // Step 2's registration, with the Python server as the callback URL.
    let (status, tool) = fleet
        .post(
            "/v1/tools",
            &json!({
                "name": "search_products",
                "description": "Search the product catalog by query and optional category",
                "parameters": {"type": "object", "properties": {
                    "query": {"type": "string", "description": "Search query for product names or descriptions"},
                    "category": {"type": "string", "enum": ["electronics", "clothing", "home", "sports"]},
                    "max_results": {"type": "integer", "default": 10}
                }, "required": ["query"]},
                "callback_url": format!("http://127.0.0.1:{port}/api/tools/search_products"),
                "callback_secret": secret,
            }),
        )
        .await;
    assert_eq!(status, 201, "{tool}");
    let assistant_id = assistant(
        &fleet,
        json!({"name": "shop", "title": "Shop", "instructions": "Help the user shop.", "enabled_tools": ["search_products"]}),
    )
    .await;
    let room_id = room(&fleet, &assistant_id, json!({"namespace": "user_123"})).await;
    let sent = send(&fleet, &room_id, "Find me a laptop").await;
    fleet.wait_status(sent["execution_id"].as_str().unwrap(), "succeeded", MINUTE).await;
    let handled = owner.until(MINUTE, |l| l.starts_with("verified ") || l.starts_with("rejected ")).await;
    println!("the seed's Python tool owner printed: {handled}");
    assert!(handled.starts_with("verified exec_"), "{handled}");
    assert!(handled.contains(&format!("room={room_id} assistant={assistant_id}")), "{handled}");
    owner.stop().await;

    // The room shows each message as it was made: the call, its result, the answer.
    let listed = messages(&fleet, &room_id).await;
    let roles: Vec<&str> = listed.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"], "{listed:?}");
    assert_eq!(listed[1]["tool_calls"][0]["tool_name"], "search_products");
    assert!(listed[2]["content"].as_str().unwrap().contains("MacBook Pro"), "{}", listed[2]);
    assert!(llm.requests()[1].contents().iter().any(|c| c.contains("Dell XPS 15")), "the model read the result");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assistants_update_reaches_only_messages_sent_after_it() {
    let llm = MockLlm::start(|body, _| {
        let last = body["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
        match (last["role"].as_str(), last["content"].as_str()) {
            (Some("user"), Some("look it up")) => {
                LlmReply::ToolCalls(vec![("call_1".into(), "lookup".into(), r#"{"query":"x"}"#.into())])
            }
            _ => LlmReply::text("Done."),
        }
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    // The tool owner's answer is held (by a proxy in front of it) until the test has updated the
    // assistant.
    let receiver = Receiver::start("0123456789abcdef0123", |_, _| Reply::result(json!({"found": true}))).await;
    let held = fleet_tests::proxy::Proxy::start(receiver.addr).await;
    fleet.register_tool("lookup", &format!("http://{}/lookup", held.addr), "0123456789abcdef0123").await;
    held.freeze_replies();
    let assistant_id = assistant(
        &fleet,
        json!({"name": "versioned", "title": "V", "instructions": "Old instructions.", "enabled_tools": ["lookup"]}),
    )
    .await;
    let room_id = room(&fleet, &assistant_id, json!({})).await;
    let first = send(&fleet, &room_id, "look it up").await;
    let queued = send(&fleet, &room_id, "and then?").await;
    wait_for("the tool call to reach its owner", MINUTE, || {
        let n = receiver.received().len();
        async move { (n >= 1).then_some(()) }
    })
    .await;
    // The first turn is between its rounds; the second waits its turn.
    let (status, updated) = fleet
        .request(
            Method::PUT,
            &format!("/v1/agents/assistants/{assistant_id}"),
            Some(&json!({"instructions": "New instructions."})),
        )
        .await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(updated["data"]["version"], 2);
    // A room is a session: a message sent with `steer` joins the running turn's next round.
    let (status, steer) = fleet
        .post(
            &format!("/v1/agents/rooms/{room_id}/messages"),
            &json!({"content": "in French, please", "behavior": "steer"}),
        )
        .await;
    assert_eq!(status, 201, "{steer}");
    held.thaw();
    fleet.wait_status(first["execution_id"].as_str().unwrap(), "succeeded", MINUTE).await;
    fleet.wait_status(queued["execution_id"].as_str().unwrap(), "succeeded", MINUTE).await;
    let after = send(&fleet, &room_id, "and now?").await;
    fleet.wait_status(after["execution_id"].as_str().unwrap(), "succeeded", MINUTE).await;

    let system = |r: &fleet_tests::llm::LlmRequest| r.messages()[0]["content"].as_str().unwrap_or("").to_string();
    let requests = llm.requests();
    let instructions: Vec<String> = requests.iter().map(system).collect();
    assert_eq!(
        instructions,
        ["Old instructions.", "Old instructions.", "Old instructions.", "New instructions."],
        "the first turn's two rounds and the message sent before the update keep version 1"
    );
    assert!(requests[1].contents().iter().any(|c| c == "in French, please"), "the steer joined round 1");
    fleet.wait_status(steer["data"]["execution_id"].as_str().unwrap(), "succeeded", MINUTE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_what_is_wrong_in_the_json_error_shape() {
    let fleet = spawn_fleet(fleet_tests::FleetOptions::default().workers(0)).await;
    let base = json!({"name": "helper", "title": "Helper", "instructions": "Help."});
    let id = assistant(&fleet, base.clone()).await;
    let error = |v: &Value| (v["error"]["code"].as_str().unwrap_or("").to_string(), v["error"]["message"].clone());

    // 409: a name names one assistant, on create and on rename.
    let (status, e) = fleet.post("/v1/agents/assistants", &base).await;
    assert_eq!((status, error(&e).0.as_str()), (409, "assistant_exists"), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains(&id), "{e}");
    let other = assistant(&fleet, json!({"name": "other", "title": "O", "instructions": "x"})).await;
    let (status, e) =
        fleet.request(Method::PUT, &format!("/v1/agents/assistants/{other}"), Some(&json!({"name": "helper"}))).await;
    assert_eq!((status, error(&e).0.as_str()), (409, "assistant_exists"), "{e}");

    // 422, naming the field.
    for (body, names) in [
        (json!({"name": "Helper2", "title": "T", "instructions": "x"}), "name"),
        (json!({"name": "h2", "instructions": "x"}), "title"),
        (json!({"name": "h2", "title": "T", "instructions": "x", "model_config": {"temperature": 1.5}}), "temperature"),
        (json!({"name": "h2", "title": "T", "instructions": "x", "model_config": {"provider": "nope"}}), "provider"),
        (json!({"name": "h2", "title": "T", "instructions": "x", "model_config": {"temprature": 1}}), "temprature"),
        (json!({"name": "h2", "title": "T", "instructions": "x", "enabled_tools": ["create_ticket"]}), "create_ticket"),
        (json!({"name": "h2", "title": "T", "instructions": "x", "id": "asst_mine"}), "id"),
    ] {
        let (status, e) = fleet.post("/v1/agents/assistants", &body).await;
        assert_eq!(status, 422, "{body}: {e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(names), "{body}: {e}");
    }
    // `POST /v1/turns` refuses an unregistered tool too (it used to drop it silently).
    let turn = fleet_tests::turn::turn_body("s_tools", "hi", &["create_ticket"]);
    let (status, e) = fleet.post("/v1/turns", &turn).await;
    assert_eq!((status, error(&e).0.as_str()), (422, "unknown_tool"), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("assistant.enabled_tools names a tool"), "{e}");

    // 404s.
    let nobody = "asst_00000000000000000000000000000000";
    let nowhere = "room_00000000000000000000000000000000";
    for (method, path) in [
        (Method::GET, format!("/v1/agents/assistants/{nobody}")),
        (Method::PUT, format!("/v1/agents/assistants/{nobody}")),
        (Method::DELETE, format!("/v1/agents/assistants/{nobody}")),
        (Method::GET, "/v1/agents/assistants/helper".to_string()),
        (Method::POST, format!("/v1/agents/{nobody}/rooms")),
        (Method::GET, format!("/v1/agents/rooms/{nowhere}")),
        (Method::POST, format!("/v1/agents/rooms/{nowhere}/close")),
        (Method::POST, format!("/v1/agents/rooms/{nowhere}/messages")),
        (Method::GET, format!("/v1/agents/rooms/{nowhere}/messages")),
        (Method::GET, format!("/v1/agents/rooms/{nowhere}/stream")),
        (Method::POST, format!("/v1/agents/rooms/{nowhere}/stream-token")),
    ] {
        let body = match (&method, path.ends_with("/messages"), path.ends_with("/rooms")) {
            (&Method::PUT, _, _) => Some(json!({"title": "T"})),
            (&Method::POST, true, _) => Some(json!({"content": "hi"})),
            (&Method::POST, _, true) => Some(json!({"namespace": "n"})),
            _ => None,
        };
        let (status, e) = fleet.request(method.clone(), &path, body.as_ref()).await;
        assert_eq!((status, error(&e).0.as_str()), (404, "not_found"), "{method} {path}: {e}");
    }

    // A message: only the user's role; an empty body is malformed.
    let room_id = room(&fleet, &id, json!({"namespace": "user_123"})).await;
    let path = format!("/v1/agents/rooms/{room_id}/messages");
    let (status, e) = fleet.post(&path, &json!({"content": "hi", "role": "assistant"})).await;
    assert_eq!(status, 422, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().starts_with("role"), "{e}");
    let (status, e) = fleet.post(&path, &json!({"role": "user"})).await;
    assert_eq!(status, 422, "{e}");

    // The same Idempotency-Key answers the same stored message.
    let keyed = |key: &'static str| {
        fleet
            .http
            .post(format!("{}{path}", fleet.api))
            .bearer_auth(&fleet.token)
            .header("Idempotency-Key", key)
            .json(&json!({"content": "once", "role": "user"}))
            .send()
    };
    let first = keyed("k-1").await.unwrap();
    assert_eq!(first.status(), 201);
    let first: Value = first.json().await.unwrap();
    let again = keyed("k-1").await.unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: Value = again.json().await.unwrap();
    assert_eq!(first, again, "the replay is the stored message");
    assert_eq!(messages(&fleet, &room_id).await.len(), 1, "sent once");

    // Deleting an assistant closes its rooms: they keep their history and refuse new messages.
    let (status, deleted) = fleet.request(Method::DELETE, &format!("/v1/agents/assistants/{id}"), None).await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["data"]["rooms_closed"], 1);
    let (_, r) = fleet.get(&format!("/v1/agents/rooms/{room_id}")).await;
    assert_eq!((r["data"]["status"].as_str(), r["data"]["message_count"].as_u64()), (Some("closed"), Some(1)));
    let (status, e) = fleet.post(&path, &json!({"content": "hi"})).await;
    assert_eq!((status, error(&e).0.as_str()), (409, "room_closed"), "{e}");

    // Listing filters: bad values are named.
    let (status, e) = fleet.get("/v1/agents/rooms?status=open").await;
    assert_eq!(status, 422, "{e}");
    let (status, e) = fleet.get("/v1/agents/assistants?limit=101").await;
    assert_eq!(status, 422, "{e}");

    // The framework's own refusals come in the same JSON shape: a method a route does not serve
    // (405, with Allow), a path that does not decode; what they echo is JSON, never a page.
    for (method, path, want) in [
        (Method::GET, "/v1/sessions/s1".to_string(), 405),
        (Method::DELETE, "/v1/agents/rooms".to_string(), 405),
        (Method::PATCH, format!("/v1/agents/assistants/{other}"), 405),
        (Method::GET, "/v1/agents/rooms/%FF".to_string(), 400),
        (Method::PUT, "/v1/sessions/%3Cscript%3Ealert(1)%3C%2Fscript%3E".to_string(), 405),
        (Method::GET, "/v1/agents/<script>alert(1)</script>".to_string(), 404),
    ] {
        let resp = fleet.http.request(method.clone(), format!("{}{path}", fleet.api)).bearer_auth(&fleet.token);
        let resp = resp.send().await.unwrap();
        let status = resp.status().as_u16();
        let allow = resp.headers().get("allow").map(|v| v.to_str().unwrap().to_string());
        assert_eq!(resp.headers()["content-type"], "application/json", "{method} {path}");
        assert_eq!(
            resp.headers()["x-content-type-options"],
            "nosniff",
            "{method} {path}: echoed input is never a page"
        );
        let body: Value = resp.json().await.unwrap();
        assert_eq!(status, want, "{method} {path}: {body}");
        assert!(body["error"]["code"].is_string() && body["error"]["message"].is_string(), "{body}");
        if want == 405 {
            assert_eq!(body["error"]["code"], "method_not_allowed");
            assert!(allow.is_some(), "{method} {path}: Allow is kept");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rooms_are_listed_by_each_filter_and_paged_with_a_cursor() {
    let fleet = spawn_fleet(fleet_tests::FleetOptions::default().workers(0)).await;
    let a = assistant(&fleet, json!({"name": "a", "title": "A", "instructions": "x"})).await;
    let b = assistant(&fleet, json!({"name": "b", "title": "B", "instructions": "x"})).await;
    // Five rooms, oldest first: (assistant, namespace).
    let plan = [(&a, "u1"), (&b, "u1"), (&a, "u2"), (&a, "u1"), (&b, "u2")];
    let mut ids = Vec::new();
    for (assistant_id, namespace) in plan {
        ids.push(room(&fleet, assistant_id, json!({"namespace": namespace})).await);
    }
    let (status, _) = fleet.post(&format!("/v1/agents/rooms/{}/close", ids[3]), &json!({})).await;
    assert_eq!(status, 200);
    let newest_first = |picked: &[usize]| -> Vec<String> { picked.iter().rev().map(|&i| ids[i].clone()).collect() };

    // Every page of a listing, following next_cursor.
    let list = |query: String| {
        let fleet = &fleet;
        async move {
            let mut all = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let filters = if query.is_empty() { String::new() } else { format!("{query}&") };
                let path = match &cursor {
                    None => format!("/v1/agents/rooms?{filters}limit=2"),
                    Some(c) => format!("/v1/agents/rooms?{filters}limit=2&cursor={c}"),
                };
                let (status, page) = fleet.get(&path).await;
                assert_eq!(status, 200, "{path}: {page}");
                let rooms = page["data"]["rooms"].as_array().unwrap();
                assert!(rooms.len() <= 2, "{page}");
                all.extend(rooms.iter().map(|r| r["id"].as_str().unwrap().to_string()));
                match page["data"]["next_cursor"].as_str() {
                    Some(c) => {
                        assert_eq!(page["data"]["has_more"], true);
                        cursor = Some(c.to_string());
                    }
                    None => return all,
                }
            }
        }
    };
    assert_eq!(list(String::new()).await, newest_first(&[0, 1, 2, 3, 4]));
    assert_eq!(list("namespace=u1".into()).await, newest_first(&[0, 1, 3]));
    assert_eq!(list(format!("assistant_id={a}")).await, newest_first(&[0, 2, 3]));
    assert_eq!(list("status=active".into()).await, newest_first(&[0, 1, 2, 4]));
    assert_eq!(list("status=closed".into()).await, newest_first(&[3]));
    assert_eq!(list("namespace=u1&status=active".into()).await, newest_first(&[0, 1]));
    assert_eq!(list(format!("assistant_id={b}&status=active")).await, newest_first(&[1, 4]));
    assert_eq!(list(format!("namespace=u1&assistant_id={a}")).await, newest_first(&[0, 3]));
    assert_eq!(list(format!("namespace=u2&assistant_id={a}&status=active")).await, newest_first(&[2]));
    assert!(list("namespace=nobody".into()).await.is_empty());

    // Assistants page the same way, newest first.
    let (_, page) = fleet.get("/v1/agents/assistants?limit=1").await;
    assert_eq!(page["data"]["assistants"][0]["id"], b.as_str());
    let cursor = page["data"]["next_cursor"].as_str().unwrap();
    let (_, page) = fleet.get(&format!("/v1/agents/assistants?limit=1&cursor={cursor}")).await;
    assert_eq!(page["data"]["assistants"][0]["id"], a.as_str());
    assert_eq!((page["data"]["has_more"].as_bool(), page["data"]["next_cursor"].is_null()), (Some(false), true));
}
