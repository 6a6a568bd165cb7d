//! Part 7: what seed 001's agent parts add to a turn, each beside the turn that differs from it
//! only by that part, in one run on one fleet: a step transition (beside a round whose call is
//! answered at once, as a handoff is), an override resolution of three `$ref`s (beside the same
//! tool called without a configuration), and a structured-output check (beside a plain answer).
//! A turn's figure is its seed 001 input's 201 less its model calls' own time; each variant has a
//! session of its own, and the variants take turns (round robin), so history grows alike in each
//! and the machine's noise falls on all of them alike.

use std::time::Instant;

use anyhow::Context;
use lapin::Connection;
use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};

use super::{median, row, BenchFleet, Receiver};

/// Which turn the model plays, read from the agent's instructions (`MODE:…`).
fn mode_of(body: &Value) -> String {
    let system = body["messages"][0]["content"].as_str().unwrap_or_default();
    system.split("MODE:").nth(1).and_then(|m| m.split_whitespace().next()).unwrap_or("plain").to_string()
}

fn call(name: &str, arguments: Value) -> LlmReply {
    LlmReply::ToolCalls(vec![("call_1".into(), name.into(), arguments.to_string())])
}

/// The model of every variant: one call (or handoff) first where the variant makes one, then the
/// answer.
fn script(body: &Value, _: usize) -> LlmReply {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let answered = messages.last().is_some_and(|m| m["role"] == "tool");
    let said = messages.iter().rev().find(|m| m["role"] == "user").and_then(|m| m["content"].as_str()).unwrap_or("");
    match mode_of(body).as_str() {
        _ if answered => LlmReply::text("done"),
        "structured" => LlmReply::text("{\"total\": 1}"),
        "refused" => call("not_a_tool", json!({})),
        "transition" => call("transition_to_step", json!({"step_name": "b", "handoff_message": "over to b"})),
        "tool" => call("bench", json!({"q": 1})),
        "configured" if said == "seed" => call("bench_seed", json!({"q": 1})),
        "configured" => call("bench_cfg", json!({"q": 1})),
        _ => LlmReply::text("done"),
    }
}

/// One variant: its agent's definition (beyond name, title and instructions).
struct Variant {
    name: &'static str,
    mode: &'static str,
    extra: Value,
    entry_step: Option<&'static str>,
}

fn variants() -> Vec<Variant> {
    let v = |name, mode, extra, entry_step| Variant { name, mode, extra, entry_step };
    vec![
        v("plain", "plain", json!({}), None),
        v(
            "structured",
            "structured",
            json!({"output_schemas": {"out": {"type": "object",
            "properties": {"total": {"type": "number"}}, "required": ["total"]}}, "output_schema": "out"}),
            None,
        ),
        v("refused", "refused", json!({}), None),
        v(
            "transition",
            "transition",
            json!({"steps": {"a": {"instructions": "step a", "next_steps": ["b"]},
            "b": {"instructions": "step b"}}, "first_step_name": "a"}),
            Some("a"),
        ),
        v("tool", "tool", json!({"enabled_tools": ["bench"]}), None),
        v(
            "configured",
            "configured",
            json!({"secrets": {"key": "bench-secret-value"}, "tool_configurations": {
            "bench_seed": {"tool_name": "bench"},
            "bench_cfg": {"tool_name": "bench", "argument_overrides": {
                "auth.key": {"$ref": "secrets.key"}, "account": {"$ref": "metadata.account"},
                "prior": {"$ref": "tool_outputs.bench_seed"}}}}}),
            None,
        ),
    ]
}

/// The medians (ms) of each variant's turns, less their model calls.
pub(super) async fn agent_phase(conn: &Connection, turns: usize) -> anyhow::Result<Vec<(&'static str, f64)>> {
    let llm = MockLlm::start(script).await;
    let receiver = Receiver::start(std::time::Duration::ZERO).await;
    let base = llm.base_url();
    let mut fleet = BenchFleet::start(&[("FLEET_LLM_BASE_URL", &base)]).await?;
    fleet.add_worker().await?;
    fleet.register(&format!("http://{}/bench", receiver.addr)).await?;
    let variants = variants();
    let mut sessions = Vec::new();
    for variant in &variants {
        let session = prepare(&fleet, variant).await?;
        if variant.mode == "configured" {
            send(&fleet, variant, &session, "seed").await?;
        }
        sessions.push(session);
    }
    // Round robin: the machine's noise falls on every variant alike.
    let mut times = vec![Vec::new(); variants.len()];
    for _ in 0..turns {
        for (i, (variant, session)) in variants.iter().zip(&sessions).enumerate() {
            let before = llm.requests().len();
            let t0 = Instant::now();
            send(&fleet, variant, session, "go").await?;
            let elapsed = t0.elapsed();
            let model: std::time::Duration =
                llm.requests()[before..].iter().map(|r| r.ended.unwrap_or(r.started) - r.started).sum();
            times[i].push(elapsed.saturating_sub(model).as_secs_f64() * 1000.0);
        }
    }
    let medians = variants.iter().zip(times).map(|(v, t)| (v.name, median(t))).collect();
    fleet.stop(conn).await;
    Ok(medians)
}

/// Creates the variant's agent (and, for overrides, a room with metadata as its session).
async fn prepare(fleet: &BenchFleet, variant: &Variant) -> anyhow::Result<String> {
    let mut agent = json!({"name": format!("bench_{}", variant.name), "title": "bench",
        "instructions": format!("MODE:{} answer briefly", variant.mode)});
    for (k, v) in variant.extra.as_object().into_iter().flatten() {
        agent[k] = v.clone();
    }
    let created: Value = post(fleet, "/v1/agents/assistants", &agent).await?;
    let id = created["data"]["id"].as_str().context("the agent's id")?.to_string();
    if variant.mode != "configured" {
        return Ok(format!("bench_{}", variant.name));
    }
    let room: Value = post(fleet, &format!("/v1/agents/{id}/rooms"), &json!({"metadata": {"account": "A-1"}})).await?;
    Ok(room["data"]["id"].as_str().or(room["id"].as_str()).context("the room's id")?.to_string())
}

/// One seed 001 input, answered 201 once its turn is done.
async fn send(fleet: &BenchFleet, variant: &Variant, session: &str, text: &str) -> anyhow::Result<()> {
    let mut input = json!({"type": "input", "messages": [{"type": "text", "content": text}]});
    if let Some(step) = variant.entry_step {
        input["entry_step"] = json!(step);
    }
    let path = format!("/v2/agents/bench_{}/sessions/{session}/events", variant.name);
    let answer = post(fleet, &path, &input).await?;
    let kinds: Vec<&str> =
        answer["events"].as_array().into_iter().flatten().filter_map(|e| e["type"].as_str()).collect();
    anyhow::ensure!(!kinds.contains(&"error") && kinds.last() != Some(&"input_message"), "{}: {answer}", variant.name);
    Ok(())
}

async fn post(fleet: &BenchFleet, path: &str, body: &Value) -> anyhow::Result<Value> {
    let resp = fleet.http.post(format!("{}{path}", fleet.api)).bearer_auth(&fleet.token).json(body).send().await?;
    let status = resp.status();
    let answer: Value = resp.json().await?;
    anyhow::ensure!(status.is_success(), "{path}: {status} {answer}");
    Ok(answer)
}

/// Each part's overhead: its variant's median less its baseline's, in one table.
pub(super) fn print(medians: &[(&'static str, f64)]) {
    let of = |name: &str| medians.iter().find(|(n, _)| *n == name).map_or(f64::NAN, |(_, m)| *m);
    for (name, ms) in medians {
        row(&format!("agent: turn `{name}`, fleet's time, median (ms)"), format!("{ms:.2}"), "", "".into());
    }
    let parts = [
        ("a step transition", "transition", "refused"),
        ("an override resolution (3 $refs)", "configured", "tool"),
        ("a structured-output check", "structured", "plain"),
    ];
    for (part, with, without) in parts {
        let added = of(with) - of(without);
        row(&format!("agent: {part} adds, median (ms)"), format!("{added:.2}"), "<= 1 ms", "".into());
    }
}
