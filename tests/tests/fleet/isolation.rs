//! Tenant isolation outside the API walk, tried as a hostile second tenant would: the console is
//! the operators' (a tenant-bound token cannot log in, and a session ends with its token or its
//! scopes), a session no tenant holds is no one's to listen to, a session's bindings outlive its
//! data, a refused request binds nothing, and what one tenant's work wrote (a tool's error text,
//! a callback URL's credentials, another tenant's ids used as labels) never reaches another.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use fleet_tests::console::ConsoleClient;
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, turn_body};
use fleet_tests::{spawn_fleet, wait_for, Fleet, Receiver, Reply};

const SECRET: &str = "whsec_isolation_secret_01";
const ADMIN: &str = "isolation-admin-token-0123456789";
const ACME: &str = "isolation-acme-token-0123456789";
const BETA: &str = "isolation-beta-token-0123456789";

fn tokens() -> String {
    format!("{ADMIN},{ACME}@acme,{BETA}@beta")
}

/// A fleet with an operator's token and two tenants' bound tokens, a model that answers "fine".
async fn two_tenants(extra: &[(&str, &str)]) -> (Fleet, MockLlm) {
    let llm = MockLlm::start(|_, _| LlmReply::text("fine")).await;
    let mut options = llm_fleet(&llm).env("FLEET_API_TOKENS", &tokens());
    for (k, v) in extra {
        options = options.env(k, v);
    }
    let mut fleet = spawn_fleet(options).await;
    fleet.token = ADMIN.to_string();
    (fleet, llm)
}

/// Posts a turn as `token` and waits until its execution succeeded.
async fn turn_as(fleet: &Fleet, token: &str, session: &str) -> String {
    let (status, resp) =
        fleet.request_as(token, &Method::POST, "/v1/turns", Some(&turn_body(session, "hi", &[]))).await;
    assert_eq!(status, 202, "{resp}");
    let id = resp["data"]["execution_id"].as_str().unwrap().to_string();
    fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    id
}

/// Creates an assistant as `token`: its id.
async fn assistant_as(fleet: &Fleet, token: &str, name: &str) -> String {
    let body = json!({"name": name, "title": name, "instructions": "Be brief."});
    let (status, resp) = fleet.request_as(token, &Method::POST, "/v1/agents/assistants", Some(&body)).await;
    assert_eq!(status, 201, "{resp}");
    resp["data"]["id"].as_str().unwrap().to_string()
}

/// A console login with `token`: the session, or the refusal's status and page.
async fn login(fleet: &Fleet, token: &str) -> Result<ConsoleClient, (u16, String)> {
    let login = ConsoleClient::login(&fleet.api, token, false).await;
    login.client.ok_or((login.status, login.page))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_bound_token_cannot_log_in_to_the_console() {
    let (fleet, _llm) = two_tenants(&[]).await;
    turn_as(&fleet, ACME, "s_acme_console").await;
    let (status, page) = login(&fleet, BETA).await.err().expect("beta's bound token is refused");
    assert_eq!(status, 403, "{page}");
    assert!(page.contains("bound to a tenant"), "the page says why: {page}");
    let operator = login(&fleet, ADMIN).await.expect("the operator's token logs in");
    let (status, page) = operator.get("/console/executions").await;
    assert_eq!((status, page.contains("s_acme_console") || page.contains("exec_")), (200, true), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_session_ends_with_its_token_and_follows_its_scopes() {
    const GONE: &str = "isolation-gone-token-0123456789";
    const SHRUNK: &str = "isolation-shrunk-token-0123456789";
    let all = format!("{},{GONE},{SHRUNK}", tokens());
    let (mut fleet, _llm) = two_tenants(&[("FLEET_API_TOKENS", &all)]).await;
    let gone = login(&fleet, GONE).await.expect("logs in");
    let shrunk = login(&fleet, SHRUNK).await.expect("logs in");
    assert_eq!(gone.get("/console/executions").await.0, 200);
    let csrf = shrunk.csrf().await;

    // The operator revokes GONE and leaves SHRUNK only console:read; the dispatcher restarts.
    fleet.stop_dispatcher(libc::SIGTERM, Duration::from_secs(30)).await;
    fleet.set_env("FLEET_API_TOKENS", &format!("{},{SHRUNK}:console:read", tokens()));
    fleet.start_dispatcher(None).await;

    let (status, page) = gone.get("/console/executions").await;
    assert_eq!(status, 303, "a revoked token's session is over: {page}");
    let (status, page) = shrunk.get("/console/executions").await;
    assert_eq!(status, 200, "a session of a token still known still reads: {page}");
    let (status, page) = shrunk.post("/console/tools/nope/close-circuit", &[("csrf", &csrf)]).await;
    assert_eq!(status, 403, "a token cut to console:read changes nothing: {page}");
    assert!(page.contains("read-only"), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_no_tenant_holds_is_not_open_to_a_bound_token() {
    let (fleet, _llm) = two_tenants(&[]).await;
    for (method, path) in [
        (Method::GET, "/v1/sessions/user_42/stream"),
        (Method::POST, "/v1/sessions/user_42/stream-token"),
        (Method::GET, "/v1/sessions/user_42/messages"),
    ] {
        let (status, body) = fleet.request_as(BETA, &method, path, None).await;
        assert_eq!(status, 404, "{method} {path} before anyone's turn: {body}");
    }
    turn_as(&fleet, ACME, "user_42").await;
    let (status, body) = fleet.request_as(ACME, &Method::GET, "/v1/sessions/user_42/messages", None).await;
    assert_eq!(status, 200, "its owner reads it: {body}");
    let (status, body) = fleet.request_as(BETA, &Method::POST, "/v1/sessions/user_42/stream-token", None).await;
    assert_eq!(status, 404, "beta's session of that key has had no turn: {body}");
}

/// The messages of `session` as `token` reads them: (status, the contents).
async fn contents(fleet: &Fleet, token: &str, session: &str) -> (u16, Vec<String>) {
    let (status, body) = fleet.request_as(token, &Method::GET, &format!("/v1/sessions/{session}/messages"), None).await;
    let texts = body["data"]["messages"].as_array().into_iter().flatten();
    (status, texts.map(|m| m["content"].as_str().unwrap_or_default().to_string()).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_using_one_session_key_have_two_sessions() {
    let llm = MockLlm::start(|body, _| {
        let asked = body["messages"].as_array().and_then(|m| m.last()).map(|m| m["content"].to_string());
        LlmReply::text(&format!("you said {}", asked.unwrap_or_default()))
    })
    .await;
    let mut fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_API_TOKENS", &tokens())).await;
    fleet.token = ADMIN.to_string();
    // Acme uses a guessable key first; beta uses the same one: neither squats nor reads the other's.
    for (token, text) in [(ACME, "acme here"), (BETA, "beta here")] {
        let mut body = turn_body("user_42", text, &[]);
        body["messages"][0]["content"] = json!(text);
        let (status, resp) = fleet.request_as(token, &Method::POST, "/v1/turns", Some(&body)).await;
        assert_eq!(status, 202, "{resp}");
        fleet.wait_status(resp["data"]["execution_id"].as_str().unwrap(), "succeeded", Duration::from_secs(30)).await;
    }
    let (status, acme) = contents(&fleet, ACME, "user_42").await;
    assert_eq!(status, 200);
    assert!(acme.iter().any(|c| c.contains("acme here")) && !acme.iter().any(|c| c.contains("beta")), "{acme:?}");
    let (status, beta) = contents(&fleet, BETA, "user_42").await;
    assert_eq!(status, 200);
    assert!(beta.iter().any(|c| c.contains("beta here")) && !beta.iter().any(|c| c.contains("acme")), "{beta:?}");
    assert!(
        !llm.requests()
            .iter()
            .any(|r| r.body.to_string().contains("acme here") && r.body.to_string().contains("beta here")),
        "no model prompt mixes the two sessions"
    );

    // Beta's stream token opens beta's session of that key, whose events name the key as sent.
    let (status, token) = fleet.request_as(BETA, &Method::POST, "/v1/sessions/user_42/stream-token", None).await;
    assert_eq!(status, 200, "{token}");
    assert_eq!(token["data"]["session_id"], "user_42", "{token}");
    let url = format!(
        "{}/v1/sessions/user_42/stream?since=start&until=done&token={}",
        fleet.api,
        token["data"]["token"].as_str().unwrap()
    );
    let streamed = fleet.http.get(url).send().await.unwrap().text().await.unwrap();
    assert!(streamed.contains("beta here") && !streamed.contains("acme here"), "{streamed}");
    assert!(streamed.contains("\"session_id\":\"user_42\""), "{streamed}");
    // The operator's (unbound) session of that key is a third one, as an unbound fleet had it.
    let (status, body) = fleet.request_as(ADMIN, &Method::GET, "/v1/sessions/user_42/messages", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["messages"].as_array().map(Vec::len), Some(0), "{body}");
    // Each tenant's executions name the session by its key.
    let (_, listed) = fleet.request_as(BETA, &Method::GET, "/v1/executions?session_id=user_42", None).await;
    let rows = listed["data"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{listed}");
    assert_eq!(rows[0]["room_id"], "user_42", "{listed}");
}

/// The TTL of `key` in seconds: `None` for a key that never expires, `Some(-2)` for a missing one.
async fn ttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<i64> {
    let t: i64 = redis::cmd("TTL").arg(key).query_async(conn).await.unwrap();
    (t != -1).then_some(t)
}

/// Every key of a session (by its hash tag) with its TTL, and the bindings' least TTL.
async fn session_ttls(fleet: &Fleet, session: &str) -> (Vec<(String, Option<i64>)>, Option<i64>) {
    let mut conn = fleet.redis().await;
    let keys = fleet.redis_keys(&format!("session:{{{session}}}:*")).await;
    assert!(!keys.is_empty(), "the session left keys");
    let mut data = vec![];
    let mut binding: Option<Option<i64>> = None;
    for key in keys {
        let t = ttl(&mut conn, &key).await;
        if key.ends_with(":tenant") || key.ends_with(":agent") {
            let least = match (binding, t) {
                (None, t) => t,
                (Some(None), t) | (Some(t), None) => t,
                (Some(Some(a)), Some(b)) => Some(a.min(b)),
            };
            binding = Some(least);
        } else {
            data.push((key, t));
        }
    }
    (data, binding.expect("the session has a tenant binding"))
}

/// Whether a binding of `binding` TTL outlives data of `data` TTL (`None`: never expires).
fn outlives(binding: Option<i64>, data: Option<i64>) -> bool {
    match (binding, data) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(b), Some(d)) => b >= d,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_bindings_outlive_its_data() {
    let (fleet, _llm) = two_tenants(&[]).await;
    let mut conn = fleet.redis().await;
    turn_as(&fleet, ACME, "s_ttl").await;
    // Days pass: every key of the session has a day left; then its owner reads its messages.
    let keys = fleet.redis_keys("session:{acme\u{1f}s_ttl}:*").await;
    for key in &keys {
        let _: () = redis::cmd("EXPIRE").arg(key).arg(86_400).query_async(&mut conn).await.unwrap();
    }
    let (status, body) = fleet.request_as(ACME, &Method::GET, "/v1/sessions/s_ttl/messages", None).await;
    assert_eq!(status, 200, "{body}");
    // Acme's session of the key `s_ttl` is stored under acme's scope.
    let (data, binding) = session_ttls(&fleet, "acme\u{1f}s_ttl").await;
    for (key, t) in &data {
        assert!(outlives(binding, *t), "{key} lives {t:?} s, its tenant binding {binding:?} s");
    }

    // A room never expires, so neither does its session's binding; nor do a seed 001 session's.
    let assistant = assistant_as(&fleet, ACME, "ttl_helper").await;
    let (status, room) = fleet
        .request_as(ACME, &Method::POST, &format!("/v1/agents/{assistant}/rooms"), Some(&json!({"namespace": "u"})))
        .await;
    assert_eq!(status, 201, "{room}");
    let room = room["data"]["id"].as_str().unwrap().to_string();
    let message = json!({"content": "hello", "role": "user"});
    let (status, sent) =
        fleet.request_as(ACME, &Method::POST, &format!("/v1/agents/rooms/{room}/messages"), Some(&message)).await;
    assert_eq!(status, 201, "{sent}");
    fleet.wait_status(sent["data"]["execution_id"].as_str().unwrap(), "succeeded", Duration::from_secs(30)).await;
    let room_ttl = ttl(&mut conn, &format!("{}{{rooms}}:room:{room}", fleet.key_prefix)).await;
    let (data, binding) = session_ttls(&fleet, &room).await;
    assert!(outlives(binding, room_ttl), "the room lives {room_ttl:?} s, its binding {binding:?} s");
    for (key, t) in &data {
        assert!(outlives(binding, *t), "{key} lives {t:?} s, its binding {binding:?} s");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_seed_input_binds_nothing() {
    let (fleet, _llm) = two_tenants(&[]).await;
    let acme_agent = assistant_as(&fleet, ACME, "acme_agent").await;
    let acme_other = assistant_as(&fleet, ACME, "acme_other").await;
    let beta_agent = assistant_as(&fleet, BETA, "beta_agent").await;
    turn_as(&fleet, ACME, "s_shared").await;
    let input = json!({"type": "input", "messages": [{"type": "text", "content": "mine now"}]});
    let path = |agent: &str, session: &str| format!("/v2/agents/{agent}/sessions/{session}/events");
    // Beta's input with beta's agent on acme's key is beta's own session of that key.
    let (status, body) = fleet.request_as(BETA, &Method::POST, &path(&beta_agent, "s_shared"), Some(&input)).await;
    assert_eq!(status, 201, "beta's own session of that key: {body}");
    let (status, body) = fleet.request_as(ACME, &Method::POST, &path(&acme_agent, "s_shared"), Some(&input)).await;
    assert_eq!(status, 201, "acme's own session still takes its agent's input: {body}");
    // A refusal (another agent of acme's on a session its first agent holds) binds nothing either.
    let (status, body) = fleet.request_as(ACME, &Method::POST, &path(&acme_other, "s_shared"), Some(&input)).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = fleet.request_as(ACME, &Method::POST, &path(&acme_agent, "s_shared"), Some(&input)).await;
    assert_eq!(status, 201, "{body}");
    // Beta's input on acme's room (a room is the fleet's id, one session) is refused, writing nothing.
    let (status, room) = fleet
        .request_as(ACME, &Method::POST, &format!("/v1/agents/{acme_agent}/rooms"), Some(&json!({"namespace": "n"})))
        .await;
    assert_eq!(status, 201, "{room}");
    let room = room["data"]["id"].as_str().unwrap().to_string();
    let (status, body) = fleet.request_as(BETA, &Method::POST, &path(&beta_agent, &room), Some(&input)).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = fleet.request_as(ACME, &Method::POST, &path(&acme_agent, &room), Some(&input)).await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_health_and_callback_url_show_tenants_no_others_text() {
    let receiver = Receiver::start(SECRET, |r, _| {
        let echoed = r.json.get("parameters").map(Value::to_string).unwrap_or_default();
        Reply { body: format!("upstream rejected {echoed}"), ..Reply::status(500) }
    })
    .await;
    let (fleet, _llm) = two_tenants(&[("FLEET_RETRY_DELAYS", "0.1")]).await;
    let url = format!("{}?api_key=owner-query-credential-0001", receiver.url("/hook"));
    let tool = json!({"description": "d", "parameters": {"type": "object"}, "callback_url": url,
        "callback_secret": SECRET, "circuit_breaker": {"failure_threshold": 1}});
    let (status, body) = fleet.request_as(ADMIN, &Method::PUT, "/v1/tools/flaky", Some(&tool)).await;
    assert_eq!(status, 201, "{body}");
    let call = json!({"tool_name": "flaky", "parameters": {"account": "acme-private-account-77"}});
    let (status, body) = fleet.request_as(ACME, &Method::POST, "/v1/tool-calls", Some(&call)).await;
    assert_eq!(status, 202, "{body}");

    // The operator sees the error text and the URL whole: the test is about what tenants see.
    wait_for("the circuit's history to name the error", Duration::from_secs(30), || async {
        let (_, tool) = fleet.request_as(ADMIN, &Method::GET, "/v1/tools/flaky", None).await;
        tool.to_string().contains("acme-private-account-77").then_some(())
    })
    .await;
    let (_, tool) = fleet.request_as(ADMIN, &Method::GET, "/v1/tools/flaky", None).await;
    assert!(tool.to_string().contains("owner-query-credential-0001"), "{tool}");

    for token in [BETA, ACME] {
        for path in ["/v1/tools/flaky", "/v1/tools"] {
            let (status, body) = fleet.request_as(token, &Method::GET, path, None).await;
            assert_eq!(status, 200, "{body}");
            let text = body.to_string();
            assert!(!text.contains("owner-query-credential-0001"), "{path} shows the URL's credential: {text}");
            assert!(!text.contains("acme-private-account-77"), "{path} shows a call's error text: {text}");
        }
    }
    let (_, tool) = fleet.request_as(BETA, &Method::GET, "/v1/tools/flaky", None).await;
    assert_eq!(tool["data"]["health"]["state"], "open", "the health itself is shown: {tool}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_ids_are_refused_as_labels() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::result(json!("ok"))).await;
    let (fleet, _llm) = two_tenants(&[]).await;
    fleet.register_tool("labelled", &receiver.url("/l"), SECRET).await;
    let assistant = assistant_as(&fleet, ACME, "acme_labels").await;
    let (status, room) = fleet
        .request_as(ACME, &Method::POST, &format!("/v1/agents/{assistant}/rooms"), Some(&json!({"namespace": "n"})))
        .await;
    assert_eq!(status, 201, "{room}");
    let room = room["data"]["id"].as_str().unwrap().to_string();

    for labels in [json!({"room_id": room}), json!({"assistant_id": assistant})] {
        let mut call = json!({"tool_name": "labelled", "parameters": {"query": "q"}});
        call.as_object_mut().unwrap().extend(labels.as_object().unwrap().clone());
        let (status, body) = fleet.request_as(BETA, &Method::POST, "/v1/tool-calls", Some(&call)).await;
        assert_eq!(status, 404, "beta labels its call with acme's {labels}: {body}");
        let batch = json!({"calls": [call]});
        let (status, body) = fleet.request_as(BETA, &Method::POST, "/v1/tool-calls/batch", Some(&batch)).await;
        assert!(
            status == 404 || body.to_string().contains("not_found"),
            "a batch naming acme's {labels} is refused: {status} {body}"
        );
        let (status, body) = fleet.request_as(ACME, &Method::POST, "/v1/tool-calls", Some(&call)).await;
        assert_eq!(status, 202, "acme labels its own call: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_logins_are_limited_per_source_and_the_bearer_scheme_has_no_case() {
    let (fleet, _llm) = two_tenants(&[]).await;
    for attempt in 1..=10 {
        let (status, _) = login(&fleet, &format!("guess-{attempt:02}-0123456789abcdef")).await.err().unwrap();
        assert_eq!(status, 401, "failed login {attempt}");
    }
    let (status, page) = login(&fleet, ADMIN).await.err().expect("the source is refused for a while");
    assert_eq!(status, 429, "{page}");
    assert!(page.contains("Too many failed logins"), "{page}");

    let lower = fleet.http.get(format!("{}/v1/tools", fleet.api)).header("authorization", format!("bearer {ADMIN}"));
    assert_eq!(lower.send().await.unwrap().status().as_u16(), 200, "RFC 7235: the scheme is case-insensitive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executions_record_outlives_everything_it_guards() {
    let receiver = Receiver::start(SECRET, |r, _| {
        if r.json["parameters"]["query"] == "fail" {
            Reply::status(404)
        } else {
            Reply::result(json!("ok"))
        }
    })
    .await;
    let (fleet, _llm) = two_tenants(&[]).await;
    fleet.register_tool("guarded", &receiver.url("/g"), SECRET).await;
    let mut ids = vec![turn_as(&fleet, ACME, "s_guarded").await];
    for (query, status) in [("ok", "succeeded"), ("fail", "dead_lettered")] {
        let call = json!({"tool_name": "guarded", "parameters": {"query": query}});
        let (code, body) = fleet.request_as(ACME, &Method::POST, "/v1/tool-calls", Some(&call)).await;
        assert_eq!(code, 202, "{body}");
        let id = body["data"]["execution_id"].as_str().unwrap().to_string();
        fleet.wait_status(&id, status, Duration::from_secs(30)).await;
        ids.push(id);
    }
    let (status, _) = fleet.request_as(ACME, &Method::GET, &format!("/v1/dead-letters/{}", ids[2]), None).await;
    assert_eq!(status, 200, "acme reads its dead letter");
    // Days pass: the execution's record is gone, its dead letter kept; acme still owns it.
    let mut conn = fleet.redis().await;
    let record = fleet.redis_keys(&format!("execution:{{*{}}}", ids[2])).await;
    let copy: std::collections::HashMap<String, String> =
        redis::cmd("HGETALL").arg(&record[0]).query_async(&mut conn).await.unwrap();
    let _: () = redis::cmd("DEL").arg(&record[0]).query_async(&mut conn).await.unwrap();
    let (status, body) = fleet.request_as(ACME, &Method::GET, &format!("/v1/dead-letters/{}", ids[2]), None).await;
    assert_eq!(status, 200, "acme reads its dead letter after its execution's record expired: {body}");
    let (status, body) = fleet.request_as(BETA, &Method::GET, &format!("/v1/dead-letters/{}", ids[2]), None).await;
    assert_eq!(status, 404, "{body}");
    let (_, listed) = fleet.request_as(ACME, &Method::GET, "/v1/dead-letters", None).await;
    assert!(listed.to_string().contains(&ids[2]), "acme lists it: {listed}");
    let fields: Vec<(&String, &String)> = copy.iter().collect();
    let _: () = redis::cmd("HSET").arg(&record[0]).arg(fields).query_async(&mut conn).await.unwrap();
    let _: () = redis::cmd("EXPIRE").arg(&record[0]).arg(604_800).query_async(&mut conn).await.unwrap();

    for id in &ids {
        // The record is the hash whose tag is the claim key's name; its `tenant` guards the rest.
        let record = fleet.redis_keys(&format!("execution:{{*{id}}}")).await;
        assert_eq!(record.len(), 1, "one record for {id}: {record:?}");
        let guard = ttl(&mut conn, &record[0]).await;
        assert!(guard.is_some_and(|t| t > 0), "the record of {id} expires: {guard:?}");
        for key in fleet.redis_keys(&format!("*{id}*")).await {
            let t = ttl(&mut conn, &key).await;
            assert!(t.is_some(), "{key} never expires");
            if key.contains("{dead_letters}:record:") {
                // Kept longer than the execution (the dead-letter retention): it carries its own guard.
                let raw: String = redis::cmd("GET").arg(&key).query_async(&mut conn).await.unwrap();
                let record: Value = serde_json::from_str(&raw).unwrap();
                assert_eq!(record["tenant"], "acme", "{key} carries its tenant: {record}");
                continue;
            }
            assert!(outlives(guard, t), "{key} lives {t:?} s, the record that guards it {guard:?} s");
        }
    }
}
