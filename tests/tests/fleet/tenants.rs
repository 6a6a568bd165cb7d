//! Tenants across real processes: a token bound to a tenant (`TOKEN@TENANT` in
//! `FLEET_API_TOKENS`) makes its turns and tool calls that tenant's (naming another is refused),
//! an unbound token's work is the request's `tenant` or the token's name; the workers roll each
//! model call's tokens up per hour per tenant, assistant and session, served by `GET /v1/usage` (a
//! bound token sees only its own tenant's and sessions'); and a tenant over its daily cap gets `budget_exceeded`
//! with no model call.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, read_until_done, turn_body};
use fleet_tests::{spawn_fleet, Fleet, Receiver, Reply};

const SECRET: &str = "whsec_tenants_secret_0001";
const ADMIN: &str = "tenants-admin-token-0123456789";
const ACME: &str = "tenants-acme-token-0123456789";
const BETA: &str = "tenants-beta-token-0123456789";

/// The tokens: an operator's (unbound, full rights), acme's and beta's (bound, full rights).
fn tokens() -> String {
    format!("{ADMIN},{ACME}@acme,{BETA}@beta")
}

/// Posts a turn with `token`; its execution id.
async fn post_turn_as(fleet: &Fleet, token: &str, body: &Value) -> String {
    let (status, resp) = fleet.request_as(token, &Method::POST, "/v1/turns", Some(body)).await;
    assert_eq!(status, 202, "{resp}");
    resp["data"]["execution_id"].as_str().unwrap().to_string()
}

fn with_tenant(mut body: Value, tenant: &str) -> Value {
    body["tenant"] = json!(tenant);
    body
}

/// The usage `token` is answered for `query`: (status, buckets).
async fn usage(fleet: &Fleet, token: &str, query: &str) -> (u16, Value) {
    let (status, body) = fleet.request_as(token, &Method::GET, &format!("/v1/usage?{query}"), None).await;
    (status, if status == 200 { body["data"]["buckets"].clone() } else { body })
}

/// The sums over buckets: (prompt, completion, requests).
fn totals(buckets: &Value) -> (u64, u64, u64) {
    let sum = |k: &str| buckets.as_array().unwrap().iter().map(|b| b[k].as_u64().unwrap()).sum();
    (sum("prompt_tokens"), sum("completion_tokens"), sum("requests"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_carries_its_tenant_and_usage_is_rolled_up_per_tenant_and_assistant() {
    let llm = MockLlm::start(|_, _| LlmReply::text("fine")).await;
    let receiver = Receiver::start(SECRET, |_, _| Reply::result(json!("ok"))).await;
    let mut fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_API_TOKENS", &tokens())).await;
    fleet.token = ADMIN.to_string();
    fleet.register_tool("lookup", &receiver.url("/lookup"), SECRET).await;

    let acme = post_turn_as(&fleet, ACME, &turn_body("s_acme", "hi", &[])).await;
    let (status, refused) = fleet
        .request_as(ACME, &Method::POST, "/v1/turns", Some(&with_tenant(turn_body("s_x", "hi", &[]), "beta")))
        .await;
    assert_eq!(status, 422, "a bound token creates work only for its tenant: {refused}");
    let named = post_turn_as(&fleet, ADMIN, &with_tenant(turn_body("s_named", "hi", &[]), "gamma")).await;
    let unnamed = post_turn_as(&fleet, ADMIN, &turn_body("s_unnamed", "hi", &[])).await;
    let call = json!({"tool_name": "lookup", "parameters": {"query": "q"}, "assistant_id": "asst_1"});
    let (status, called) = fleet.request_as(BETA, &Method::POST, "/v1/tool-calls", Some(&call)).await;
    assert_eq!(status, 202, "{called}");
    let call_id = called["data"]["execution_id"].as_str().unwrap().to_string();

    let timeout = Duration::from_secs(30);
    let record = fleet.wait_status(&acme, "succeeded", timeout).await;
    assert_eq!(record["tenant"], "acme", "{record}");
    assert_eq!(record["turn"]["tenant"], "acme", "{record}");
    assert_eq!(fleet.wait_status(&named, "succeeded", timeout).await["tenant"], "gamma");
    let own = fleet.wait_status(&unnamed, "succeeded", timeout).await["tenant"].as_str().unwrap().to_string();
    assert!(own.starts_with("token-") && own.len() == 14, "an unbound token's work is its name's: {own}");
    assert_eq!(fleet.wait_status(&call_id, "succeeded", timeout).await["tenant"], "beta");

    // One model call per turn, each reporting 11 prompt and 3 completion tokens.
    let (status, buckets) = usage(&fleet, ADMIN, "tenant=acme").await;
    assert_eq!(status, 200, "{buckets}");
    assert_eq!(buckets.as_array().unwrap().len(), 1, "one hour: {buckets}");
    assert_eq!(totals(&buckets), (11, 3, 1));
    assert_eq!(totals(&usage(&fleet, ADMIN, "assistant=asst_1").await.1), (33, 9, 3));
    assert_eq!(totals(&usage(&fleet, ADMIN, "tenant=gamma&assistant=asst_1").await.1), (11, 3, 1));
    assert_eq!(totals(&usage(&fleet, ADMIN, &format!("tenant={own}")).await.1), (11, 3, 1));
    assert_eq!(totals(&usage(&fleet, ADMIN, "tenant=beta").await.1), (0, 0, 0), "tool calls use no tokens");
    // A bound token: its own tenant's usage, whatever it asks; another tenant's is not found.
    assert_eq!(totals(&usage(&fleet, ACME, "assistant=asst_1").await.1), (11, 3, 1));
    assert_eq!(totals(&usage(&fleet, ACME, "").await.1), (11, 3, 1));
    assert_eq!(usage(&fleet, ACME, "tenant=gamma").await.0, 404);
    // A range before any use has no buckets; a reversed one is refused.
    let (status, old) = usage(&fleet, ADMIN, "tenant=acme&since=2020-01-01T00:00:00Z&until=2020-01-02T00:00:00Z").await;
    assert_eq!((status, totals(&old)), (200, (0, 0, 0)));
    assert_eq!(usage(&fleet, ADMIN, "tenant=acme&since=2020-01-02T00:00:00Z&until=2020-01-01T00:00:00Z").await.0, 422);
    assert_eq!(usage(&fleet, ADMIN, "").await.0, 422, "tenant or assistant is required");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_daily_cap_ends_its_turn_with_budget_exceeded_and_no_model_call() {
    let llm = MockLlm::start(|_, _| LlmReply::text("fine")).await;
    let options =
        llm_fleet(&llm).env("FLEET_API_TOKENS", &tokens()).env("FLEET_TENANT_DAILY_TOKENS", "acme=10,beta=1000");
    let mut fleet = spawn_fleet(options).await;
    fleet.token = ADMIN.to_string();
    let timeout = Duration::from_secs(30);

    // Under its cap (0 of 10 used), acme's first turn runs, and uses 14 tokens.
    let first = post_turn_as(&fleet, ACME, &turn_body("s_cap_1", "hi", &[])).await;
    fleet.wait_status(&first, "succeeded", timeout).await;
    assert_eq!(llm.requests().len(), 1);

    let second = post_turn_as(&fleet, ACME, &turn_body("s_cap_2", "hi", &[])).await;
    // From the stream's start: with no model call the turn can end before the stream is opened.
    // The stream of acme's session, read with acme's token (an operator's would name the tenant).
    fleet.token = ACME.to_string();
    let frames = read_until_done(&fleet, "s_cap_2", Some("0-0")).await;
    fleet.token = ADMIN.to_string();
    let error = frames.iter().find(|(_, _, event, _)| event == "error").map(|(_, _, _, data)| data.clone());
    let error = error.expect("an error event");
    assert_eq!(error["error"]["code"], "budget_exceeded", "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("acme") && message.contains("10"), "{message}");
    let record = fleet.wait_status(&second, "dead_lettered", timeout).await;
    assert_eq!(record["attempts"].as_array().map(Vec::len), Some(0), "no model attempt: {record}");

    // Another tenant, under its own cap, is not affected; no call was made for acme's second turn.
    let other = post_turn_as(&fleet, BETA, &turn_body("s_cap_3", "hi", &[])).await;
    fleet.wait_status(&other, "succeeded", timeout).await;
    assert_eq!(llm.requests().len(), 2, "no model call for the turn over its cap");
    assert_eq!(totals(&usage(&fleet, ADMIN, "tenant=acme").await.1), (11, 3, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_bound_token_sees_only_its_tenants_executions_and_sessions() {
    let llm = MockLlm::start(|_, _| LlmReply::text("fine")).await;
    let mut fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_API_TOKENS", &tokens())).await;
    fleet.token = ADMIN.to_string();
    let timeout = Duration::from_secs(30);
    let acme_turn = post_turn_as(&fleet, ACME, &turn_body("s_iso_acme", "hi", &[])).await;
    let beta_turn = post_turn_as(&fleet, BETA, &turn_body("s_iso_beta", "hi", &[])).await;
    fleet.wait_status(&acme_turn, "succeeded", timeout).await;
    fleet.wait_status(&beta_turn, "succeeded", timeout).await;

    // Every route about acme's execution or session: acme and the operator (naming the tenant
    // whose session it is) get through, beta gets 404 as for an id that does not exist (never 403).
    let routes = [
        (Method::GET, format!("/v1/executions/{acme_turn}")),
        (Method::POST, format!("/v1/executions/{acme_turn}/cancel")),
        (Method::GET, "/v1/sessions/s_iso_acme/messages?tenant=acme".to_string()),
        (Method::POST, "/v1/sessions/s_iso_acme/stream-token?tenant=acme".to_string()),
        (Method::DELETE, "/v1/sessions/s_iso_acme?tenant=acme".to_string()),
    ];
    let (status, body) =
        fleet.request_as(ADMIN, &Method::GET, "/v1/sessions/s_iso_acme/messages?tenant=acme", None).await;
    assert_eq!((status, body["data"]["messages"].as_array().map(Vec::len)), (200, Some(2)), "{body}");
    for (method, path) in &routes {
        let (status, body) = fleet.request_as(BETA, method, path, None).await;
        assert_eq!(status, 404, "beta: {method} {path}: {body}");
        assert_eq!(body["error"]["code"], "not_found", "{method} {path}: {body}");
        for token in [ACME, ADMIN] {
            let (status, body) = fleet.request_as(token, method, path, None).await;
            // The cancel of a finished turn is 409 `already_finished`: it was found.
            assert!([200, 204, 409].contains(&status), "{method} {path}: {status} {body}");
        }
    }
    let stream = |token: &str| {
        fleet
            .http
            .get(format!("{}/v1/sessions/s_iso_acme/stream?since=start&until=done", fleet.api))
            .bearer_auth(token.to_string())
            .send()
    };
    assert_eq!(stream(BETA).await.unwrap().status().as_u16(), 404);
    assert_eq!(stream(ACME).await.unwrap().status().as_u16(), 200);
    // Beta's turn with acme's session key runs in beta's own session of that key.
    let (status, body) =
        fleet.request_as(BETA, &Method::POST, "/v1/turns", Some(&turn_body("s_iso_acme", "hi", &[]))).await;
    assert_eq!(status, 202, "{body}");
    let beta_second = body["data"]["execution_id"].as_str().unwrap().to_string();
    fleet.wait_status(&beta_second, "succeeded", timeout).await;

    // Listings: a bound token lists only its own tenant's executions; the operator lists both.
    let listed = |token: &'static str| {
        let fleet = &fleet;
        async move {
            let (status, body) = fleet.request_as(token, &Method::GET, "/v1/executions?kind=turn", None).await;
            assert_eq!(status, 200, "{body}");
            let ids: Vec<String> = body["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["execution_id"].as_str().unwrap().to_string())
                .collect();
            ids
        }
    };
    assert_eq!(listed(ACME).await, vec![acme_turn.clone()]);
    let betas = listed(BETA).await;
    assert!(betas.len() == 2 && betas.contains(&beta_turn) && betas.contains(&beta_second), "{betas:?}");
    let all = listed(ADMIN).await;
    assert!(all.contains(&acme_turn) && all.contains(&beta_turn), "{all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_bound_token_reads_retries_and_purges_only_its_tenants_dead_letters() {
    // Every call is refused for good (404): each ends as a dead letter at once.
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(404)).await;
    let mut fleet = spawn_fleet(fleet_tests::FleetOptions::default().env("FLEET_API_TOKENS", &tokens())).await;
    fleet.token = ADMIN.to_string();
    fleet.register_tool("refuses", &receiver.url("/refuses"), SECRET).await;
    let call = json!({"tool_name": "refuses", "parameters": {"query": "q"}});
    let mut ids = vec![];
    for token in [ACME, BETA] {
        let (status, body) = fleet.request_as(token, &Method::POST, "/v1/tool-calls", Some(&call)).await;
        assert_eq!(status, 202, "{body}");
        ids.push(body["data"]["execution_id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        fleet.wait_status(id, "dead_lettered", Duration::from_secs(20)).await;
        fleet_tests::wait_for("its dead letter", Duration::from_secs(10), || async {
            (fleet.request_as(ADMIN, &Method::GET, &format!("/v1/dead-letters/{id}"), None).await.0 == 200)
                .then_some(())
        })
        .await;
    }
    let (acme_id, beta_id) = (&ids[0], &ids[1]);

    let listed = |token: &'static str| {
        let fleet = &fleet;
        async move {
            let (status, body) = fleet.request_as(token, &Method::GET, "/v1/dead-letters", None).await;
            assert_eq!(status, 200, "{body}");
            let ids: Vec<String> = body["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["execution_id"].as_str().unwrap().to_string())
                .collect();
            ids
        }
    };
    assert_eq!(listed(ACME).await, vec![acme_id.clone()]);
    assert_eq!(listed(ADMIN).await.len(), 2);
    for (method, path) in [
        (Method::GET, format!("/v1/dead-letters/{beta_id}")),
        (Method::POST, format!("/v1/dead-letters/{beta_id}/retry")),
        (Method::DELETE, format!("/v1/dead-letters/{beta_id}")),
    ] {
        let (status, body) = fleet.request_as(ACME, &method, &path, None).await;
        assert_eq!(status, 404, "acme: {method} {path}: {body}");
    }
    // A bound token's bulk operation names its dead letters; another tenant's are left alone.
    let (status, body) = fleet.request_as(ACME, &Method::POST, "/v1/dead-letters/purge", Some(&json!({}))).await;
    assert_eq!(status, 422, "{body}");
    let both = json!({"execution_ids": [acme_id, beta_id]});
    let (status, body) = fleet.request_as(ACME, &Method::POST, "/v1/dead-letters/purge", Some(&both)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["done"], 1, "{body}");
    assert_eq!(fleet.request_as(ADMIN, &Method::GET, &format!("/v1/dead-letters/{acme_id}"), None).await.0, 404);
    assert_eq!(fleet.request_as(BETA, &Method::GET, &format!("/v1/dead-letters/{beta_id}"), None).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_bound_token_sees_only_its_tenants_rooms() {
    let llm = MockLlm::start(|_, _| LlmReply::text("fine")).await;
    let mut fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_API_TOKENS", &tokens())).await;
    fleet.token = ADMIN.to_string();
    let body = json!({"name": "helper", "title": "Helper", "instructions": "Help."});
    let (status, assistant) = fleet.post("/v1/agents/assistants", &body).await;
    assert_eq!(status, 201, "{assistant}");
    let assistant = assistant["data"]["id"].as_str().unwrap().to_string();
    let (status, room) =
        fleet.request_as(ACME, &Method::POST, &format!("/v1/agents/{assistant}/rooms"), Some(&json!({}))).await;
    assert_eq!(status, 201, "{room}");
    let room = room["data"]["id"].as_str().unwrap().to_string();
    let hi = json!({"content": "hi"});
    let (status, sent) =
        fleet.request_as(ACME, &Method::POST, &format!("/v1/agents/rooms/{room}/messages"), Some(&hi)).await;
    assert_eq!(status, 201, "{sent}");

    let routes = [
        (Method::GET, format!("/v1/agents/rooms/{room}"), None),
        (Method::GET, format!("/v1/agents/rooms/{room}/messages"), None),
        (Method::POST, format!("/v1/agents/rooms/{room}/messages"), Some(hi.clone())),
        (Method::POST, format!("/v1/agents/rooms/{room}/stream-token"), None),
        (Method::POST, format!("/v1/agents/rooms/{room}/close"), None),
    ];
    for (method, path, body) in &routes {
        let (status, answer) = fleet.request_as(BETA, method, path, body.as_ref()).await;
        assert_eq!(status, 404, "beta: {method} {path}: {answer}");
    }
    for token in [ACME, ADMIN] {
        let (status, answer) = fleet.request_as(token, &Method::GET, &format!("/v1/agents/rooms/{room}"), None).await;
        assert_eq!(status, 200, "{answer}");
    }
    let rooms = |token: &'static str| {
        let fleet = &fleet;
        async move {
            let (status, body) = fleet.request_as(token, &Method::GET, "/v1/agents/rooms", None).await;
            assert_eq!(status, 200, "{body}");
            body["data"]["rooms"].as_array().unwrap().len()
        }
    };
    assert_eq!((rooms(ACME).await, rooms(BETA).await, rooms(ADMIN).await), (1, 0, 1));
    let (status, closed) = fleet.request_as(ACME, &Method::POST, &format!("/v1/agents/rooms/{room}/close"), None).await;
    assert_eq!(status, 200, "{closed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_counted_per_session_and_a_bound_token_reads_only_its_own_sessions() {
    let llm = MockLlm::start(|_, _| LlmReply::text("fine")).await;
    let mut fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_API_TOKENS", &tokens())).await;
    fleet.token = ADMIN.to_string();
    let timeout = Duration::from_secs(30);
    // Two turns in acme's s_use_1 (one after the other), one in acme's s_use_2, one in beta's s_use_3.
    for (token, session) in [(ACME, "s_use_1"), (ACME, "s_use_1"), (ACME, "s_use_2"), (BETA, "s_use_3")] {
        let id = post_turn_as(&fleet, token, &turn_body(session, "hi", &[])).await;
        fleet.wait_status(&id, "succeeded", timeout).await;
    }
    // Each model call reports 11 prompt and 3 completion tokens.
    for (token, query) in [(ACME, "session=s_use_1"), (ADMIN, "session=s_use_1&tenant=acme")] {
        let (status, body) = fleet.request_as(token, &Method::GET, &format!("/v1/usage?{query}"), None).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["data"]["session"], "s_use_1", "{body}");
        assert_eq!(totals(&body["data"]["buckets"]), (22, 6, 2), "{body}");
        let total = &body["data"]["total"];
        assert_eq!(
            (&total["prompt_tokens"], &total["completion_tokens"], &total["requests"]),
            (&json!(22), &json!(6), &json!(2))
        );
    }
    assert_eq!(totals(&usage(&fleet, ACME, "session=s_use_2").await.1), (11, 3, 1));
    assert_eq!(totals(&usage(&fleet, ACME, "").await.1), (33, 9, 3), "the tenant's total is the sessions'");
    // Another tenant's session is not found; a session is asked alone.
    let (status, body) = usage(&fleet, BETA, "session=s_use_1").await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")), "{body}");
    assert_eq!(usage(&fleet, ACME, "session=s_use_3").await.0, 404);
    assert_eq!(totals(&usage(&fleet, BETA, "session=s_use_3").await.1), (11, 3, 1));
    assert_eq!(totals(&usage(&fleet, ADMIN, "session=s_use_1").await.1), (0, 0, 0), "the operator's own s_use_1");
    assert_eq!(usage(&fleet, ADMIN, "session=s_use_1&assistant=asst_1").await.0, 422);
    assert_eq!(totals(&usage(&fleet, ADMIN, "session=s_never").await.1), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_metrics_name_only_the_tenants_the_configuration_names() {
    let llm = MockLlm::start(|_, _| LlmReply::text("fine")).await;
    // acme is bound in FLEET_API_TOKENS, beta has a daily cap, gamma is listed in FLEET_TENANTS;
    // delta and the operator token's own name are named by requests only.
    let options = llm_fleet(&llm)
        .env("FLEET_API_TOKENS", &format!("{ADMIN},{ACME}@acme"))
        .env("FLEET_TENANT_DAILY_TOKENS", "beta=100000")
        .env("FLEET_TENANTS", "gamma");
    let mut fleet = spawn_fleet(options).await;
    fleet.token = ADMIN.to_string();
    let mut ids = vec![post_turn_as(&fleet, ACME, &turn_body("s_m_acme", "hi", &[])).await];
    for (session, tenant) in [("s_m_beta", "beta"), ("s_m_gamma", "gamma"), ("s_m_delta", "delta")] {
        ids.push(post_turn_as(&fleet, ADMIN, &with_tenant(turn_body(session, "hi", &[]), tenant)).await);
    }
    ids.push(post_turn_as(&fleet, ADMIN, &turn_body("s_m_own", "hi", &[])).await);
    for id in &ids {
        fleet.wait_status(id, "succeeded", Duration::from_secs(30)).await;
    }
    let text = fleet.worker_metrics(0).await;
    let series = |tenant: &str, kind: &str| {
        fleet_tests::metric(&text, &format!("fleet_llm_tenant_tokens_total{{tenant=\"{tenant}\",type=\"{kind}\"}}"))
    };
    // Each model call reports 11 prompt and 3 completion tokens.
    for tenant in ["acme", "beta", "gamma"] {
        assert_eq!((series(tenant, "prompt"), series(tenant, "completion")), (11.0, 3.0), "{tenant}: {text}");
    }
    assert_eq!((series("other", "prompt"), series("other", "completion")), (22.0, 6.0), "delta and the token's own");
    let tenants: Vec<&str> = text.lines().filter(|l| l.starts_with("fleet_llm_tenant_tokens_total{")).collect();
    assert_eq!(tenants.len(), 8, "four tenant labels, two types each, no more: {tenants:?}");
    assert!(!text.contains("tenant=\"delta\"") && !text.contains("tenant=\"token-"), "{tenants:?}");
}
