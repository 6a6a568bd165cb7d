//! `fleet-demo`: the local demo's driver. Starts a small tool owner's receiver that verifies every
//! signature (independently of the fleet's code, with the seed's 300 s window), registers it as a
//! tool with the running dispatcher, sends one call and prints the verified result. Then an agent
//! turn that calls that tool, and one that calls an MCP server's tool: an order-lookup server on
//! the official Rust SDK (`fleet_tests::rust_mcp`), registered with the dispatcher, its tools
//! discovered, the model's call a durable job whose structured result the turn reads.

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
    let user = "Find me a laptop";
    demo_turn(&http, &api, &token, "agent turn", &["search_products"], user).await?;
    demo_mcp(&http, &api, &token).await
}

/// An MCP server's tool: the server registered (its tools discovered), then a turn whose model
/// calls it; the call's execution shows the server's structured result.
async fn demo_mcp(http: &reqwest::Client, api: &str, token: &str) -> anyhow::Result<()> {
    let server = fleet_tests::rust_mcp::RustMcpServer::start().await?;
    println!("\n--- an MCP server's tool ---\ndemo MCP server (official Rust SDK) listening at {}", server.url);
    let body = json!({"name": "orders", "url": server.url});
    let resp = http.post(format!("{api}/v1/mcp_servers")).bearer_auth(token).json(&body).send().await?;
    let status = resp.status();
    let registered: Value = resp.json().await?;
    // A fleet kept from an earlier demo (DEMO_KEEP) already has it: discover it again instead.
    let registered = if status.as_u16() == 409 {
        let url = format!("{api}/v1/mcp_servers/orders");
        http.delete(&url).bearer_auth(token).send().await?;
        http.post(format!("{api}/v1/mcp_servers")).bearer_auth(token).json(&body).send().await?.json().await?
    } else {
        registered
    };
    println!("POST /v1/mcp_servers -> {status}: tools {}", registered["data"]["tools"]);
    let user = "Where is my order o-1001?";
    let id = demo_turn(http, api, token, "agent turn with an MCP tool", &["orders.lookup_order"], user).await?;
    let v: Value = http.get(format!("{api}/v1/executions/{id}")).bearer_auth(token).send().await?.json().await?;
    let call = v["data"]["turn"]["tool_calls"][0]["execution_id"].as_str().context("the turn's MCP call")?;
    let v: Value = http.get(format!("{api}/v1/executions/{call}")).bearer_auth(token).send().await?.json().await?;
    println!(
        "the MCP call {call}: {} after {} attempt(s), tools/call answered {} time(s); its result: {}",
        v["data"]["status"],
        v["data"]["attempts"].as_array().map(Vec::len).unwrap_or(0),
        server.calls(),
        v["data"]["external_result"]
    );
    server.stop().await;
    if v["data"]["status"] != "succeeded" {
        bail!("the demo's MCP call did not succeed");
    }
    Ok(())
}

/// An agent turn with `tools` enabled: the model calls one, reads its result and answers; the
/// session's SSE stream is printed as it arrives. The turn's execution id.
async fn demo_turn(
    http: &reqwest::Client,
    api: &str,
    token: &str,
    title: &str,
    tools: &[&str],
    said: &str,
) -> anyhow::Result<String> {
    use futures::StreamExt;
    let session = format!("demo_session_{}_{}", std::process::id(), tools.len() + said.len());
    println!("\n--- {title} (session {session}) ---");
    let stream =
        reqwest::Client::new().get(format!("{api}/v1/sessions/{session}/stream")).bearer_auth(token).send().await?;
    let turn = json!({
        "session_id": session,
        "assistant": {"id": "asst_demo", "instructions": "Help the user shop.", "model_config": {"provider": "openai", "model": "demo-model", "temperature": 0.2}, "enabled_tools": tools},
        "messages": [{"role": "user", "content": said}]
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
    Ok(id.to_string())
}

/// A stand-in OpenAI-compatible model for the demo (used unless FLEET_LLM_BASE_URL is set): it
/// calls the tool it is offered (`search_products` with the user's words, or the MCP server's
/// `orders__lookup_order`), then answers from the tool's result.
async fn serve_llm(addr: &str) -> anyhow::Result<()> {
    use fleet_tests::llm::{LlmReply, MockLlm};
    let llm = MockLlm::start_on(addr, |body, _| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let offered = body["tools"][0]["function"]["name"].as_str().unwrap_or("search_products").to_string();
        let said = |text: &str| LlmReply::Text {
            tokens: text.split_inclusive(' ').map(str::to_string).collect(),
            delay: Duration::from_millis(40),
        };
        match messages.iter().rev().find(|m| m["role"] == "tool") {
            None if offered == "search_products" => {
                LlmReply::ToolCalls(vec![("call_1".into(), "search_products".into(), r#"{"query":"laptop"}"#.into())])
            }
            None => LlmReply::ToolCalls(vec![("call_1".into(), offered, r#"{"order_id":"o-1001"}"#.into())]),
            Some(tool) if offered != "search_products" => {
                let shipped = tool["content"].to_string().contains("shipped");
                said(if shipped { "Your order o-1001 has shipped." } else { "I could not find order o-1001." })
            }
            Some(tool) => {
                let result: Value =
                    serde_json::from_str(tool["content"].as_str().unwrap_or("null")).unwrap_or(Value::Null);
                let name = result["products"][0]["name"].as_str().unwrap_or("nothing").to_string();
                said(&format!("I found the {name} for you."))
            }
        }
    })
    .await;
    println!("demo model listening at {}", llm.base_url());
    std::future::pending::<()>().await;
    Ok(())
}
