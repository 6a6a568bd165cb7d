//! What SREs rely on: one trace id from the API request through AMQP to the callback (exported over
//! OTLP, or passed through unchanged when nothing exports), JSON logs that carry the job's ids and never a secret, and a Prometheus exposition that
//! `promtool check metrics` accepts on a live scrape.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use serde_json::{json, Value};

use fleet_tests::{spawn_fleet, wait_for, Fleet, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_observability_secret_1";

/// An OTLP/HTTP (JSON) trace collector: every exported span as (service, span) pairs.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<(String, Value)>>>,
}

impl Collector {
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/v1/traces", axum::routing::post(collect)).with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }

    fn for_trace(&self, trace_id: &str) -> Vec<(String, Value)> {
        self.spans.lock().unwrap().iter().filter(|(_, s)| s["traceId"].as_str() == Some(trace_id)).cloned().collect()
    }
}

async fn collect(State(c): State<Collector>, body: Bytes) -> &'static str {
    let export: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    for rs in export["resourceSpans"].as_array().into_iter().flatten() {
        let service = rs["resource"]["attributes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["key"] == "service.name")
            .and_then(|a| a["value"]["stringValue"].as_str())
            .unwrap_or_default()
            .to_string();
        for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
            for span in ss["spans"].as_array().into_iter().flatten() {
                c.spans.lock().unwrap().push((service.clone(), span.clone()));
            }
        }
    }
    "{}"
}

fn attribute<'a>(span: &'a Value, key: &str) -> Option<&'a str> {
    span["attributes"].as_array()?.iter().find(|a| a["key"] == key)?["value"]["stringValue"].as_str()
}

/// Posts `body` to `path` with the caller's trace `headers`; the accepted job's execution id.
async fn post_traced(fleet: &Fleet, path: &str, headers: &[(&str, &str)], body: &Value) -> String {
    let mut request = fleet.http.post(format!("{}{path}", fleet.api)).bearer_auth(&fleet.token).json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let resp = request.send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    resp.json::<Value>().await.unwrap()["data"]["execution_id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_spans_api_broker_worker_and_callback() {
    let collector = Collector::default();
    let endpoint = collector.start().await;
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(
        FleetOptions::default()
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
            .env("OTEL_BSP_SCHEDULE_DELAY", "100"),
    )
    .await;
    fleet.register_tool("traced", &receiver.url("/traced"), SECRET).await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let traceparent = format!("00-{trace_id}-00f067aa0ba902b7-01");
    let body = json!({"tool_name": "traced", "parameters": {"query": "x"}});
    let id = post_traced(&fleet, "/v1/tool-calls", &[("traceparent", &traceparent)], &body).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;

    // The tool owner sees the same trace id.
    let callback = &receiver.received_for(&id)[0];
    let traceparent = callback.header("traceparent").expect("traceparent on the callback");
    assert_eq!(traceparent.split('-').nth(1), Some(trace_id), "{traceparent}");

    // Both processes exported spans of that trace: server + producer in the dispatcher, consumer +
    // client in the worker, with the messaging attributes of the semantic conventions.
    let spans = wait_for("spans of both processes", Duration::from_secs(20), || async {
        let spans = collector.for_trace(trace_id);
        let services: Vec<&str> = spans.iter().map(|(s, _)| s.as_str()).collect();
        (services.contains(&"dispatcher") && services.contains(&"worker") && spans.len() >= 4).then_some(spans)
    })
    .await;
    let kind = |s: &Value| s["kind"].as_i64().unwrap_or_default();
    let producer = spans.iter().find(|(svc, s)| svc == "dispatcher" && kind(s) == 4).expect("a PRODUCER span");
    assert_eq!(attribute(&producer.1, "messaging.system"), Some("rabbitmq"));
    assert_eq!(attribute(&producer.1, "messaging.operation.type"), Some("send"));
    // A tenant's first call takes the tool calls' light lane.
    assert!(attribute(&producer.1, "messaging.destination.name").unwrap().ends_with(".jobs:tool_call.light"));
    let consumer = spans.iter().find(|(svc, s)| svc == "worker" && kind(s) == 5).expect("a CONSUMER span");
    assert!(attribute(&consumer.1, "messaging.destination.name").unwrap().ends_with(".work.tool_calls.light"));
    assert_eq!(attribute(&consumer.1, "messaging.operation.type"), Some("process"));
    assert_eq!(consumer.1["parentSpanId"], producer.1["spanId"], "the worker continues the publisher's span");
    let client = spans.iter().find(|(svc, s)| svc == "worker" && kind(s) == 3).expect("a CLIENT span");
    assert_eq!(traceparent.split('-').nth(2), client.1["spanId"].as_str(), "the callback's parent is the client span");
}

/// Without an exporter the fleet builds no span data, yet a caller's trace context reaches the
/// tool owner unchanged, on every attempt (a retry is a job the worker publishes again); a call
/// that brings none gets a trace of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_exporter_the_callers_trace_context_reaches_the_callback() {
    let receiver =
        Receiver::start(SECRET, |_, n| if n == 0 { Reply::status(500) } else { Reply::result(json!(1)) }).await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_RETRY_DELAYS", "0.2")).await;
    fleet.register_tool("linked", &receiver.url("/linked"), SECRET).await;
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let headers = [("traceparent", traceparent), ("tracestate", "caller=t61rcWkgMzE")];
    let body = json!({"tool_name": "linked", "parameters": {"query": "x"}});
    let id = post_traced(&fleet, "/v1/tool-calls", &headers, &body).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    let attempts = receiver.received_for(&id);
    assert_eq!(attempts.len(), 2, "a failed attempt and its retry");
    for attempt in &attempts {
        assert_eq!(attempt.header("traceparent"), Some(traceparent), "passed through unchanged");
        assert_eq!(attempt.header("tracestate"), Some("caller=t61rcWkgMzE"));
    }

    let other = fleet.call_tool("linked", json!({"query": "y"})).await;
    fleet.wait_status(&other, "succeeded", Duration::from_secs(20)).await;
    let attempts = receiver.received_for(&other);
    let fresh = attempts[0].header("traceparent").expect("a traceparent of its own");
    let trace = fresh.split('-').nth(1).unwrap();
    assert!(trace.len() == 32 && trace != "0af7651916cd43dd8448eb211c80319c", "{fresh}");
    assert_eq!(attempts[1].header("traceparent"), Some(fresh), "the retry continues the same trace");
    assert_eq!(attempts[0].header("tracestate").unwrap_or_default(), "", "no caller, no vendor state");
}

/// The same for a turn: its model calls, the tool call it publishes and the step after it carry
/// the caller's `traceparent` unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_exporter_a_turns_model_calls_and_tool_calls_keep_the_callers_trace() {
    use fleet_tests::llm::{LlmReply, MockLlm};
    use fleet_tests::turn::{llm_fleet, turn_body};
    let llm = MockLlm::start(|_, n| {
        if n == 0 {
            LlmReply::ToolCalls(vec![("call_1".into(), "search".into(), r#"{"query":"laptop"}"#.into())])
        } else {
            LlmReply::text("Found one.")
        }
    })
    .await;
    let search = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    fleet.register_tool("search", &search.url("/search"), SECRET).await;
    let traceparent = "00-5bf92f3577b34da6a3ce929d0e0e4737-10f067aa0ba902b8-01";
    let body = turn_body("s_traced", "find a laptop", &["search"]);
    let id = post_traced(&fleet, "/v1/turns", &[("traceparent", traceparent)], &body).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "a round with the tool call, then the answer");
    for request in &requests {
        assert_eq!(request.traceparent.as_deref(), Some(traceparent), "the model call");
    }
    let calls = search.received();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].header("traceparent"), Some(traceparent), "the tool call the turn published");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_job_ids_and_never_secrets() {
    let receiver =
        Receiver::start(SECRET, |_, n| if n == 0 { Reply::status(500) } else { Reply::result(json!(1)) }).await;
    let options = FleetOptions {
        capture_logs: true,
        ..FleetOptions::default()
            .env("FLEET_LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .env("FLEET_RETRY_DELAYS", "0.2")
    };
    let fleet = spawn_fleet(options).await;
    fleet.register_tool("logged", &receiver.url("/logged"), SECRET).await;
    let id = fleet.call_tool("logged", json!({"query": "x"})).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    let _ = fleet.get("/v1/tools/logged").await;
    let logs = wait_for("the worker's attempt logs", Duration::from_secs(10), || async {
        let logs = fleet.logs();
        (logs.matches("attempt finished").count() >= 2).then_some(logs)
    })
    .await;
    let mut attempts = 0;
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        if v["message"] == "attempt finished" {
            attempts += 1;
            assert_eq!(v["span"]["execution_id"], id.as_str(), "{line}");
            assert_eq!(v["span"]["tool_name"], "logged", "{line}");
            assert!(v["span"]["attempt"].is_number(), "{line}");
        }
    }
    assert_eq!(attempts, 2);
    let metrics = fleet.http.get(format!("{}/metrics", fleet.api)).send().await.unwrap().text().await.unwrap();
    let (_, record) = fleet.get(&format!("/v1/executions/{id}")).await;
    for haystack in [&logs, &metrics, &record.to_string()] {
        assert!(!haystack.contains(SECRET), "the callback secret leaked");
        assert!(!haystack.contains(&fleet.token), "the API token leaked");
        assert!(!haystack.contains(fleet_tests::fleet::TEST_SECRETS_KEY), "the secrets key leaked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_scrapes_pass_promtool_check_metrics() {
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_STATS_INTERVAL", "0.2")).await;
    fleet.register_tool("scraped", &receiver.url("/scraped"), SECRET).await;
    let id = fleet.call_tool("scraped", json!({"query": "x"})).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    let consumers = format!(
        "fleet_queue_consumers{{queue=\"{}\"}} 1",
        fleet.topology.work_queue(fleet_protocol::envelope::JobKind::ToolCall)
    );
    // The stats pass sets the queue gauges before the oldest job's age: a scrape between the two
    // sees the age of the pass before (the job still waiting), so wait for the pass that saw none.
    let settled = "fleet_oldest_job_age_seconds{kind=\"tool_call\"} 0";
    let dispatcher =
        wait_for("queue gauges showing the worker's consumer and no job waiting", Duration::from_secs(10), || async {
            let text = fleet.http.get(format!("{}/metrics", fleet.api)).send().await.ok()?.text().await.ok()?;
            (text.contains(&consumers) && text.contains("fleet_queue_messages{queue=") && text.contains(settled))
                .then_some(text)
        })
        .await;
    let worker = fleet.worker_metrics(0).await;
    assert!(worker.contains("fleet_jobs_finished_total{kind=\"tool_call\",outcome=\"success\"} 1"));
    assert!(worker.contains("fleet_callback_responses_total{class=\"2xx\",kind=\"tool_call\"} 1"));
    for (process, text) in [("dispatcher", dispatcher), ("worker", worker)] {
        let mut child = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("promtool on PATH (deploy/prometheus/check.sh installs it; `make test` runs that first)");
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && report.trim().is_empty(), "promtool check metrics on the {process}: {report}");
    }
}

/// Spans reach an HTTPS collector that the fleet's CA vouches for. The OTLP exporter uses the
/// fleet's `ClientTls` like every other connection, so it honours `FLEET_TLS_CA_FILE`. A client of
/// its own would ignore it, and a collector behind HTTPS with the fleet's private CA get no span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_https_collector_that_the_fleets_ca_vouches_for() {
    use fleet_tests::tls::{path, TestCa, TlsFront};
    let collector = Collector::default();
    let plain = collector.start().await;
    let ca = TestCa::new("otlp");
    let front = TlsFront::start(plain.trim_start_matches("http://").parse().unwrap(), &ca.server("collector")).await;
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(
        FleetOptions::default()
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &front.url(""))
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env("FLEET_TLS_CA_FILE", &path(&ca.ca_file)),
    )
    .await;
    fleet.register_tool("traced", &receiver.url("/traced"), SECRET).await;
    let id = fleet.call_tool("traced", json!({"query": "x"})).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    wait_for("spans from the worker over HTTPS", Duration::from_secs(20), || async {
        let spans = collector.spans.lock().unwrap().clone();
        spans.iter().any(|(service, _)| service == "worker").then_some(())
    })
    .await;
}
