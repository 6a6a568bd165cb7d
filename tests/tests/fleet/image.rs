//! The fleet's container image, built and run here: podman runs the dispatcher and a worker as
//! containers of the image (built by `scripts/image.sh` from the debug binaries `make test` built,
//! or `FLEET_TEST_IMAGE`) on the host's network, bound to 127.0.0.1 only, against the machine's
//! RabbitMQ and Redis. A signed tool call succeeds, a turn streams, the image's own health check
//! passes in both containers, and SIGTERM to the worker's container drains it: exit 0 within the
//! grace period, nothing lost or run twice. Podman missing or broken fails these tests (never a
//! skip): `scripts/ensure-podman.sh` installs it, and `make test` runs that first.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use fleet_tests::container::{self, podman, podman_out, test_image};
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, post_turn, read_until_done, turn_body};
use fleet_tests::{on_sigterm, spawn_fleet, wait_for, Receiver, Reply};

const SECRET: &str = "whsec_image_test_secret_1";
const GRACE: Duration = Duration::from_secs(10);

#[test]
fn the_image_is_non_root_labelled_shell_free_and_checks_its_own_health() {
    let image = test_image();
    let inspect: Value = serde_json::from_str(&podman_out(&["image", "inspect", &image])).unwrap();
    let inspect = &inspect[0];
    let config = &inspect["Config"];
    assert_eq!(config["User"], "10001:10001", "a numeric non-root user");
    assert_eq!(config["Cmd"], json!(["/usr/local/bin/dispatcher"]));
    let env: Vec<&str> = config["Env"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(env.contains(&"FLEET_HTTP_ADDR=0.0.0.0:8080") && env.contains(&"FLEET_WORKER_HTTP_ADDR=0.0.0.0:9090"));
    let labels = &config["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], env!("CARGO_PKG_VERSION"));
    let revision = labels["org.opencontainers.image.revision"].as_str().unwrap();
    assert!(revision.len() >= 40 && revision[..40].bytes().all(|b| b.is_ascii_hexdigit()), "revision {revision:?}");
    assert!(labels["org.opencontainers.image.source"].is_string(), "a source label: {labels}");
    assert!(labels["org.opencontainers.image.created"].as_str().is_some_and(|c| !c.is_empty()));
    // The chart's readiness probe: GET /readyz every 5 s, 3 s timeout, 3 failures.
    let check = &inspect["Healthcheck"];
    assert_eq!(check["Test"], json!(["CMD", "/usr/local/bin/fleetctl", "probe", "--path", "/readyz"]), "{inspect}");
    assert_eq!(check["Interval"], 5_000_000_000u64);
    assert_eq!(check["Timeout"], 3_000_000_000u64);
    assert_eq!(check["Retries"], 3);

    // Nothing to run but the fleet: no shell, no package manager.
    let shell = podman().args(["run", "--rm", "--network", "host", &image, "/bin/sh", "-c", "true"]).output().unwrap();
    let said = String::from_utf8_lossy(&shell.stderr);
    assert!(shell.status.code() == Some(127) && said.contains("/bin/sh"), "the image has no shell: {said}");
    let probe = podman()
        .args(["run", "--rm", "--network", "host", "--read-only", &image, "/usr/local/bin/fleetctl", "probe"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&probe.stderr);
    assert!(!probe.status.success() && said.contains("PID 1 runs fleetctl"), "probe outside a fleet process: {said}");

    if std::env::var_os("FLEET_TEST_IMAGE").is_none() {
        let bin_dir = fleet_tests::fleet::binary("dispatcher").parent().unwrap().to_path_buf();
        let tag = image.rsplit_once(':').unwrap().1;
        let path = bin_dir.parent().unwrap().join(format!("image-test/agent-fleet-test_{tag}.cdx.json"));
        let sbom: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("the SBOM beside the image")).unwrap();
        assert_eq!(sbom["bomFormat"], "CycloneDX");
        let components = sbom["components"].as_array().unwrap();
        let has = |prefix: &str| components.iter().any(|c| c["bom-ref"].as_str().unwrap().starts_with(prefix));
        assert!(has("pkg:deb/debian/libc6@") && has("pkg:deb/debian/ca-certificates@"), "Debian packages");
        assert!(has("pkg:cargo/tokio@") && has("pkg:cargo/lapin@") && has("crate:fleet-worker@"), "crates");
        for bin in ["dispatcher", "worker", "fleetctl"] {
            let c = components.iter().find(|c| c["bom-ref"] == format!("file:/usr/local/bin/{bin}")).expect(bin);
            assert_eq!(c["hashes"][0]["content"].as_str().unwrap().len(), 64, "{bin}'s SHA-256");
        }
        assert!(!has("pkg:cargo/proptest@"), "test-only crates are not in the image");
    }
    let size: f64 = podman_out(&["image", "inspect", "--format", "{{.Size}}", &image]).parse().unwrap();
    eprintln!("image {image}: {:.1} MB", size / 1e6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_on_loopback_call_a_tool_stream_a_turn_and_drain_on_sigterm() {
    let image = tokio::task::spawn_blocking(test_image).await.unwrap();
    let receiver = Receiver::start(SECRET, |r, _| {
        let delay = if r.path == "/slow" { Duration::from_millis(700) } else { Duration::ZERO };
        Reply::result(json!("ok")).after(delay)
    })
    .await;
    let llm = MockLlm::start(|_, _| LlmReply::text("Hello from a container")).await;
    // Warnings only: the figures printed below are what a passing run shows.
    let mut options = llm_fleet(&llm)
        .env("RUST_LOG", "warn")
        .env("FLEET_WORKER_CONCURRENCY", "4")
        .env("FLEET_SHUTDOWN_GRACE", &GRACE.as_secs().to_string())
        .workers(0);
    options.dispatcher = false;
    options.image = Some(image);
    let mut fleet = spawn_fleet(options).await;
    let prefix = fleet.container_prefix();
    on_sigterm(move || container::remove_all(&prefix));

    // From `podman run` to /readyz answering 200 (polled every 20 ms).
    let started = Instant::now();
    fleet.start_dispatcher(None).await;
    let dispatcher_ready = started.elapsed();
    let started = Instant::now();
    fleet.spawn_worker().await;
    let worker_ready = started.elapsed();
    eprintln!("podman run to /readyz 200: dispatcher {dispatcher_ready:.2?}, worker {worker_ready:.2?}");

    let containers =
        [fleet.dispatcher_container().unwrap().to_string(), fleet.worker_container(0).unwrap().to_string()];
    for name in &containers {
        let pid = container::pid(name);
        let addrs = container::listening(pid);
        assert!(!addrs.is_empty(), "{name} listens for HTTP");
        assert!(
            addrs.iter().all(|a| a.ip() == IpAddr::from([127, 0, 0, 1])),
            "{name} listens on 127.0.0.1 only, not {addrs:?}"
        );
        assert_eq!(container::uid(pid), 10001, "{name} runs as the image's user");
        // The image's HEALTHCHECK (`fleetctl probe`) finds the container's own process and port.
        let check = podman().args(["healthcheck", "run", name]).output().unwrap();
        assert!(check.status.success(), "{name}'s health check: {}", String::from_utf8_lossy(&check.stderr));
    }

    // A signed tool call.
    fleet.register_tool("lookup", &receiver.url("/fast"), SECRET).await;
    let id = fleet.call_tool("lookup", json!({"query": "from a container"})).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(done["result"], "ok", "{done}");
    let delivered = receiver.received_for(&id);
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].verified, Ok(()), "the callback's signature verifies independently");

    // A turn streams its tokens.
    let turn = post_turn(&fleet, &turn_body("s_image", "hi", &[])).await;
    let frames = read_until_done(&fleet, "s_image", Some("0-0")).await;
    let text: String =
        frames.iter().filter(|f| f.2 == "token").map(|f| f.3["token"].as_str().unwrap().to_string()).collect();
    assert_eq!(text, "Hello from a container");
    fleet.wait_status(&turn, "succeeded", Duration::from_secs(20)).await;

    // SIGTERM to the worker's container while it holds slow calls: it drains and exits 0.
    fleet.register_tool("slow", &receiver.url("/slow"), SECRET).await;
    let mut ids = Vec::new();
    for n in 0..8 {
        ids.push(fleet.call_tool("slow", json!({"query": format!("{n}")})).await);
    }
    let slow = || receiver.received().iter().filter(|r| r.path == "/slow").count();
    wait_for("the worker to hold a full batch", Duration::from_secs(10), || async { (slow() >= 4).then_some(()) })
        .await;
    let in_flight = slow();
    let sent = Instant::now();
    fleet.signal_worker(0, libc::SIGTERM);
    let code = fleet.wait_worker_exit(0, GRACE + Duration::from_secs(5)).await;
    let drained_in = sent.elapsed();
    assert_eq!(code, Some(0), "the worker's container exits 0 after draining");
    assert!(drained_in < GRACE, "it drained within the grace period: {drained_in:?}");
    eprintln!("SIGTERM to exit 0: {drained_in:.2?} with {in_flight} calls in flight");

    fleet.spawn_worker().await;
    for id in &ids {
        fleet.wait_status(id, "succeeded", Duration::from_secs(30)).await;
        assert_eq!(receiver.side_effects(id), 1, "{id} ran exactly once");
    }
}
