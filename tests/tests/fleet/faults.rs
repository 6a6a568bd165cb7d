//! Faults and hostile peers: Redis outages and restarts, a worker paused past its lease, half-open
//! broker connections, receivers that misbehave, and garbage at the API.

use std::time::{Duration, Instant};

use lapin::BasicProperties;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use fleet_protocol::envelope::{Envelope, Job, ToolCallJob};
use fleet_tests::proxy::Proxy;
use fleet_tests::redis_instance::RedisInstance;
use fleet_tests::{metric, spawn_fleet, wait_for, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_fault_tests_secret_1";

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fails_closed_then_resumes() {
    let redis = RedisInstance::start(&[]).await;
    let proxy = Proxy::start(format!("127.0.0.1:{}", redis.port).parse().unwrap()).await;
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(
        FleetOptions::default()
            .env("FLEET_REDIS_URL", &format!("redis://{}/0", proxy.addr))
            .env("FLEET_REDIS_TIMEOUT", "0.5")
            .env("FLEET_RETRY_DELAYS", "0.3,0.6"),
    )
    .await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;

    proxy.cut();
    // The dispatcher refuses work it cannot record.
    let (status, body) =
        fleet.post("/v1/tool-calls", &json!({"tool_name": "echo", "parameters": {"query": "x"}})).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "redis_unavailable");
    // A job already on the queue is not run without its claim, and not dead-lettered either.
    let id = fleet_protocol::new_execution_id();
    let envelope = Envelope::new(
        id.clone(),
        Job::ToolCall(ToolCallJob {
            tool_name: "echo".into(),
            parameters: json!({"query": "q"}),
            room_id: None,
            assistant_id: None,
            parent: None,
        }),
        now_ms(),
    );
    fleet
        .publish_raw(&envelope.to_bytes(), BasicProperties::default().with_content_type("application/json".into()))
        .await;
    wait_for("the worker to park the unclaimable job", Duration::from_secs(10), || async {
        let m = fleet.worker_metrics(0).await;
        (metric(&m, "fleet_jobs_finished_total{kind=\"tool_call\",outcome=\"deferred\"}") >= 2.0).then_some(())
    })
    .await;
    assert!(receiver.received().is_empty(), "no side effect without a claim");
    assert_eq!(fleet.queue_depth(&fleet.topology.dead_letter_queue()).await, 0);

    proxy.restore();
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(receiver.received_for(&id).len(), 1);
    let id = fleet.call_tool("echo", json!({"query": "after"})).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_under_load_loses_nothing() {
    let mut redis = RedisInstance::start(&["--appendfsync", "always"]).await;
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(
        FleetOptions::default()
            .workers(2)
            .env("FLEET_REDIS_URL", &redis.url())
            .env("FLEET_REDIS_TIMEOUT", "0.5")
            .env("FLEET_CLAIM_LEASE", "2")
            .env("FLEET_RETRY_DELAYS", "0.3,0.6,1,2,4"),
    )
    .await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let mut accepted = Vec::new();
    let mut refused = 0;
    let started = Instant::now();
    let mut restarted = false;
    for n in 0..150 {
        if !restarted && started.elapsed() > Duration::from_millis(600) {
            redis.restart().await;
            restarted = true;
        }
        let (status, body) =
            fleet.post("/v1/tool-calls", &json!({"tool_name": "echo", "parameters": {"query": format!("{n}")}})).await;
        match status {
            202 => accepted.push(body["data"]["execution_id"].as_str().unwrap().to_string()),
            503 => refused += 1,
            other => panic!("unexpected {other}: {body}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(restarted);
    for id in &accepted {
        fleet.wait_status(id, "succeeded", Duration::from_secs(30)).await;
        assert_eq!(receiver.side_effects(id), 1);
    }
    let requests = receiver.received().len();
    println!(
        "redis restart: {} accepted, {refused} refused with 503, 0 lost, {} requests for {} jobs",
        accepted.len(),
        requests,
        accepted.len()
    );
    // A job in flight when Redis dies may be run again (its result could not be stored): the
    // duplicates are bounded by what the workers held (2 workers × 32), and the receiver's
    // idempotency on execution_id absorbs them.
    assert!(requests <= accepted.len() + 2 * 32, "duplicate deliveries stay bounded: {requests}");
}

/// A reconnect that Redis refuses for a reason other than I/O (here its password, mid-rotation;
/// equally a `-LOADING` or max-clients answer to the handshake) must not leave a process without
/// Redis once Redis takes connections again: the client library keeps such a failed reconnect as
/// its connection and only retries after an I/O error, which then never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reconnect_does_not_cut_the_fleet_off_redis_for_good() {
    let redis = RedisInstance::start(&["--requirepass", "first-secret"]).await;
    let receiver = Receiver::echo(SECRET).await;
    let fleet =
        spawn_fleet(FleetOptions::default().env("FLEET_REDIS_URL", &redis.url()).env("FLEET_REDIS_TIMEOUT", "0.5"))
            .await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let before = fleet.call_tool("echo", json!({"query": "before"})).await;
    fleet.wait_status(&before, "succeeded", Duration::from_secs(20)).await;

    let client = redis::Client::open(redis.url()).unwrap();
    let mut admin = fleet_tests::redis_connection(&client).await;
    let _: () =
        redis::cmd("CONFIG").arg("SET").arg("requirepass").arg("rotated").query_async(&mut admin).await.unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut admin)
        .await
        .unwrap();
    // The dispatcher reconnects, is refused (three tries: its client's retries), and gives up.
    wait_for("the dispatcher's reconnects to be refused", Duration::from_secs(20), || async {
        let (status, _) = fleet.get(&format!("/v1/executions/{before}")).await;
        let log: Vec<std::collections::HashMap<String, redis::Value>> =
            redis::cmd("ACL").arg("LOG").query_async(&mut admin.clone()).await.ok()?;
        let refused: i64 = log
            .iter()
            .filter(|entry| matches!(entry.get("reason"), Some(redis::Value::BulkString(r)) if r == b"auth"))
            .filter_map(|entry| match entry.get("count") {
                Some(redis::Value::Int(n)) => Some(*n),
                _ => None,
            })
            .sum();
        (status == 503 && refused >= 3).then_some(())
    })
    .await;
    let _: () =
        redis::cmd("CONFIG").arg("SET").arg("requirepass").arg("first-secret").query_async(&mut admin).await.unwrap();

    let after = wait_for("the fleet to accept jobs again", Duration::from_secs(20), || async {
        let (status, body) =
            fleet.post("/v1/tool-calls", &json!({"tool_name": "echo", "parameters": {"query": "after"}})).await;
        (status == 202).then(|| body["data"]["execution_id"].as_str().unwrap().to_string())
    })
    .await;
    fleet.wait_status(&after, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(receiver.side_effects(&after), 1);
}

/// A claim the fleet cannot read (another program's `SET NX` of a bare word under the fleet's
/// prefix, as the bench's minimal pipeline writes) makes the claim script fail on that execution
/// alone. Redis answered, so however many such deliveries fail in a row, the worker keeps its
/// connection: starting over would cut off every other job's commands in flight, and fix nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_fleet_cannot_read_does_not_cost_the_worker_its_redis_connection() {
    let receiver = Receiver::echo(SECRET).await;
    let options = FleetOptions { capture_logs: true, ..FleetOptions::default().workers(0) };
    let mut fleet = spawn_fleet(options.env("FLEET_RETRY_DELAYS", "0.2,0.4")).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let mut con = fleet.redis().await;
    let mut unreadable = vec![];
    for n in 0..6 {
        let id = fleet.call_tool("echo", json!({"query": format!("q{n}")})).await;
        let key = format!("{}idempotency:{id}", fleet.key_prefix);
        let _: () = redis::cmd("SET").arg(key).arg("claimed").query_async(&mut con).await.unwrap();
        unreadable.push(id);
    }
    fleet.spawn_worker().await;
    // Each of them fails its claim, is parked for the first retry delay, and comes back: rounds
    // of six failures in a row, for well over the second a start-over waits for.
    wait_for("rounds of failed claims", Duration::from_secs(30), || async {
        let m = fleet.worker_metrics(0).await;
        (metric(&m, "fleet_redis_errors_total") >= 36.0).then_some(())
    })
    .await;
    let logs = fleet.logs();
    assert!(logs.contains("cannot claim"), "the failed claims are logged: {logs}");
    assert!(!logs.contains("starting over with a new connection"), "the worker dropped its connection: {logs}");
    // Nothing of theirs was sent; a readable job beside them runs.
    assert!(unreadable.iter().all(|id| receiver.side_effects(id) == 0));
    let fine = fleet.call_tool("echo", json!({"query": "fine"})).await;
    fleet.wait_status(&fine, "succeeded", Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_warns_when_redis_may_evict_idempotency_keys() {
    let redis = RedisInstance::start(&["--maxmemory-policy", "allkeys-lru"]).await;
    let options = FleetOptions { capture_logs: true, ..FleetOptions::default().env("FLEET_REDIS_URL", &redis.url()) };
    let fleet = spawn_fleet(options).await;
    let logs = fleet.logs();
    assert!(logs.contains("maxmemory-policy") && logs.contains("allkeys-lru") && logs.contains("noeviction"), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_past_its_lease_is_fenced_off() {
    let receiver = Receiver::start(SECRET, |_, n| {
        if n == 0 {
            Reply::result(json!("from the paused worker")).after(Duration::from_millis(1500))
        } else {
            Reply::result(json!("from the new worker"))
        }
    })
    .await;
    let amqp = format!("{}?heartbeat=1", fleet_tests::amqp_url());
    let mut fleet =
        spawn_fleet(FleetOptions::default().env("FLEET_CLAIM_LEASE", "1").env("FLEET_AMQP_URL", &amqp)).await;
    fleet.register_tool("slow", &receiver.url("/slow"), SECRET).await;
    let id = fleet.call_tool("slow", json!({"query": "x"})).await;
    wait_for("the first callback", Duration::from_secs(10), || async {
        (!receiver.received_for(&id).is_empty()).then_some(())
    })
    .await;
    fleet.signal_worker(0, libc::SIGSTOP);
    let b = fleet.spawn_worker().await;
    // The broker notices the paused worker's silence and redelivers; the new worker's claim wins.
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["result"], "from the new worker");
    fleet.signal_worker(0, libc::SIGCONT);
    wait_for("the paused worker's late write to be fenced", Duration::from_secs(20), || async {
        let m = fleet.worker_metrics(0).await;
        (metric(&m, "fleet_jobs_finished_total{kind=\"tool_call\",outcome=\"fenced\"}") == 1.0).then_some(())
    })
    .await;
    let after = fleet.wait_status(&id, "succeeded", Duration::from_secs(5)).await;
    assert_eq!(after["result"], "from the new worker", "the stale result did not overwrite the newer one");
    assert_eq!(receiver.side_effects(&id), 1);
    assert!(fleet.worker_alive(b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_broker_connection_is_detected_by_heartbeats() {
    let proxy = Proxy::start("127.0.0.1:5672".parse().unwrap()).await;
    let options = FleetOptions {
        workers: 0,
        dispatcher_amqp_url: Some(format!("amqp://guest:guest@{}/%2f?heartbeat=2", proxy.addr)),
        ..FleetOptions::default()
    };
    let fleet = spawn_fleet(options).await;
    proxy.freeze();
    let frozen = Instant::now();
    let ready = format!("{}/readyz", fleet.api);
    wait_for("the dead peer to be detected", Duration::from_secs(15), || async {
        let r = fleet.http.get(&ready).send().await.ok()?;
        (r.status().as_u16() == 503).then_some(())
    })
    .await;
    let detected = frozen.elapsed();
    println!("half-open broker connection detected after {:.1} s (heartbeat 2 s)", detected.as_secs_f64());
    assert!(
        detected <= Duration::from_secs(4) + Duration::from_secs(2),
        "within 2x the heartbeat (+ margin): {detected:?}"
    );
    proxy.thaw();
    proxy.cut();
    proxy.restore();
    wait_for("recovery", Duration::from_secs(20), || async {
        fleet.http.get(&ready).send().await.ok()?.status().is_success().then_some(())
    })
    .await;
}

/// A server that accepts and then misbehaves at the TCP level.
async fn raw_server(behaviour: &'static str) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = sock.read(&mut buf).await;
                match behaviour {
                    "drip" => {
                        let _ = sock.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n").await;
                        for _ in 0..100 {
                            if sock.write_all(b"x").await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(300)).await;
                        }
                    }
                    _ => tokio::time::sleep(Duration::from_secs(60)).await, // never answers
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_receivers_fail_within_bounds_and_memory_stays_flat() {
    let big = Receiver::start(SECRET, |_, _| Reply {
        status: 200,
        body: "y".repeat(10 * 1024 * 1024),
        delay: Duration::ZERO,
        headers: vec![],
    })
    .await;
    let drip = raw_server("drip").await;
    let silent = raw_server("silent").await;
    let plain_for_tls = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(
        FleetOptions::default()
            .env("FLEET_CALLBACK_TIMEOUT", "1.5")
            .env("FLEET_RETRY_DELAYS", "0.1")
            .env("FLEET_WORKER_CONCURRENCY", "16"),
    )
    .await;
    fleet.register_tool("big", &big.url("/big"), SECRET).await;
    fleet.register_tool("drip", &format!("http://{drip}/drip"), SECRET).await;
    fleet.register_tool("silent", &format!("http://{silent}/silent"), SECRET).await;
    fleet.register_tool("tls", &format!("https://{}/tls", plain_for_tls.addr), SECRET).await;
    let rss = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .unwrap()
            .trim()
            .trim_end_matches(" kB")
            .trim()
            .parse()
            .unwrap()
    };
    let warm = fleet.call_tool("big", json!({"query": "warm"})).await;
    fleet.wait_status(&warm, "dead_lettered", Duration::from_secs(20)).await;
    let before = rss(fleet.worker_pid(0));
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.push(("big", fleet.call_tool("big", json!({"query": format!("{n}")})).await));
    }
    for tool in ["drip", "silent", "tls"] {
        ids.push((tool, fleet.call_tool(tool, json!({"query": "x"})).await));
    }
    for (tool, id) in &ids {
        let done = fleet.wait_status(id, "dead_lettered", Duration::from_secs(30)).await;
        for attempt in done["attempts"].as_array().unwrap() {
            let ms = attempt["duration_ms"].as_u64().unwrap();
            assert!(ms <= 1500 + 700, "{tool}: an attempt took {ms} ms, above its 1.5 s timeout");
            let error = attempt["error"].as_str().unwrap_or_default();
            match *tool {
                "big" => assert!(error.contains("limit"), "{error}"),
                "drip" | "silent" => assert!(error.contains("timed out"), "{tool}: {error}"),
                _ => assert!(!error.is_empty(), "{tool}: {attempt}"),
            }
        }
    }
    let after = rss(fleet.worker_pid(0));
    println!("worker RSS before {before} kB, after 20×10 MB responses and 3 hostile peers {after} kB");
    assert!(after < before + 32 * 1024, "RSS grew from {before} kB to {after} kB");
    assert!(plain_for_tls.received().is_empty(), "no plaintext request after the TLS failure");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_at_the_api_gets_a_4xx_and_never_a_crash() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    fleet.register_tool("echo", "https://tools.example.com/echo", SECRET).await;
    let deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
    let deep_obj =
        format!("{{\"tool_name\":\"echo\",\"parameters\":{}}}", "{\"a\":".repeat(3000) + "1" + &"}".repeat(3000));
    let bodies: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"null".to_vec(),
        b"[]".to_vec(),
        b"42".to_vec(),
        b"\"str\"".to_vec(),
        b"{".to_vec(),
        b"{\"tool_name\": \"echo\", \"parameters\": {}".to_vec(),
        vec![0xff, 0xfe, 0x00, 0x7b],
        b"{\"tool_name\": null, \"parameters\": {}}".to_vec(),
        b"{\"tool_name\": [\"echo\"], \"parameters\": {}}".to_vec(),
        b"{\"tool_name\": \"echo\", \"parameters\": []}".to_vec(),
        b"{\"tool_name\": \"echo\", \"parameters\": {}, \"room_id\": 12}".to_vec(),
        b"{\"tool_name\": \"\xe2\x98\x83\", \"parameters\": {}}".to_vec(),
        b"{\"tool_name\": \"echo\", \"parameters\": {}, \"room_id\": \"\\u0000\"}".to_vec(),
        b"{\"tool_name\": \"echo\", \"parameters\": {\"n\": 1e999}}".to_vec(),
        format!("{{\"tool_name\": \"{}\", \"parameters\": {{}}}}", "a".repeat(900_000)).into_bytes(),
        deep.into_bytes(),
        deep_obj.into_bytes(),
    ];
    for body in &bodies {
        for path in ["/v1/tool-calls", "/v1/tools/echo", "/v1/webhooks/w", "/v1/dead-letters/retry"] {
            let method = if path.starts_with("/v1/tool-calls") || path.ends_with("retry") {
                reqwest::Method::POST
            } else {
                reqwest::Method::PUT
            };
            let resp = fleet
                .http
                .request(method, format!("{}{path}", fleet.api))
                .bearer_auth(&fleet.token)
                .header("Content-Type", "application/json")
                .body(body.clone())
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap();
            let excerpt: String = String::from_utf8_lossy(body).chars().take(60).collect();
            if path.ends_with("retry") && status == 200 {
                continue; // an empty or `{}` filter is a valid bulk request
            }
            assert!((400..500).contains(&status), "{path} {excerpt:?} -> {status} {text}");
            let v: Value =
                serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path} {excerpt:?}: not JSON: {text}"));
            assert!(v["error"]["message"].is_string(), "{text}");
        }
    }
    let health = fleet.http.get(format!("{}/healthz", fleet.api)).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200, "the dispatcher survived");
    assert_eq!(fleet.waiting_depth(fleet_protocol::envelope::JobKind::ToolCall).await, 0);
}
