//! Tenant isolation on every route, as the scopes test walks them: acme (a bound token with every
//! scope) makes one of each resource (a turn's execution and session, an assistant, a room and its
//! messages, a seed 001 session, a dead letter, usage); then every operation of
//! docs/openapi.json is called with beta's bound token. A route about one of acme's resources
//! answers 404 (never 403, never acme's data), a listing never holds acme's items, the operator's
//! configuration answers 403 `operator_only` whoever asks about what, and the routes that only
//! make the caller's own work get through. A route the table does not classify fails the test.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use fleet_tests::console::ConsoleClient;
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, turn_body};
use fleet_tests::{spawn_fleet, Fleet, Receiver, Reply};

const SECRET: &str = "whsec_tenant_walk_0001";
const ADMIN: &str = "walk-admin-token-0123456789";
const ACME: &str = "walk-acme-token-0123456789";
const BETA: &str = "walk-beta-token-0123456789";
/// The services catalog the deployment ships as its example: the knowledge base's routes read it.
const EXAMPLE_CATALOG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/services-catalog.example.json");
/// An operator's token that may only look at the console.
const LOOKER: &str = "walk-looker-token-0123456789";

/// What beta's bound token gets on a route, asked about acme's resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// About one of acme's resources: 404 `not_found` (or the route's own not-found code).
    NotFound,
    /// A listing: 200, and none of acme's ids in it.
    Listed,
    /// A bulk operation naming acme's items: 200 with nothing done.
    NoneDone,
    /// The operator's configuration or log: 403 `operator_only`, whoever's it is about.
    OperatorOnly,
    /// Makes or reads only the caller's own or shared things: not refused (2xx).
    Own,
}

/// Every operation of docs/openapi.json and what beta gets on it, as the route declares it (its
/// `x-tenancy`); an operation that needs no token reads nothing of a tenant's (`Own`). A route
/// whose answers do not match what it declares fails below.
fn table() -> Vec<(Method, String, Expect)> {
    use fleet_dispatcher::scopes::TenantView;
    let mut ops = vec![];
    for fleet_tests::contract::Operation { method, path, op } in fleet_tests::contract::operations() {
        let declared = op[TenantView::EXTENSION].as_str().map(|v| TenantView::parse(v).ok_or(v));
        let expect = match declared {
            Some(Ok(TenantView::Resource)) => Expect::NotFound,
            Some(Ok(TenantView::Listing)) => Expect::Listed,
            Some(Ok(TenantView::Bulk)) => Expect::NoneDone,
            Some(Ok(TenantView::Operator)) => Expect::OperatorOnly,
            Some(Ok(TenantView::Own)) => Expect::Own,
            None if op["security"] == json!([{}]) => Expect::Own,
            other => panic!("{method} {path} declares no tenancy this walk knows: {other:?}"),
        };
        ops.push((method, path, expect));
    }
    ops
}

/// Acme's resources, by the path parameter that names them.
struct Acme {
    execution: String,
    session: String,
    assistant: String,
    assistant_name: String,
    room: String,
    seed_session: String,
    dead_letter: String,
    /// An artifact acme uploaded to its seed 001 session.
    artifact: String,
    /// A call of acme's turn waiting for an operator's decision.
    approval: String,
}

impl Acme {
    /// The path with acme's resources in it; for the seed 001 route, acme's agent and session.
    fn fill(&self, template: &str) -> String {
        let id: &str = if template.starts_with("/v1/dead-letters") {
            &self.dead_letter
        } else if template.starts_with("/v1/knowledge-base") {
            // The shared catalog's: no tenant's resource.
            "google_calendar"
        } else if template.starts_with("/v1/approvals") {
            &self.approval
        } else if template.starts_with("/v1/sessions") {
            &self.session
        } else {
            &self.execution
        };
        template
            .replace("{assistant_id}", &self.assistant)
            .replace("{room_id}", &self.room)
            .replace("{agent_key}", &self.assistant)
            .replace("{session_key}", &self.seed_session)
            .replace("{artifact_id}", &self.artifact)
            .replace("{tool}", "refuses")
            .replace("{id}", if template.starts_with("/v1/webhooks") { "w1" } else { id })
            + if template == "/v1/usage" { "?tenant=acme" } else { "" }
    }

    fn ids(&self) -> [&str; 8] {
        [
            &self.execution,
            &self.session,
            &self.assistant,
            &self.room,
            &self.seed_session,
            &self.dead_letter,
            &self.artifact,
            &self.approval,
        ]
    }

    /// A body that gets past parsing, about acme's resources where it names any.
    fn body(&self, method: &Method, template: &str) -> Option<Value> {
        let tool = json!({"name": "refuses", "callback_url": "http://127.0.0.1:9/x", "callback_secret": SECRET});
        Some(match (method.as_str(), template) {
            ("POST", "/v1/agents/assistants") => {
                // Acme's name: another tenant's assistant does not hold it for beta.
                json!({"name": self.assistant_name, "title": "Beta's", "instructions": "Help beta."})
            }
            ("PUT", "/v1/agents/assistants/{assistant_id}") => json!({"title": "Taken over"}),
            ("POST", "/v1/agents/rooms/{room_id}/messages") => json!({"content": "hi"}),
            ("POST", "/v1/agents/{assistant_id}/rooms") => json!({}),
            ("POST", "/v1/approvals/{id}") => json!({"decision": "deny", "reason": "beta's"}),
            ("POST", "/v1/dead-letters/purge" | "/v1/dead-letters/retry") => {
                json!({"execution_ids": [self.dead_letter]})
            }
            ("POST", "/v1/tool-calls") => json!({"tool_name": "refuses", "parameters": {"query": "q"}}),
            ("POST", "/v1/tool-calls/batch") => {
                json!({"calls": [{"tool_name": "refuses", "parameters": {"query": "q"}}]})
            }
            ("POST", "/v1/tools") | ("PUT", "/v1/tools/{tool}") => tool,
            ("POST", "/v1/turns") => turn_body(&self.session, "hi", &[]),
            ("POST", "/v1/knowledge-base/services/search") => json!({"query": "calendar scheduling", "limit": 5}),
            ("POST", "/v1/knowledge-base/services/lookup") => json!({"service_id": "google_calendar"}),
            ("PUT", "/v1/webhooks/{id}") => json!({"url": "http://127.0.0.1:9/h"}),
            ("POST", "/v2/agents/{agent_key}/sessions/{session_key}/events") => seed_input("hi"),
            _ => return None,
        })
    }
}

fn seed_input(text: &str) -> Value {
    json!({"type": "input", "messages": [{"type": "text", "content": text}]})
}

/// Makes one of each of acme's resources with acme's bound token, each finished.
async fn acme_resources(fleet: &Fleet) -> Acme {
    let timeout = Duration::from_secs(30);
    let ok = |what: &str, (status, body): (u16, Value), want: u16| {
        assert_eq!(status, want, "acme: {what}: {body}");
        body
    };
    let asst = json!({"name": "walk_helper", "title": "Helper", "instructions": "Help."});
    let asst = ok("assistant", fleet.request_as(ACME, &Method::POST, "/v1/agents/assistants", Some(&asst)).await, 201);
    let assistant = asst["data"]["id"].as_str().unwrap().to_string();
    let room_path = format!("/v1/agents/{assistant}/rooms");
    let room = ok("room", fleet.request_as(ACME, &Method::POST, &room_path, Some(&json!({}))).await, 201);
    let room = room["data"]["id"].as_str().unwrap().to_string();
    let hi = json!({"content": "hi"});
    let sent = fleet.request_as(ACME, &Method::POST, &format!("/v1/agents/rooms/{room}/messages"), Some(&hi)).await;
    let sent = ok("message", sent, 201);
    let turn = ok(
        "turn",
        fleet.request_as(ACME, &Method::POST, "/v1/turns", Some(&turn_body("s_walk", "hi", &[]))).await,
        202,
    );
    let execution = turn["data"]["execution_id"].as_str().unwrap().to_string();
    let seed = format!("/v2/agents/{assistant}/sessions/s_walk_seed/events");
    ok("seed 001 input", fleet.request_as(ACME, &Method::POST, &seed, Some(&seed_input("hello"))).await, 201);
    let artifact = upload_artifact(fleet, &format!("/v2/agents/{assistant}/sessions/s_walk_seed/artifacts")).await;
    let call = json!({"tool_name": "refuses", "parameters": {"query": "q"}});
    let called = ok("tool call", fleet.request_as(ACME, &Method::POST, "/v1/tool-calls", Some(&call)).await, 202);
    let dead_letter = called["data"]["execution_id"].as_str().unwrap().to_string();
    let guarded = turn_body("s_walk_guarded", "guarded", &["guarded"]);
    ok("guarded turn", fleet.request_as(ACME, &Method::POST, "/v1/turns", Some(&guarded)).await, 202);
    let approval = fleet_tests::wait_for("acme's approval", timeout, || async {
        let (_, listed) = fleet.request_as(ACME, &Method::GET, "/v1/approvals?status=pending", None).await;
        listed["data"][0]["id"].as_str().map(str::to_string)
    })
    .await;

    fleet.wait_status(&execution, "succeeded", timeout).await;
    fleet.wait_status(sent["data"]["execution_id"].as_str().unwrap(), "succeeded", timeout).await;
    fleet.wait_status(&dead_letter, "dead_lettered", timeout).await;
    fleet_tests::wait_for("acme's dead letter", timeout, || async {
        (fleet.request_as(ACME, &Method::GET, &format!("/v1/dead-letters/{dead_letter}"), None).await.0 == 200)
            .then_some(())
    })
    .await;
    Acme {
        execution,
        session: "s_walk".into(),
        assistant,
        assistant_name: "walk_helper".into(),
        room,
        seed_session: "s_walk_seed".into(),
        dead_letter,
        artifact,
        approval,
    }
}

/// Acme uploads a text file to its seed 001 session; its artifact id.
async fn upload_artifact(fleet: &Fleet, path: &str) -> String {
    let boundary = "walk-boundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"walk.txt\"\r\nContent-Type: text/plain\r\n\r\nacme's\r\n--{boundary}--\r\n"
    );
    let resp = fleet
        .http
        .post(format!("{}{path}", fleet.api))
        .bearer_auth(ACME)
        .header("content-type", format!("multipart/form-data; boundary={boundary}"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201, "acme: artifact upload");
    let answer: Value = resp.json().await.unwrap();
    answer["artifacts"][0]["artifact_id"].as_str().unwrap().to_string()
}

/// What is wrong with beta's answer on a route, if anything.
fn judge(expect: Expect, status: u16, body: &Value, acme: &Acme) -> Option<String> {
    let leaked = || acme.ids().into_iter().find(|id| body.to_string().contains(id));
    match expect {
        Expect::NotFound if status != 404 => Some(format!("{status}, not 404: {body}")),
        Expect::NotFound if !body["error"]["code"].as_str().is_some_and(|c| c.ends_with("not_found")) => {
            Some(format!("404 without a not-found code: {body}"))
        }
        Expect::Listed if status != 200 => Some(format!("{status}, not 200: {body}")),
        Expect::Listed => leaked().map(|id| format!("lists acme's {id}: {body}")),
        Expect::NoneDone if status != 200 || body["data"]["done"] != 0 => Some(format!("{status}: {body}")),
        Expect::OperatorOnly if status != 403 || body["error"]["code"] != "operator_only" => {
            Some(format!("{status}, not 403 operator_only: {body}"))
        }
        Expect::Own if !(200..300).contains(&status) => Some(format!("{status}: {body}")),
        Expect::Own => leaked().map(|id| format!("answers acme's {id}: {body}")),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_another_tenants_token_as_if_acmes_resources_did_not_exist() {
    // A turn asked "guarded" calls the tool that waits for an operator's approval (none is given).
    let llm = MockLlm::start(|body, _| {
        let asked = body["messages"].as_array().unwrap().iter().any(|m| m["content"] == "guarded");
        let answered = body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool");
        match asked && !answered {
            true => LlmReply::ToolCalls(vec![("call_g".into(), "guarded".into(), r#"{"query":"q"}"#.into())]),
            false => LlmReply::text("fine"),
        }
    })
    .await;
    // Every call is refused for good (404): each ends as a dead letter at once.
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(404)).await;
    let tokens = format!("{ADMIN},{ACME}@acme,{BETA}@beta,{LOOKER}:console:read");
    let options = llm_fleet(&llm).env("FLEET_API_TOKENS", &tokens).env("FLEET_SERVICES_CATALOG", EXAMPLE_CATALOG);
    let mut fleet = spawn_fleet(options).await;
    fleet.token = ADMIN.to_string();
    fleet.register_tool("refuses", &receiver.url("/refuses"), SECRET).await;
    fleet.register_tool("guarded", &receiver.url("/guarded"), SECRET).await;
    let guarded = json!({"requires_approval": true, "effects": ["write"]});
    assert_eq!(fleet.request(Method::PUT, "/v1/tools/guarded", Some(&guarded)).await.0, 200);
    let acme = acme_resources(&fleet).await;
    walk_the_console(&fleet, &acme).await;

    let table = table();
    assert!(table.len() > 40, "the documented operations: {}", table.len());
    let mut wrong = vec![];
    // The paths name acme's real resources: acme reads each (the changes use the same ids).
    for (method, template, _) in
        table.iter().filter(|(m, t, e)| *e == Expect::NotFound && (*m == Method::GET || t.ends_with("stream-token")))
    {
        let path = acme.fill(template);
        let (status, body) = fleet.request_as(ACME, method, &path, acme.body(method, template).as_ref()).await;
        assert!((200..300).contains(&status), "acme: {method} {path}: {status} {body}");
    }
    for (method, template, expect) in &table {
        let path = acme.fill(template);
        let (status, body) = fleet.request_as(BETA, method, &path, acme.body(method, template).as_ref()).await;
        if let Some(why) = judge(*expect, status, &body, &acme) {
            wrong.push(format!("beta: {method} {path} ({expect:?}): {why}"));
        }
    }
    // The other ways in: acme's usage by assistant or session; beta's agent on acme's session.
    for path in [
        format!("/v1/usage?assistant={}", acme.assistant),
        format!("/v1/usage?tenant=beta&assistant={}", acme.assistant),
        // A room is the fleet's id, one session; acme's other keys name beta's own sessions.
        format!("/v1/usage?session={}", acme.room),
        format!("/v1/usage?session={}&tenant=acme", acme.session),
    ] {
        let (status, body) = fleet.request_as(BETA, &Method::GET, &path, None).await;
        if let Some(why) = judge(Expect::NotFound, status, &body, &acme) {
            wrong.push(format!("beta: GET {path}: {why}"));
        }
    }
    let shared = json!({"name": "walk_shared", "title": "Shared", "instructions": "Help."});
    let (status, body) = fleet.request_as(ADMIN, &Method::POST, "/v1/agents/assistants", Some(&shared)).await;
    assert_eq!(status, 201, "{body}");
    let path = format!("/v2/agents/walk_shared/sessions/{}/events", acme.seed_session);
    // Acme's session key, for beta, names beta's own session of that key: its input runs there,
    // and its answer holds none of acme's session (acme's input there said "hello").
    let (status, body) = fleet.request_as(BETA, &Method::POST, &path, Some(&seed_input("hi"))).await;
    let text = body.to_string();
    if status != 201 || text.contains("hello") || text.contains(&acme.execution) || text.contains(&acme.room) {
        wrong.push(format!("beta: POST {path}: {status} {body}"));
    }
    assert!(wrong.is_empty(), "{} routes leak or are unclassified:\n{}", wrong.len(), wrong.join("\n"));

    // Nothing beta did changed acme's resources: acme still reads each of them as it was.
    for path in [
        format!("/v1/executions/{}", acme.execution),
        format!("/v1/sessions/{}/messages", acme.session),
        format!("/v1/agents/assistants/{}", acme.assistant),
        format!("/v1/agents/rooms/{}", acme.room),
        format!("/v1/dead-letters/{}", acme.dead_letter),
        format!("/v1/approvals/{}", acme.approval),
    ] {
        let (status, body) = fleet.request_as(ACME, &Method::GET, &path, None).await;
        assert_eq!(status, 200, "acme: GET {path}: {body}");
        assert_ne!(body["data"]["title"], "Taken over", "{body}");
        assert_ne!(body["data"]["status"], "closed", "{body}");
        assert_ne!(body["data"]["status"], "denied", "{body}");
    }
    let (_, messages) =
        fleet.request_as(ACME, &Method::GET, &format!("/v1/sessions/{}/messages", acme.session), None).await;
    assert_eq!(
        messages["data"]["messages"].as_array().map(Vec::len),
        Some(2),
        "the turn's exchange, no more: {messages}"
    );
    assert_eq!(
        llm.requests().len(),
        6,
        "acme's four turns (one waiting for its approval) and beta's two, in beta's own sessions of acme's keys"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_assistant_is_every_tenants_to_use_and_a_tenants_name_is_its_own() {
    let llm = MockLlm::start(|_, _| LlmReply::text("fine")).await;
    let tokens = format!("{ADMIN},{ACME}@acme,{BETA}@beta");
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_API_TOKENS", &tokens)).await;
    let create = |token: &'static str, instructions: &'static str| {
        let fleet = &fleet;
        async move {
            let body = json!({"name": "helper", "title": "Helper", "instructions": instructions});
            let (status, body) = fleet.request_as(token, &Method::POST, "/v1/agents/assistants", Some(&body)).await;
            assert_eq!(status, 201, "{body}");
            body["data"]["id"].as_str().unwrap().to_string()
        }
    };
    // The operator's `helper` and acme's own `helper`: names are unique per owner.
    let shared = create(ADMIN, "The operator's helper.").await;
    let own = create(ACME, "Acme's helper.").await;
    let (status, taken) = fleet
        .request_as(
            ACME,
            &Method::POST,
            "/v1/agents/assistants",
            Some(&json!({"name": "helper", "title": "T", "instructions": "I."})),
        )
        .await;
    assert_eq!((status, taken["error"]["code"].as_str()), (409, Some("assistant_exists")), "{taken}");

    // Beta sees the operator's (and uses it), may not change it, and never sees acme's.
    let path = format!("/v1/agents/assistants/{shared}");
    assert_eq!(fleet.request_as(BETA, &Method::GET, &path, None).await.0, 200);
    for (method, body) in [(Method::PUT, Some(json!({"title": "Beta's now"}))), (Method::DELETE, None)] {
        let (status, refused) = fleet.request_as(BETA, &method, &path, body.as_ref()).await;
        assert_eq!((status, refused["error"]["code"].as_str()), (403, Some("operator_only")), "{method}: {refused}");
    }
    let (_, listed) = fleet.request_as(BETA, &Method::GET, "/v1/agents/assistants", None).await;
    let ids: Vec<&str> =
        listed["data"]["assistants"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [shared.as_str()], "{listed}");
    let (_, listed) = fleet.request_as(ADMIN, &Method::GET, "/v1/agents/assistants", None).await;
    assert_eq!(listed["data"]["assistants"].as_array().unwrap().len(), 2, "the operator sees both: {listed}");
    let room = fleet.request_as(BETA, &Method::POST, &format!("/v1/agents/{shared}/rooms"), Some(&json!({}))).await;
    assert_eq!(room.0, 201, "{}", room.1);

    // By name, seed 001's agent key is the caller's own assistant, else the operator's.
    for (token, session, instructions) in
        [(ACME, "s_named_acme", "Acme's helper."), (BETA, "s_named_beta", "The operator's helper.")]
    {
        let path = format!("/v2/agents/helper/sessions/{session}/events");
        let (status, body) = fleet.request_as(token, &Method::POST, &path, Some(&seed_input("hi"))).await;
        assert_eq!(status, 201, "{body}");
        let asked = llm.requests().last().unwrap().contents();
        assert!(asked.iter().any(|c| c == instructions), "{token}'s turn ran with {asked:?}");
    }
    // Acme deletes its own; the operator's stays.
    let (status, body) = fleet.request_as(ACME, &Method::DELETE, &format!("/v1/agents/assistants/{own}"), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(fleet.request_as(ACME, &Method::GET, &path, None).await.0, 200);
}

/// The status a console route answers `client`, with `csrf` in a change's form.
async fn visit(client: &ConsoleClient, method: &str, path: &str, csrf: &str) -> u16 {
    match method {
        "GET" => client.get(path).await.0,
        _ => client.post(path, &[("csrf", csrf), ("confirm", "yes")]).await.0,
    }
}

/// Every console route as the dispatcher declares it, visited by both tenants, by no session, and
/// by a read-only operator: the console is the operators' alone, and only a session that may
/// change things changes anything.
async fn walk_the_console(fleet: &Fleet, acme: &Acme) {
    let routes = fleet_dispatcher::console_routes();
    assert!(routes.len() > 20, "the console's routes are declared: {routes:?}");
    for token in [ACME, BETA] {
        let tenant = ConsoleClient::login(&fleet.api, token, false).await;
        assert_eq!(tenant.status, 403, "a tenant's token is refused by the console");
        assert!(tenant.client.is_none());
    }
    let login = ConsoleClient::login(&fleet.api, LOOKER, false).await;
    let (status, looker) = (login.status, login.client.expect("the looker's session"));
    assert_eq!(status, 303, "an operator's console:read token logs in");
    let csrf = looker.csrf().await;
    let forged = "fleet_console=".to_string() + &"0".repeat(64);
    let nobody = ConsoleClient { http: looker.http.clone(), api: fleet.api.clone(), cookie: forged };
    let mut wrong = vec![];
    for route in routes {
        let path = route
            .path
            .replace("{id}", if route.path.contains("dead-letters") { &acme.dead_letter } else { &acme.execution })
            .replace("{name}", "refuses");
        if route.path.starts_with("/console/sessions/") {
            // A session's page names the session (the execution's id is no session's).
            continue;
        }
        let anonymous = visit(&nobody, route.method, &path, &csrf).await;
        if route.access == fleet_dispatcher::ConsoleAccess::Session {
            // Logging out would end the looker's session: only its refusal without one is walked.
            if anonymous != 303 {
                wrong.push(format!("{} {path} without a session: {anonymous}", route.method));
            }
            continue;
        }
        let looking = visit(&looker, route.method, &path, &csrf).await;
        let expected_for_nobody = match route.access {
            fleet_dispatcher::ConsoleAccess::Public => anonymous < 500,
            _ => anonymous == 303,
        };
        if !expected_for_nobody {
            wrong.push(format!("{} {path} ({:?}) without a session: {anonymous}", route.method, route.access));
        }
        let expected_for_looker = match route.access {
            fleet_dispatcher::ConsoleAccess::Change => looking == 403,
            fleet_dispatcher::ConsoleAccess::Page => looking != 303 && looking != 403 && looking < 500,
            fleet_dispatcher::ConsoleAccess::Public | fleet_dispatcher::ConsoleAccess::Session => true,
        };
        if !expected_for_looker {
            wrong.push(format!("{} {path} ({:?}) for a read-only operator: {looking}", route.method, route.access));
        }
    }
    assert!(wrong.is_empty(), "console routes not as declared:\n{}", wrong.join("\n"));
}
