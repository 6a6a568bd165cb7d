//! Signature schemes per tool and per webhook, checked by independent verifiers: a
//! `standard-webhooks` registration's requests are accepted by the reference `standardwebhooks`
//! crate holding the secret the owner registered, with `webhook-id` the same on every retry; the
//! default scheme still passes the seed's verifier; and a `rotate_secret` keeps the previous secret
//! signing (Standard Webhooks) until the grace period ends, then only the new one verifies.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use reqwest::Method;
use serde_json::{json, Value};

use fleet_protocol::timefmt::millis_from_rfc3339;
use fleet_tests::receiver::{self, Received, Verifier};
use fleet_tests::{spawn_fleet, wait_for, Fleet, FleetOptions, Receiver, Reply};

/// The grace period the rotation tests run with: long enough for a delivery under load to be
/// signed within it, short enough to wait for its end.
const GRACE_SECS: i64 = 12;

/// A secret as the spec describes them: `whsec_` and the base64 of 32 random bytes.
fn standard_secret() -> String {
    let mut key = uuid::Uuid::new_v4().as_bytes().to_vec();
    key.extend(uuid::Uuid::new_v4().as_bytes());
    format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode(key))
}

/// What a tool owner writes with the reference library and the secret they registered.
fn reference_check(secret: &str, headers: &HashMap<String, String>, body: &[u8]) -> Result<(), String> {
    let hook = standardwebhooks::Webhook::new(secret).map_err(|e| e.to_string())?;
    let mut map = axum::http::HeaderMap::new();
    for (name, value) in headers {
        let name = axum::http::HeaderName::from_bytes(name.as_bytes()).map_err(|e| e.to_string())?;
        map.insert(name, value.parse().map_err(|_| "header value".to_string())?);
    }
    hook.verify(body, &map).map_err(|e| e.to_string())
}

fn reference_verifier(secret: &str) -> Verifier {
    let secret = secret.to_string();
    Arc::new(move |headers, body| reference_check(&secret, headers, body))
}

/// The receiver refuses what its verifier refuses, as a tool owner would.
fn answer_if_verified(r: &Received) -> Reply {
    match &r.verified {
        Ok(()) => Reply::result(json!({"ok": true})),
        Err(_) => Reply::status(401),
    }
}

fn signature_count(r: &Received) -> usize {
    r.header("webhook-signature").map_or(0, |s| s.split(' ').count())
}

/// The signing time of a Standard Webhooks request, in ms.
fn signed_at_ms(r: &Received) -> i64 {
    r.header("webhook-timestamp").and_then(|t| t.parse::<i64>().ok()).expect("webhook-timestamp in seconds") * 1000
}

async fn put(fleet: &Fleet, path: &str, body: Value) -> (u16, Value) {
    fleet.request(Method::PUT, path, Some(&body)).await
}

/// When the rotated-out secret expires, as the registration's GET says (ms).
fn previous_expiry(data: &Value) -> i64 {
    let at = data["previous_secret_expires_at"].as_str().unwrap_or_else(|| panic!("no expiry in {data}"));
    millis_from_rfc3339(at).unwrap()
}

/// Waits until the registration at `path` no longer shows a previous secret.
async fn wait_rotation_over(fleet: &Fleet, path: &str) {
    wait_for("the rotation's grace period to end", Duration::from_secs(GRACE_SECS as u64 + 20), || async {
        let (_, body) = fleet.get(path).await;
        body["data"]["previous_secret_expires_at"].is_null().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_callbacks_verify_with_the_reference_library() {
    let secret = standard_secret();
    // The first delivery of each execution is answered 503, so every call is retried once.
    let owner = Receiver::start_verifying(reference_verifier(&secret), |r, n| match n {
        0 => Reply::status(503),
        _ => answer_if_verified(r),
    })
    .await;
    let seed_owner = Receiver::start("plain-seed-secret-0123", |r, _| answer_if_verified(r)).await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_RETRY_DELAYS", "0.2,0.4")).await;

    let tool = json!({"callback_url": owner.url("/sw"), "callback_secret": secret, "signature": "standard-webhooks"});
    let (status, body) = put(&fleet, "/v1/tools/sw", tool).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["data"]["signature"], "standard-webhooks");
    assert!(body["data"]["previous_secret_expires_at"].is_null());
    assert!(!body.to_string().contains(&secret[6..]), "the secret is never returned: {body}");
    fleet.register_tool("seed", &seed_owner.url("/seed"), "plain-seed-secret-0123").await;
    assert_eq!(fleet.get("/v1/tools/seed").await.1["data"]["signature"], "interactor", "the default");

    let id = fleet.call_tool("sw", json!({"query": "x"})).await;
    let record = fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(record["result"], json!({"ok": true}));
    let requests = owner.received_for(&id);
    assert_eq!(requests.len(), 2, "one retry");
    for r in &requests {
        assert_eq!(r.verified, Ok(()), "the reference library accepts every attempt");
        assert_eq!(r.header("webhook-id"), Some(id.as_str()), "webhook-id is the execution id on every attempt");
        assert_eq!(signature_count(r), 1);
        assert!(r.header("x-interactor-signature").is_none());
        assert_eq!(r.json["execution_id"], id.as_str());
    }

    let seed_id = fleet.call_tool("seed", json!({"query": "x"})).await;
    fleet.wait_status(&seed_id, "succeeded", Duration::from_secs(30)).await;
    let seed_request = &seed_owner.received_for(&seed_id)[0];
    assert_eq!(seed_request.verified, Ok(()), "the seed's verifier accepts the default scheme");
    assert!(seed_request.header("webhook-signature").is_none());

    // What the API refuses: a secret the libraries cannot read, an unknown scheme, a rotation
    // without a new secret or on a create, and switching a plain-secret tool to the new scheme.
    let refused = [
        (
            "/v1/tools/bad",
            json!({"callback_url": owner.url("/b"), "callback_secret": "plain secret of some length", "signature": "standard-webhooks"}),
            "must be base64",
        ),
        (
            "/v1/tools/bad",
            json!({"callback_url": owner.url("/b"), "callback_secret": secret, "signature": "hmac"}),
            "hmac",
        ),
        ("/v1/tools/sw", json!({"rotate_secret": true}), "needs the new secret"),
        (
            "/v1/tools/new",
            json!({"callback_url": owner.url("/b"), "callback_secret": secret, "rotate_secret": true}),
            "existing registration",
        ),
        ("/v1/tools/seed", json!({"signature": "standard-webhooks"}), "must be base64"),
    ];
    for (path, body, why) in refused {
        let (status, answer) = put(&fleet, path, body.clone()).await;
        assert_eq!(status, 422, "{body} → {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(why), "{body} → {answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_tool_secret_overlaps_until_the_grace_period_ends() {
    let (old, new) = (standard_secret(), standard_secret());
    // The owner has deployed the new secret; the old one is checked on the recorded requests.
    let owner = Receiver::start_verifying(reference_verifier(&new), |r, _| answer_if_verified(r)).await;
    let seed_owner = Receiver::start("the-seed-new-secret-1", |r, _| answer_if_verified(r)).await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_SECRET_ROTATION_GRACE", &GRACE_SECS.to_string())).await;
    let tool = json!({"callback_url": owner.url("/sw"), "callback_secret": old, "signature": "standard-webhooks"});
    assert_eq!(put(&fleet, "/v1/tools/sw", tool).await.0, 201);
    fleet.register_tool("seed", &seed_owner.url("/seed"), "the-seed-old-secret-1").await;

    let before = fleet_platform::now_ms();
    let (status, body) = put(&fleet, "/v1/tools/sw", json!({"callback_secret": new, "rotate_secret": true})).await;
    let after = fleet_platform::now_ms();
    assert_eq!(status, 200, "{body}");
    let expires = previous_expiry(&body["data"]);
    // The stored expiry has millisecond precision; the window is the request's own.
    assert!((before + GRACE_SECS * 1000..=after + GRACE_SECS * 1000).contains(&expires), "{expires}");
    let (_, shown) = fleet.get("/v1/tools/sw").await;
    assert_eq!(previous_expiry(&shown["data"]), expires);
    assert!(!shown.to_string().contains(&old[6..]) && !shown.to_string().contains(&new[6..]), "{shown}");
    let rotate_seed = json!({"callback_secret": "the-seed-new-secret-1", "rotate_secret": true});
    assert_eq!(put(&fleet, "/v1/tools/seed", rotate_seed).await.0, 200);

    let during = fleet.call_tool("sw", json!({"query": "during"})).await;
    let seed_call = fleet.call_tool("seed", json!({"query": "during"})).await;
    fleet.wait_status(&during, "succeeded", Duration::from_secs(30)).await;
    fleet.wait_status(&seed_call, "succeeded", Duration::from_secs(30)).await;
    let r = &owner.received_for(&during)[0];
    assert!(signed_at_ms(r) < expires, "signed within the grace period (the test needs it)");
    assert_eq!(signature_count(r), 2, "both secrets sign during the grace period");
    assert_eq!(reference_check(&new, &r.headers, &r.body), Ok(()));
    assert_eq!(reference_check(&old, &r.headers, &r.body), Ok(()), "a receiver still on the old secret accepts");
    // The seed's scheme signs with the new secret at once; the old one is only kept.
    let s = &seed_owner.received_for(&seed_call)[0];
    assert_eq!(s.verified, Ok(()));
    assert!(receiver::verify(b"the-seed-old-secret-1", &s.headers, &s.body).is_err());
    assert!(fleet.get("/v1/tools/seed").await.1["data"]["previous_secret_expires_at"].is_string());

    wait_rotation_over(&fleet, "/v1/tools/sw").await;
    let later = fleet.call_tool("sw", json!({"query": "after"})).await;
    fleet.wait_status(&later, "succeeded", Duration::from_secs(30)).await;
    let r = &owner.received_for(&later)[0];
    assert!(signed_at_ms(r) >= expires - 1000);
    assert_eq!(signature_count(r), 1, "only the new secret signs after the grace period");
    assert_eq!(reference_check(&new, &r.headers, &r.body), Ok(()));
    assert_eq!(reference_check(&old, &r.headers, &r.body), Err("signature invalid".to_string()));
}

/// A tool that always answers 404: each call is dead-lettered at once and sends
/// `tool.callback.failed` to the subscribed webhook.
async fn failing_call(fleet: &Fleet) -> String {
    let id = fleet.call_tool("broken", json!({"query": "x"})).await;
    fleet.wait_status(&id, "dead_lettered", Duration::from_secs(30)).await;
    id
}

/// The `tool.callback.failed` deliveries for the call `call_id`, once there are `count`.
async fn deliveries_for(hooks: &Receiver, call_id: &str, count: usize) -> Vec<Received> {
    wait_for("the failure event's deliveries", Duration::from_secs(30), || async {
        let got: Vec<Received> =
            hooks.received().into_iter().filter(|r| r.json["data"]["execution_id"] == call_id).collect();
        (got.len() >= count).then_some(got)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_subscription_signs_the_standard_way_and_rotates_with_overlap() {
    let (old, new) = (standard_secret(), standard_secret());
    let tool = Receiver::start("tool-secret-0123456789", |_, _| Reply::status(404)).await;
    // Each delivery's first attempt is answered 503: the retry must carry the same webhook-id.
    let hooks = Receiver::start_verifying(reference_verifier(&new), |r, n| match n {
        0 => Reply::status(503),
        _ => answer_if_verified(r),
    })
    .await;
    let fleet = spawn_fleet(
        FleetOptions::default()
            .env("FLEET_RETRY_DELAYS", "0.2,0.4")
            .env("FLEET_SECRET_ROTATION_GRACE", &GRACE_SECS.to_string()),
    )
    .await;
    fleet.register_tool("broken", &tool.url("/broken"), "tool-secret-0123456789").await;
    let hook = json!({"url": hooks.url("/events"), "secret": old, "events": ["tool.callback.failed"], "signature": "standard-webhooks"});
    let (status, body) = put(&fleet, "/v1/webhooks/ops", hook).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["data"]["signature"], "standard-webhooks");
    let (status, body) = put(&fleet, "/v1/webhooks/ops", json!({"secret": new, "rotate_secret": true})).await;
    assert_eq!(status, 200, "{body}");
    let expires = previous_expiry(&body["data"]);
    assert!(!body.to_string().contains(&old[6..]) && !body.to_string().contains(&new[6..]));

    let during = deliveries_for(&hooks, &failing_call(&fleet).await, 2).await;
    assert_eq!(during[0].execution_id(), during[1].execution_id(), "webhook-id is stable across the retry");
    assert!(during[0].execution_id().starts_with("exec_"));
    assert!(signed_at_ms(&during[0]) < expires, "signed within the grace period (the test needs it)");
    for r in during.iter().filter(|r| signed_at_ms(r) < expires) {
        assert_eq!(signature_count(r), 2);
        assert_eq!(reference_check(&old, &r.headers, &r.body), Ok(()));
        assert_eq!(reference_check(&new, &r.headers, &r.body), Ok(()));
    }
    assert_eq!(during[1].verified, Ok(()), "the retry was accepted");

    wait_rotation_over(&fleet, "/v1/webhooks/ops").await;
    let after = deliveries_for(&hooks, &failing_call(&fleet).await, 2).await;
    for r in &after {
        assert_eq!(signature_count(r), 1);
        assert_eq!(reference_check(&new, &r.headers, &r.body), Ok(()));
        assert_eq!(reference_check(&old, &r.headers, &r.body), Err("signature invalid".to_string()));
    }
}
