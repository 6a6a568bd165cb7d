//! `fleet-demo`: the local demo's driver. Starts a small tool owner's receiver that verifies every
//! signature (independently of the fleet's code, with the seed's 300 s window), registers it as a
//! tool with the running dispatcher, sends one call and prints the verified result.

use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use fleet_tests::{wait_for, Receiver, Reply};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if let Some(addr) = std::env::args().nth(2).filter(|_| std::env::args().nth(1).as_deref() == Some("serve-llm")) {
        return serve_llm(&addr).await;
    }
    let api = std::env::var("FLEET_DEMO_API").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let token = std::env::var("FLEET_API_TOKENS")
        .context("FLEET_API_TOKENS must be set")?
        .split(',')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    let secret = "demo_callback_secret_0123456789";
    let receiver = Receiver::start(secret, |r, _| {
        let query = r.json["parameters"]["query"].as_str().unwrap_or("").to_string();
        Reply::result(json!({
            "products": [{"id": "prod_1", "name": format!("{query} pro 14\""), "price": 1999, "in_stock": true}],
            "total_count": 1
        }))
    })
    .await;
    let callback_url = receiver.url("/api/tools/search_products");
    println!("demo receiver listening at {callback_url}");

    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let tool = json!({
        "name": "search_products",
        "description": "Search the product catalog by query",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        "callback_url": callback_url,
        "callback_secret": secret,
    });
    let resp = http.put(format!("{api}/v1/tools/search_products")).bearer_auth(&token).json(&tool).send().await?;
    println!("PUT /v1/tools/search_products -> {}", resp.status());
    if !resp.status().is_success() {
        bail!("registering the demo tool failed: {}", resp.text().await?);
    }

    let call = json!({"tool_name": "search_products", "parameters": {"query": "laptop"}, "room_id": "room_demo", "assistant_id": "asst_demo"});
    let resp = http.post(format!("{api}/v1/tool-calls")).bearer_auth(&token).json(&call).send().await?;
    let status = resp.status();
    let body: Value = resp.json().await?;
    println!("POST /v1/tool-calls -> {status} {body}");
    let id = body["data"]["execution_id"].as_str().context("no execution_id in the 202")?.to_string();

    let execution = wait_for("the demo call to succeed", Duration::from_secs(30), || {
        let (http, api, token, id) = (http.clone(), api.clone(), token.clone(), id.clone());
        async move {
            let v: Value = http
                .get(format!("{api}/v1/executions/{id}"))
                .bearer_auth(&token)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            matches!(v["data"]["status"].as_str(), Some("succeeded" | "dead_lettered")).then(|| v["data"].clone())
        }
    })
    .await;
    let got = receiver.received_for(&id);
    let Some(delivery) = got.last() else { bail!("the receiver never saw the callback") };
    match &delivery.verified {
        Ok(()) => println!(
            "receiver: signature verified ({} over the raw body, timestamp {} within 300 s, request id {})",
            delivery.header("x-interactor-signature").unwrap_or_default().split('=').next().unwrap_or_default(),
            delivery.header("x-interactor-timestamp").unwrap_or_default(),
            delivery.header("x-interactor-request-id").unwrap_or_default(),
        ),
        Err(e) => bail!("receiver: signature did NOT verify: {e}"),
    }
    println!(
        "GET /v1/executions/{id} -> {} after {} attempt(s)",
        execution["status"],
        execution["attempts"].as_array().map(Vec::len).unwrap_or(0)
    );
    println!("verified result: {}", serde_json::to_string_pretty(&execution["result"])?);
    if execution["status"] != "succeeded" {
        bail!("the demo call did not succeed");
    }
    demo_turn(&http, &api, &token).await
}

/// An agent turn: the model calls the demo tool, reads its result and answers; the session's SSE
/// stream is printed as it arrives.
async fn demo_turn(http: &reqwest::Client, api: &str, token: &str) -> anyhow::Result<()> {
    use futures::StreamExt;
    let session = format!("demo_session_{}", std::process::id());
    println!("\n--- agent turn (session {session}) ---");
    let stream =
        reqwest::Client::new().get(format!("{api}/v1/sessions/{session}/stream")).bearer_auth(token).send().await?;
    let turn = json!({
        "session_id": session,
        "assistant": {"id": "asst_demo", "instructions": "Help the user shop.", "model_config": {"provider": "openai", "model": "demo-model", "temperature": 0.2}, "enabled_tools": ["search_products"]},
        "messages": [{"role": "user", "content": "Find me a laptop"}]
    });
    let resp = http.post(format!("{api}/v1/turns")).bearer_auth(token).json(&turn).send().await?;
    let body: Value = resp.json().await?;
    println!("POST /v1/turns -> {body}");
    let mut bytes = stream.bytes_stream();
    let mut buf = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    'read: while let Ok(Some(chunk)) = tokio::time::timeout_at(deadline, bytes.next()).await {
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            print!("{frame}");
            if frame.contains("\nevent: done\n") {
                break 'read;
            }
        }
    }
    let id = body["data"]["execution_id"].as_str().context("no execution_id")?;
    let v: Value = http.get(format!("{api}/v1/executions/{id}")).bearer_auth(token).send().await?.json().await?;
    println!(
        "turn {} after {} round(s): {}",
        v["data"]["status"], v["data"]["turn"]["rounds"], v["data"]["turn"]["final_message"]["content"]
    );
    if v["data"]["status"] != "succeeded" {
        bail!("the demo turn did not succeed");
    }
    Ok(())
}

/// A stand-in OpenAI-compatible model for the demo (used unless FLEET_LLM_BASE_URL is set): it
/// calls `search_products` with the user's words, then answers from the tool's result.
async fn serve_llm(addr: &str) -> anyhow::Result<()> {
    use fleet_tests::llm::{LlmReply, MockLlm};
    let llm = MockLlm::start_on(addr, |body, _| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        match messages.iter().rev().find(|m| m["role"] == "tool") {
            None => {
                LlmReply::ToolCalls(vec![("call_1".into(), "search_products".into(), r#"{"query":"laptop"}"#.into())])
            }
            Some(tool) => {
                let result: Value =
                    serde_json::from_str(tool["content"].as_str().unwrap_or("null")).unwrap_or(Value::Null);
                let name = result["products"][0]["name"].as_str().unwrap_or("nothing").to_string();
                LlmReply::Text {
                    tokens: format!("I found the {name} for you.").split_inclusive(' ').map(str::to_string).collect(),
                    delay: Duration::from_millis(40),
                }
            }
        }
    })
    .await;
    println!("demo model listening at {}", llm.base_url());
    std::future::pending::<()>().await;
    Ok(())
}
