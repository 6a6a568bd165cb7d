//! A tool owner who writes the receiver from the seed: its Redis idempotency example, literally
//! (`idempotency:${executionId}`, GET then SETEX for 7 days), in the same Redis as a fleet running
//! with the default key prefix, runs each call once and its result is the one kept; and a 2xx
//! answer that is not the seed's `{"result": …}` is never taken for the tool's result.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use fleet_tests::{spawn_fleet, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_seed_receiver_0123456789";
const IDEMPOTENCY_TTL: u64 = 7 * 24 * 60 * 60;

/// The seed's `handleWithIdempotency` around a handler that counts its runs.
async fn seed_handler(State(runs): State<Arc<AtomicU32>>, Json(data): Json<Value>) -> Json<Value> {
    let client = redis::Client::open(fleet_tests::redis_url()).unwrap();
    let mut redis = fleet_tests::redis_connection(&client).await;
    let cache_key = format!("idempotency:{}", data["execution_id"].as_str().unwrap());
    let cached: Option<String> = redis::AsyncCommands::get(&mut redis, &cache_key).await.unwrap();
    if let Some(cached) = cached {
        return Json(json!({"result": serde_json::from_str::<Value>(&cached).unwrap()}));
    }
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    let result = json!({"products": ["laptop"], "run": n});
    let _: () =
        redis::AsyncCommands::set_ex(&mut redis, &cache_key, result.to_string(), IDEMPOTENCY_TTL).await.unwrap();
    Json(json!({"result": result}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_idempotency_example_beside_the_fleets_default_keys_runs_each_call_once() {
    let runs = Arc::new(AtomicU32::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api/tools/search_products", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(axum::routing::post(seed_handler)).with_state(runs.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let options = FleetOptions { default_key_prefix: true, ..FleetOptions::default() };
    let fleet = spawn_fleet(options).await;
    assert_eq!(fleet.key_prefix, "fleet:");
    fleet.register_tool("seed_receiver_search", &url, SECRET).await;
    let id = fleet.call_tool("seed_receiver_search", json!({"query": "laptop"})).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(done["result"], json!({"products": ["laptop"], "run": 1}), "{done}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the tool ran once");
    // The receiver's key and the fleet's are different keys of the same Redis.
    assert!(!fleet.redis_keys(&format!("idempotency:{id}")).await.is_empty(), "the fleet's own claim");
    let mut redis = fleet.redis().await;
    let theirs: Option<String> = redis::AsyncCommands::get(&mut redis, format!("idempotency:{id}")).await.unwrap();
    assert!(theirs.is_some_and(|t| t.contains("laptop")), "the receiver's own cached result");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2xx_answer_without_result_is_not_taken_for_the_tools_result() {
    let receiver =
        Receiver::start(SECRET, |_, _| Reply { body: r#"{"state":"claimed","token":3}"#.into(), ..Reply::status(200) })
            .await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("resultless", &receiver.url("/t"), SECRET).await;
    let id = fleet.call_tool("resultless", json!({"query": "x"})).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(done["result"], Value::Null, "only the seed's {{\"result\": …}} is a result: {done}");
}
