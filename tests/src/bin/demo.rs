//! `fleet-demo`: the local demo's driver. Starts a small tool owner's receiver that verifies every
//! signature (independently of the fleet's code, with the seed's 300 s window), registers it as a
//! tool with the running dispatcher, sends one call and prints the verified result.

use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use fleet_tests::{wait_for, Receiver, Reply};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
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
    Ok(())
}
