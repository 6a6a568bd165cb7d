//! Tool calls shared fairly across tenants, with real processes: a tenant's new call takes the
//! light lane (`<prefix>.work.tool_calls.light`) while the tenant is not flooding the fleet, so it
//! never waits behind another tenant's backlog in the work queue; and within a tenant, as its
//! calls come faster than its lane allows, its `high` calls keep the lane and its `low` ones leave
//! it first. One worker slot and a receiver that takes 5 ms a call make the worker what is scarce.
//! And a flooding tenant's submissions are taken in a few at a time by the dispatcher, none lost.

use std::time::Duration;

use serde_json::{json, Value};

use fleet_tests::{spawn_fleet, wait_for, Fleet, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_fair_calls_secret_01";

/// A fleet with one worker slot whose tenants may each send 10 calls at once to the light lane
/// and one every ten seconds after; a receiver that takes 5 ms a call.
async fn scarce_fleet() -> (Fleet, Receiver) {
    let receiver =
        Receiver::start(SECRET, |_, _| Reply::result(json!({"ok": true})).after(Duration::from_millis(5))).await;
    let options = FleetOptions::default()
        .env("FLEET_WORKER_CONCURRENCY", "1")
        .env("FLEET_LIGHT_LANE_CALL_BURST", "10")
        .env("FLEET_LIGHT_LANE_CALL_RATE", "0.1");
    let fleet = spawn_fleet(options).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    (fleet, receiver)
}

fn call(query: &str, tenant: &str, priority: &str) -> Value {
    json!({"tool_name": "echo", "parameters": {"query": query}, "tenant": tenant, "priority": priority})
}

/// Posts `calls` as one batch.
async fn post_batch(fleet: &Fleet, calls: Vec<Value>) {
    let (status, body) = fleet.post("/v1/tool-calls/batch", &json!({ "calls": calls })).await;
    assert_eq!(status, 202, "{body}");
}

/// The queries the receiver was sent, in the order it was sent them, once there are `n`.
async fn queries_once(receiver: &Receiver, n: usize) -> Vec<String> {
    wait_for("every call to reach the receiver", Duration::from_secs(90), || async {
        let received = receiver.received();
        (received.len() >= n).then(|| received.iter().map(|r| r.json["parameters"]["query"].to_string()).collect())
    })
    .await
}

/// How many of `prefix`'s calls the receiver got after `query`.
fn after(order: &[String], query: &str, prefix: &str) -> usize {
    let at = order.iter().position(|q| q.contains(query)).unwrap_or_else(|| panic!("{query} never ran: {order:?}"));
    order[at..].iter().filter(|q| q.contains(prefix)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_light_tenants_call_skips_a_flooding_tenants_backlog() {
    let (fleet, receiver) = scarce_fleet().await;
    post_batch(&fleet, (0..300).map(|i| call(&format!("flood-{i}"), "acme", "normal")).collect()).await;
    wait_for("the flood's first call", Duration::from_secs(20), || async {
        (!receiver.received().is_empty()).then_some(())
    })
    .await;
    let (status, body) = fleet.post("/v1/tool-calls", &call("light-0", "globex", "normal")).await;
    assert_eq!(status, 202, "{body}");
    let order = queries_once(&receiver, 301).await;
    let flood_after = after(&order, "light-0", "flood-");
    println!("flood calls after the light tenant's: {flood_after} of 300");
    assert!(flood_after >= 200, "the light tenant's call waited behind the flood ({flood_after} of 300 after it)");
    assert_eq!(order.len(), 301, "each call ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_high_calls_keep_the_lane_and_its_low_ones_leave_it_first() {
    let (fleet, receiver) = scarce_fleet().await;
    // 300 normal calls: 10 take the lane, 290 wait in the work queue; then a low call (the
    // bucket is empty: it joins the work queue behind them) and a high one (it borrows a token).
    post_batch(&fleet, (0..300).map(|i| call(&format!("normal-{i}"), "acme", "normal")).collect()).await;
    post_batch(&fleet, vec![call("low-0", "acme", "low"), call("high-0", "acme", "high")]).await;
    let order = queries_once(&receiver, 302).await;
    let (normal_after_high, normal_after_low) = (after(&order, "high-0", "normal-"), after(&order, "low-0", "normal-"));
    println!("normal calls after the high one: {normal_after_high} of 300; after the low one: {normal_after_low}");
    assert!(
        normal_after_high >= 200,
        "the high call waited behind its tenant's backlog ({normal_after_high} after it)"
    );
    assert_eq!(normal_after_low, 0, "the low call left the lane and ran after every normal one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_tenants_submissions_wait_for_their_places_and_none_is_lost() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::result(json!({"ok": true}))).await;
    let options = FleetOptions::default()
        .env("FLEET_LIGHT_LANE_CALL_BURST", "2")
        .env("FLEET_LIGHT_LANE_CALL_RATE", "0.01")
        .env("FLEET_FLOODING_TENANT_SUBMISSIONS", "1");
    let fleet = spawn_fleet(options).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    // globex uses the dispatcher too (alone, acme would not be held back).
    let (status, body) = fleet.post("/v1/tool-calls", &call("other-0", "globex", "normal")).await;
    assert_eq!(status, 202, "{body}");
    for i in 0..3 {
        let (status, body) = fleet.post("/v1/tool-calls", &call(&format!("first-{i}"), "acme", "normal")).await;
        assert_eq!(status, 202, "{body}");
    }
    // acme is flooding now: one of its submissions is taken in at a time. A batch of 500 holds
    // that place while it writes its records, and 20 single calls come beside it.
    let single_calls: Vec<Value> = (0..20).map(|i| call(&format!("single-{i}"), "acme", "normal")).collect();
    let singles = futures::future::join_all(single_calls.iter().map(|c| fleet.post("/v1/tool-calls", c)));
    let batch = post_batch(&fleet, (0..500).map(|i| call(&format!("batch-{i}"), "acme", "normal")).collect());
    let (singles, ()) = tokio::join!(singles, batch);
    assert!(singles.iter().all(|(status, _)| *status == 202), "{singles:?}");
    let text = fleet.http.get(format!("{}/metrics", fleet.api)).send().await.unwrap().text().await.unwrap();
    let held = fleet_tests::metric(&text, "fleet_submissions_held_total{kind=\"tool_call\"}");
    println!("submissions that waited for acme's place: {held} of 21");
    assert!(held >= 1.0, "no submission of the flooding tenant waited for its place");
    let mut order = queries_once(&receiver, 524).await;
    order.sort();
    order.dedup();
    assert_eq!(order.len(), 524, "each call ran once");
}
