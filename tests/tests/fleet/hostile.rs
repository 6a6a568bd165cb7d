//! Tool owners that answer asynchronously or badly, and callback targets the fleet must refuse.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use fleet_protocol::secrets::SecretsKey;
use fleet_tests::fleet::TEST_SECRETS_KEY;
use fleet_tests::{redis_url, spawn_fleet, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_hostile_secret_0123";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_202_is_polled_until_the_result_is_ready() {
    // The status URL lives on a second receiver so that its polls are counted on their own.
    let polls = Arc::new(AtomicUsize::new(0));
    let polls_seen = polls.clone();
    let status = Receiver::start(SECRET, move |_, _| {
        if polls_seen.fetch_add(1, Ordering::SeqCst) < 2 {
            Reply::status(202)
        } else {
            Reply::result(json!({"async": "done"}))
        }
    })
    .await;
    let receiver_with_status = Receiver::start(SECRET, {
        let status_addr = status.addr;
        move |r, _| {
            let status_url = format!("http://{status_addr}/status/{}", r.execution_id());
            Reply {
                status: 202,
                body: json!({"status_url": status_url}).to_string(),
                delay: Duration::ZERO,
                headers: vec![],
            }
        }
    })
    .await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_ASYNC_POLL_INTERVAL", "0.1")).await;
    fleet.register_tool("async_tool", &receiver_with_status.url("/start"), SECRET).await;
    let id = fleet.call_tool("async_tool", json!({"query": "x"})).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(done["result"], json!({"async": "done"}));
    assert_eq!(polls.load(Ordering::SeqCst), 3, "polled until the status URL answered 200");
    assert_eq!(done["attempts"].as_array().unwrap().len(), 1, "async completion is one attempt");
    let poll = &status.received()[0];
    assert_eq!(poll.header("x-interactor-request-id"), Some(id.as_str()));
    assert!(poll.header("x-interactor-signature").is_some_and(|s| s.starts_with("sha256=")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_not_followed_and_large_bodies_fail_the_attempt() {
    let target = Receiver::echo(SECRET).await;
    let redirect_to = target.url("/internal");
    let receiver = Receiver::start(SECRET, move |r, _| match r.path.as_str() {
        "/redirect" => Reply::status(302).header("location", &redirect_to),
        _ => Reply { status: 200, body: "x".repeat(2 * 1024 * 1024), delay: Duration::ZERO, headers: vec![] },
    })
    .await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_RETRY_DELAYS", "0.1,0.1")).await;
    fleet.register_tool("redirector", &receiver.url("/redirect"), SECRET).await;
    fleet.register_tool("huge", &receiver.url("/huge"), SECRET).await;
    let redirected = fleet.call_tool("redirector", json!({"query": "x"})).await;
    let huge = fleet.call_tool("huge", json!({"query": "x"})).await;

    let done = fleet.wait_status(&redirected, "dead_lettered", Duration::from_secs(20)).await;
    assert_eq!(done["attempts"][0]["http_status"], 302);
    assert_eq!(done["attempts"][0]["outcome"], "permanent");
    assert!(target.received().is_empty(), "the redirect was not followed");

    let done = fleet.wait_status(&huge, "dead_lettered", Duration::from_secs(20)).await;
    let attempts = done["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3, "an oversized body is a retryable failure");
    assert!(attempts[0]["error"].as_str().unwrap().contains("limit"), "{}", attempts[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_targets_are_refused_at_connect_time() {
    // A listener on loopback that counts connections: it must see none.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let seen = connections.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            seen.fetch_add(1, Ordering::SeqCst);
        }
    });
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_ALLOW_PRIVATE_CALLBACKS", "false")).await;
    // The registry refuses these URLs, so plant tools as if their DNS had changed after registration.
    let key = SecretsKey::parse(TEST_SECRETS_KEY).unwrap();
    let client = redis::Client::open(redis_url()).unwrap();
    let mut con = fleet_tests::redis_connection(&client).await;
    let urls = [
        format!("http://localhost:{port}/x"),
        format!("http://127.0.0.1:{port}/x"),
        format!("http://[::ffff:127.0.0.1]:{port}/x"),
    ];
    let mut ids = vec![];
    for (n, url) in urls.iter().enumerate() {
        let name = format!("planted{n}");
        let tool = json!({"name": name, "description": "", "parameters": {}, "callback_url": url,
            "secret_ciphertext": key.encrypt(&format!("tool:{name}"), SECRET), "created_at_ms": 0, "updated_at_ms": 0});
        let _: () = redis::cmd("SET")
            .arg(fleet_protocol::keys::Keys::new(&fleet.key_prefix).tool(&name))
            .arg(tool.to_string())
            .query_async(&mut con)
            .await
            .unwrap();
        ids.push(fleet.call_tool(&name, json!({"query": "x"})).await);
    }
    for id in &ids {
        let done = fleet.wait_status(id, "dead_lettered", Duration::from_secs(20)).await;
        assert_eq!(done["attempts"].as_array().unwrap().len(), 1, "refused targets are permanent failures");
        assert!(done["last_error"].as_str().unwrap().contains("refused"), "{done}");
    }
    assert_eq!(connections.load(Ordering::SeqCst), 0, "no connection reached the loopback listener");
}
