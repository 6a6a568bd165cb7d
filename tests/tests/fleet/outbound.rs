//! What the worker's outgoing requests may do and what their answers may bring in: a model's
//! redirect is not followed (the conversation and its key go nowhere else), a secret the model
//! echoes back (its API key in an error body or in its text) is kept nowhere: not in Redis, an API
//! answer, the session's stream, a dead letter or the worker's log; and a credential in a tool
//! owner's error answer is redacted from the call's record.

use std::time::Duration;

use serde_json::Value;

use fleet_tests::fleet::redis_values_containing;
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, post_turn, read_until_done, turn_body};
use fleet_tests::{spawn_fleet, Fleet, FleetOptions, Receiver, Reply};

/// The fleet's model key in these tests: distinctive, so finding it anywhere is a leak.
const KEY: &str = "sk-test-SECRET-0123456789abcdef";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_redirect_is_not_followed_and_ends_the_turn() {
    let elsewhere = MockLlm::start(|_, _| LlmReply::text("answered from elsewhere")).await;
    let location = format!("{}/chat/completions", elsewhere.base_url());
    let llm = MockLlm::start(move |_, _| LlmReply::Redirect(307, location.clone())).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;

    let id = post_turn(&fleet, &turn_body("s_redirect", "the whole conversation", &[])).await;
    let failed = fleet.wait_status(&id, "dead_lettered", Duration::from_secs(20)).await;
    assert_eq!(elsewhere.requests().len(), 0, "the redirect's target got nothing");
    assert_eq!(llm.requests().len(), 1, "a redirect is permanent: not tried again");
    let attempts = failed["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["http_status"], 307, "{failed}");
    let error = attempts[0]["error"].as_str().unwrap();
    assert!(error.contains("redirect") && error.contains("not followed"), "{error}");

    let (_, dead) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
    assert_eq!(dead["data"]["reason"], "permanent", "{dead}");
    let frames = read_until_done(&fleet, "s_redirect", Some("0-0")).await;
    let error = frames.iter().find(|f| f.2 == "error").expect("an error event");
    assert!(error.3.to_string().contains("redirect"), "{}", error.3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_echoed_in_a_model_error_is_kept_nowhere() {
    let llm = MockLlm::start(|_, _| LlmReply::StatusBody(401, format!("invalid api key {KEY}"))).await;
    let mut options = llm_fleet(&llm).env("FLEET_LLM_API_KEY", KEY);
    options.capture_logs = true;
    let fleet = spawn_fleet(options).await;

    let id = post_turn(&fleet, &turn_body("s_echo", "hello", &[])).await;
    let failed = fleet.wait_status(&id, "dead_lettered", Duration::from_secs(20)).await;
    assert_eq!(llm.requests()[0].authorization.as_deref(), Some(format!("Bearer {KEY}").as_str()));
    let frames = read_until_done(&fleet, "s_echo", Some("0-0")).await;
    assert!(frames.iter().any(|f| f.2 == "error"), "{frames:?}");
    let (_, dead_letters) = fleet.get("/v1/dead-letters").await;
    let (_, dead) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
    assert_kept_nowhere(&fleet, &[failed.clone(), dead_letters, dead], &frames).await;

    let error = failed["attempts"][0]["error"].as_str().unwrap();
    assert!(error.contains("HTTP 401") && error.contains("[redacted]"), "the error still says why: {error}");
    // The searches see what the fleet keeps: the redacted error is found where the key is not.
    assert!(!redis_values_containing(&fleet, "invalid api key [redacted]").await.is_empty());
    assert!(fleet.logs().contains("invalid api key [redacted]"), "the worker's log is captured");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_echoed_in_a_model_answer_is_kept_nowhere() {
    // The key is cut across two streamed tokens, as a model's tokenizer may cut it.
    let (head, tail) = KEY.split_at(12);
    let tokens = ["your key is ".to_string(), head.to_string(), tail.to_string(), ", keep it safe".to_string()];
    let llm = MockLlm::start(move |_, _| LlmReply::Text { tokens: tokens.to_vec(), delay: Duration::ZERO }).await;
    let mut options = llm_fleet(&llm).env("FLEET_LLM_API_KEY", KEY);
    options.capture_logs = true;
    let fleet = spawn_fleet(options).await;

    let id = post_turn(&fleet, &turn_body("s_echo_text", "what is my key?", &[])).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    let frames = read_until_done(&fleet, "s_echo_text", Some("0-0")).await;
    let (status, messages) = fleet.get("/v1/sessions/s_echo_text/messages").await;
    assert_eq!(status, 200, "{messages}");
    assert_kept_nowhere(&fleet, &[done.clone(), messages], &frames).await;

    assert_eq!(done["turn"]["final_message"]["content"], "your key is [redacted], keep it safe", "{done}");
    let streamed: String = frames.iter().filter(|f| f.2 == "token").map(|f| f.3["token"].as_str().unwrap()).collect();
    assert_eq!(streamed, "your key is [redacted], keep it safe");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_a_tool_owners_error_are_redacted() {
    const TOOL_KEY: &str = "sk-live-0123456789abcdefghijk";
    let receiver = Receiver::start("whsec_outbound_tests_01", |_, _| Reply {
        body: format!("upstream refused Authorization: Bearer tok_live_0123456789abcdef (key {TOOL_KEY})"),
        ..Reply::status(400)
    })
    .await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("echoing", &receiver.url("/echoing"), "whsec_outbound_tests_01").await;
    let id = fleet.call_tool("echoing", serde_json::json!({"query": "anything"})).await;
    let failed = fleet.wait_status(&id, "dead_lettered", Duration::from_secs(20)).await;
    let (_, dead) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
    for answer in [&failed, &dead] {
        let text = answer.to_string();
        assert!(!text.contains("tok_live_0123456789abcdef") && !text.contains(TOOL_KEY), "{text}");
    }
    assert_eq!(
        failed["attempts"][0]["error"], "HTTP 400: upstream refused Authorization: Bearer [redacted] (key [redacted])",
        "{failed}"
    );
    for secret in ["tok_live_0123456789abcdef", TOOL_KEY] {
        let stored = redis_values_containing(&fleet, secret).await;
        assert!(stored.is_empty(), "Redis values hold {secret}: {stored:?}");
    }
}

/// `KEY` is in none of the API answers given, the session's stream (its tokens joined too), any
/// Redis value of the fleet or the fleet's log; a failure lists every place that holds it.
async fn assert_kept_nowhere(fleet: &Fleet, answers: &[Value], frames: &[(String, String, String, Value)]) {
    let mut places: Vec<String> = answers
        .iter()
        .filter(|answer| answer.to_string().contains(KEY))
        .map(|answer| format!("API answer {answer}"))
        .collect();
    let streamed: String = frames.iter().map(|f| f.3["token"].as_str().unwrap_or(&f.0)).collect();
    if streamed.contains(KEY) {
        places.push(format!("session stream: {:?}", frames.iter().map(|f| &f.2).collect::<Vec<_>>()));
    }
    places.extend(redis_values_containing(fleet, KEY).await.into_iter().map(|key| format!("Redis {key}")));
    let logged = fleet.logs().lines().filter(|l| l.contains(KEY)).count();
    if logged > 0 {
        places.push(format!("{logged} log lines"));
    }
    assert!(places.is_empty(), "the key is kept in {} places: {places:#?}", places.len());
}

/// Every secret the fleet is configured with or keeps: what a run may never show anywhere.
struct Secrets;

impl Secrets {
    const ADMIN: &'static str = "search-admin-token-0123456789abcdef";
    const TENANT: &'static str = "search-tenant-token-0123456789abcdef";
    const TOOL: &'static str = "whsec_search_tool_secret_0001";
    const HOOK: &'static str = "whsec_search_hook_secret_0001";

    fn all() -> [&'static str; 6] {
        [KEY, Self::ADMIN, Self::TENANT, Self::TOOL, Self::HOOK, fleet_tests::fleet::TEST_SECRETS_KEY]
    }

    /// What the model and the tool echo: every secret a process of the fleet holds.
    fn echoed() -> String {
        format!("echo {KEY} {} {} {}", Self::ADMIN, Self::TENANT, fleet_tests::fleet::TEST_SECRETS_KEY)
    }
}

/// After a run in which the model (in its text and in a 401) and a tool (in a result and in an
/// error) echo every secret the fleet holds, with a webhook receiving the failures: no Redis value,
/// log line, stream event, API answer, console page or metric holds any secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_is_kept_or_shown_anywhere_after_a_run_that_echoes_them_all() {
    let llm = MockLlm::start(|body, _| {
        if body.to_string().contains("fail now") {
            LlmReply::StatusBody(401, format!("invalid key: {}", Secrets::echoed()))
        } else {
            LlmReply::text(&Secrets::echoed())
        }
    })
    .await;
    let tool = Receiver::start(Secrets::TOOL, |r, _| {
        let headers = serde_json::to_string(&r.headers).unwrap();
        // The tool echoes its own secret too, which no process has in its configuration.
        if r.json["parameters"]["fail"] == true {
            Reply { body: format!("refused {} {} {headers}", Secrets::echoed(), Secrets::TOOL), ..Reply::status(400) }
        } else {
            Reply::result(serde_json::json!({"echo": Secrets::echoed(), "own": Secrets::TOOL, "headers": headers}))
        }
    })
    .await;
    // The webhook's receiver refuses its first delivery echoing its own secret, then takes them.
    let hooks = Receiver::start(Secrets::HOOK, |_, n| {
        if n == 0 {
            Reply { body: format!("no, {}", Secrets::HOOK), ..Reply::status(500) }
        } else {
            Reply::status(200)
        }
    })
    .await;
    let tokens = format!("{},{}@acme", Secrets::ADMIN, Secrets::TENANT);
    let options = llm_fleet(&llm).env("FLEET_LLM_API_KEY", KEY).env("FLEET_API_TOKENS", &tokens);
    let mut fleet = spawn_fleet(FleetOptions { capture_logs: true, ..options }).await;
    fleet.token = Secrets::ADMIN.to_string();
    // A copy of every job the fleet publishes: fresh jobs, next steps, retries and parks.
    let tap = fleet_tests::tap::JobTap::start(&fleet).await;
    fleet.register_tool("echo", &tool.url("/echo"), Secrets::TOOL).await;
    let hook = serde_json::json!({"url": hooks.url("/events"), "secret": Secrets::HOOK,
        "events": ["tool.callback.failed", "tool.callback.dead_letter"]});
    let (status, body) = fleet.request(reqwest::Method::PUT, "/v1/webhooks/w_search", Some(&hook)).await;
    assert_eq!(status, 201, "{body}");

    let mut ids = vec![];
    for (session, text) in [("s_echo", "say it"), ("s_fail", "fail now")] {
        ids.push(post_turn(&fleet, &turn_body(session, text, &[])).await);
    }
    for parameters in [serde_json::json!({"query": "q"}), serde_json::json!({"query": "q", "fail": true})] {
        ids.push(fleet.call_tool("echo", parameters).await);
    }
    let timeout = Duration::from_secs(30);
    for (id, status) in ids.iter().zip(["succeeded", "dead_lettered", "succeeded", "dead_lettered"]) {
        fleet.wait_status(id, status, timeout).await;
    }
    fleet_tests::wait_for("the failure webhook, delivered again", timeout, || async {
        (hooks.received().len() >= 2).then_some(())
    })
    .await;

    let mut shown: Vec<(String, String)> = vec![];
    for session in ["s_echo", "s_fail"] {
        let frames = read_until_done(&fleet, session, Some("0-0")).await;
        shown.push((format!("stream {session}"), frames.iter().map(|f| f.0.as_str()).collect()));
        shown.push((
            format!("messages {session}"),
            fleet.get(&format!("/v1/sessions/{session}/messages")).await.1.to_string(),
        ));
    }
    for path in ["/v1/executions", "/v1/dead-letters", "/v1/tools", "/v1/tools/echo", "/v1/webhooks", "/v1/audit"] {
        shown.push((path.to_string(), fleet.get(path).await.1.to_string()));
    }
    for id in &ids {
        shown.push((format!("execution {id}"), fleet.get(&format!("/v1/executions/{id}")).await.1.to_string()));
        shown.push((format!("dead letter {id}"), fleet.get(&format!("/v1/dead-letters/{id}")).await.1.to_string()));
    }
    shown.push(("webhook deliveries".into(), hooks.received().iter().map(|r| r.json.to_string()).collect()));
    shown.push((
        "dispatcher metrics".into(),
        fleet.http.get(format!("{}/metrics", fleet.api)).send().await.unwrap().text().await.unwrap(),
    ));
    shown.push(("worker metrics".into(), fleet.worker_metrics(0).await));
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let login = fleet_tests::console_login(&http, &fleet.api, Secrets::ADMIN, false).await;
    let cookie = login.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    let mut pages: Vec<String> = [
        "/console",
        "/console/executions",
        "/console/dead-letters",
        "/console/tools",
        "/console/webhooks",
        "/console/sessions",
        "/console/audit",
    ]
    .map(String::from)
    .to_vec();
    pages
        .extend(ids.iter().flat_map(|id| [format!("/console/executions/{id}"), format!("/console/dead-letters/{id}")]));
    pages.extend(["s_echo", "s_fail"].map(|s| format!("/console/sessions?session={s}")));
    for page in pages {
        let r = http.get(format!("{}{page}", fleet.api)).header("cookie", &cookie).send().await.unwrap();
        shown.push((format!("console {page}"), r.text().await.unwrap()));
    }
    shown.push(("logs".into(), fleet.logs()));
    let jobs = tap.seen().await;
    assert!(jobs.len() >= ids.len(), "the tap saw the jobs: {}", jobs.len());
    shown.push(("AMQP jobs".into(), jobs.iter().map(|j| String::from_utf8_lossy(&j.body).into_owned()).collect()));

    let mut places = vec![];
    for secret in Secrets::all() {
        places.extend(
            shown.iter().filter(|(_, text)| text.contains(secret)).map(|(place, _)| format!("{place}: {secret}")),
        );
        places.extend(
            redis_values_containing(&fleet, secret).await.into_iter().map(|key| format!("Redis {key}: {secret}")),
        );
    }
    assert!(places.is_empty(), "secrets kept or shown in {} places: {places:#?}", places.len());
    assert!(shown.iter().any(|(_, text)| text.contains("[redacted]")), "the echoes arrived, redacted");
    assert!(tool.received().len() >= 2 && llm.requests().len() >= 2, "the run reached the model and the tool");
}
