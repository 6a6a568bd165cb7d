//! TLS everywhere, against real TLS servers: a private CA of the test's own (rcgen), a TLS-only
//! Redis (one node, and a three-master cluster with `--tls-cluster yes`) and a throw-away RabbitMQ
//! node with only a TLS listener, both requiring client certificates; callbacks and the model
//! behind HTTPS with the same CA. The shared broker and Redis are not involved.

use std::time::Duration;

use serde_json::json;

use fleet_platform::config::Source;
use fleet_platform::tls::ClientTls;
use fleet_protocol::keys::Keys;
use fleet_protocol::secrets::SecretsKey;
use fleet_tests::fleet::binary;
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::tls::{path, TestCa, TlsFront, TlsRabbit, TlsRedis};
use fleet_tests::turn::{post_turn, turn_body};
use fleet_tests::{spawn_fleet, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_tls_test_secret";

/// The fleet's own TLS client for `ca`, as the processes build it from their settings.
fn client_tls(env: &[(String, String)]) -> ClientTls {
    ClientTls::load(&Source::from_pairs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))).unwrap()
}

fn fleet_options(env: &[(String, String)], amqp: &str, redis: &str) -> FleetOptions {
    let mut options = FleetOptions::default().env("FLEET_AMQP_URL", amqp).env("FLEET_REDIS_URL", redis);
    options.env.extend(env.iter().cloned());
    options
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_and_turns_run_over_tls_with_a_private_ca_and_client_certificates() {
    let ca = TestCa::new("fleet");
    let client = ca.client("fleet-client");
    let env = ca.fleet_env(&client);
    let rabbit = TlsRabbit::start(&ca);
    let redis = TlsRedis::start(&ca, &client).await;
    rabbit.wait_ready(&client_tls(&env)).await;

    // The tool owner and the model answer over HTTPS with certificates from the same private CA.
    let receiver = Receiver::start(SECRET, |r, _| Reply::result(json!({"echo": r.json["parameters"]["query"]}))).await;
    let receiver_tls = TlsFront::start(receiver.addr, &ca.server("receiver")).await;
    let llm = MockLlm::start(|body, _| {
        let answered = body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool");
        if answered {
            LlmReply::text("Found it over TLS.")
        } else {
            LlmReply::ToolCalls(vec![("call_1".into(), "secure".into(), r#"{"query":"over-tls"}"#.into())])
        }
    })
    .await;
    let llm_tls = TlsFront::start(llm.addr, &ca.server("model")).await;

    let options = fleet_options(&env, &rabbit.url(), &redis.url())
        .env("FLEET_LLM_BASE_URL", &llm_tls.url("/v1"))
        .env("FLEET_LLM_API_KEY", "sk-test-key");
    let fleet = spawn_fleet(options).await;
    fleet.register_tool("secure", &receiver_tls.url("/tool"), SECRET).await;

    let id = fleet.call_tool("secure", json!({"query": "hello"})).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["result"], json!({"echo": "hello"}), "{done}");
    let received = receiver.received_for(&id);
    assert_eq!(received.len(), 1);
    received[0].verified.as_ref().expect("the callback is signed");

    let turn = post_turn(&fleet, &turn_body("s_tls", "find it", &["secure"])).await;
    let done = fleet.wait_status(&turn, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["turn"]["final_message"]["content"], "Found it over TLS.", "{done}");
    assert_eq!(llm.requests().len(), 2, "two model calls, both over HTTPS");
    assert!(receiver.received().iter().any(|r| r.json["parameters"]["query"] == "over-tls"));

    // The state really is in the TLS Redis: the execution record is there.
    let record: Option<String> = fleet_tests::tls::redis_query(
        redis.ports[0],
        ca.redis_certificates(&client),
        redis::cmd("KEYS").arg(format!("{}*{id}*", fleet.key_prefix)),
    )
    .await
    .map(|keys: Vec<String>| keys.join(","));
    assert!(record.is_some_and(|k| !k.is_empty()), "the execution's keys are in the TLS Redis");

    // A process that trusts another CA, or presents a certificate the servers refuse, stops at
    // start with one line naming the setting.
    let stranger = TestCa::new("stranger");
    let stranger_client = stranger.client("stranger-client");
    let (amqp, redis_url) = (rabbit.url(), redis.url());
    let cases = [
        (
            "only RabbitMQ",
            stranger.fleet_env(&client),
            amqp.clone(),
            "redis://127.0.0.1:1/0".to_string(),
            "FLEET_TLS_CA_FILE",
        ),
        (
            "only Redis",
            stranger.fleet_env(&client),
            "amqp://guest:guest@127.0.0.1:1/%2f".into(),
            redis_url.clone(),
            "FLEET_TLS_CA_FILE",
        ),
        (
            "only RabbitMQ",
            ca.fleet_env(&stranger_client),
            amqp.clone(),
            "redis://127.0.0.1:1/0".into(),
            "FLEET_TLS_CLIENT_CERT_FILE",
        ),
        (
            "only Redis",
            ca.fleet_env(&stranger_client),
            "amqp://guest:guest@127.0.0.1:1/%2f".into(),
            redis_url.clone(),
            "FLEET_TLS_CLIENT_CERT_FILE",
        ),
    ];
    let ca_only = vec![("FLEET_TLS_CA_FILE".to_string(), path(&ca.ca_file))];
    let no_client_certificate = [
        (
            "RabbitMQ, no client certificate",
            ca_only.clone(),
            amqp.clone(),
            "redis://127.0.0.1:1/0".to_string(),
            "FLEET_TLS_CLIENT_CERT_FILE",
        ),
        (
            "Redis, no client certificate",
            ca_only,
            "amqp://guest:guest@127.0.0.1:1/%2f".into(),
            redis_url.clone(),
            "FLEET_TLS_CLIENT_CERT_FILE",
        ),
    ];
    for (what, env, amqp, redis_url, setting) in cases.into_iter().chain(no_client_certificate) {
        let (code, stderr) = tokio::task::spawn_blocking(move || {
            let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            env.extend([("FLEET_AMQP_URL", amqp.as_str()), ("FLEET_REDIS_URL", redis_url.as_str())]);
            start_with("worker", &env)
        })
        .await
        .unwrap();
        assert_eq!(code, Some(2), "{what}, {setting}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{what}: one line: {stderr}");
        assert!(lines[0].contains(&format!("configuration error: {setting}:")), "{what}: names {setting}: {stderr}");
        assert!(!lines[0].contains("guest:guest"), "no credentials: {stderr}");
        println!("{what}: {}", lines[0]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_runs_on_a_tls_redis_cluster_trusting_the_system_roots() {
    let ca = TestCa::new("cluster");
    let client = ca.client("fleet-client");
    // The CA reaches the fleet as the "system" store (SSL_CERT_FILE, which the native-roots
    // loader honours), not as FLEET_TLS_CA_FILE: FLEET_TLS_NATIVE_ROOTS=true is what trusts it.
    let mut env = ca.fleet_env(&client);
    env.retain(|(k, _)| k != "FLEET_TLS_CA_FILE");
    env.push(("SSL_CERT_FILE".into(), path(&ca.ca_file)));
    env.push(("FLEET_TLS_NATIVE_ROOTS".into(), "true".into()));
    let cluster = TlsRedis::start_cluster(&ca, &client).await;
    let receiver = Receiver::start(SECRET, |r, _| Reply::result(json!({"ok": r.json["parameters"]["query"]}))).await;
    // The broker is the shared one (plain AMQP): this test is about Redis Cluster over TLS.
    let fleet = spawn_fleet(fleet_options(&env, &fleet_tests::amqp_url(), &cluster.url())).await;
    fleet.register_tool("clustered", &receiver.url("/c"), SECRET).await;
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(fleet.call_tool("clustered", json!({"query": format!("q{n}")})).await);
    }
    for id in &ids {
        fleet.wait_status(id, "succeeded", Duration::from_secs(30)).await;
        assert_eq!(receiver.side_effects(id), 1);
    }
    // The keys are spread over the masters, all reached over TLS.
    let mut holding = 0;
    for port in &cluster.ports {
        let keys: Vec<String> = fleet_tests::tls::redis_query(
            *port,
            ca.redis_certificates(&client),
            redis::cmd("KEYS").arg(format!("{}*", fleet.key_prefix)),
        )
        .await
        .expect("a TLS node answers");
        holding += usize::from(!keys.is_empty());
    }
    assert!(holding >= 2, "keys on {holding} master(s)");
}

/// Runs `bin` with `env` over a harmless base and returns (exit code, stderr); a process still
/// running after 20 s is killed and reported as `None`.
fn start_with(bin: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let stderr_path = std::env::temp_dir().join(format!("fleet-tls-start-{}.log", uuid::Uuid::new_v4().simple()));
    let mut cmd = std::process::Command::new(binary(bin));
    cmd.env("FLEET_SECRETS_KEY", fleet_tests::fleet::TEST_SECRETS_KEY)
        .env("FLEET_API_TOKENS", "a-long-enough-test-token")
        .env("FLEET_HTTP_ADDR", "127.0.0.1:0")
        .env("FLEET_WORKER_HTTP_ADDR", "127.0.0.1:0")
        .env("FLEET_REDIS_URL", "rediss://localhost:1/0")
        .env("FLEET_AMQP_URL", "amqps://guest:guest@localhost:1/%2f");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let _ = std::fs::remove_file(&stderr_path);
    (code, stderr)
}

#[test]
fn unusable_tls_files_stop_the_processes_at_start_naming_the_setting() {
    let ca = TestCa::new("files");
    let client = ca.client("c");
    let not_a_cert = std::env::temp_dir().join(format!("fleet-not-a-cert-{}.pem", std::process::id()));
    std::fs::write(&not_a_cert, "this is not a certificate\n").unwrap();
    let not_a_cert = path(&not_a_cert);
    let missing = "/nonexistent/fleet/ca.pem".to_string();
    let cases: Vec<(Vec<(&str, String)>, &str)> = vec![
        (vec![("FLEET_TLS_CA_FILE", not_a_cert.clone())], "FLEET_TLS_CA_FILE"),
        (vec![("FLEET_TLS_CA_FILE", missing)], "FLEET_TLS_CA_FILE"),
        (
            // A key that is not the certificate's.
            vec![
                ("FLEET_TLS_CLIENT_CERT_FILE", path(&client.cert_file)),
                ("FLEET_TLS_CLIENT_KEY_FILE", not_a_cert.clone()),
            ],
            "FLEET_TLS_CLIENT_KEY_FILE",
        ),
        (vec![("FLEET_TLS_CLIENT_CERT_FILE", path(&client.cert_file))], "FLEET_TLS_CLIENT_KEY_FILE"),
    ];
    for bin in ["worker", "dispatcher"] {
        for (env, setting) in &cases {
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let (code, stderr) = start_with(bin, &env);
            assert_eq!(code, Some(2), "{bin} with {env:?}: {stderr}");
            let lines: Vec<&str> = stderr.lines().collect();
            assert_eq!(lines.len(), 1, "{bin}: one line: {stderr}");
            assert!(lines[0].contains(setting), "{bin}: names {setting}: {stderr}");
        }
    }
    let _ = std::fs::remove_file(&not_a_cert);
    // The same settings with good files load.
    let good = client_tls(&ca.fleet_env(&client));
    assert!(format!("{good:?}").contains("client_certificate: true"), "{good:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_ca_does_not_open_the_ssrf_guard() {
    let ca = TestCa::new("ssrf");
    let receiver = Receiver::echo(SECRET).await;
    let front = TlsFront::start(receiver.addr, &ca.server("inside")).await;
    let options = FleetOptions::default()
        .env("FLEET_ALLOW_PRIVATE_CALLBACKS", "false")
        .env("FLEET_TLS_CA_FILE", &path(&ca.ca_file));
    let fleet = spawn_fleet(options).await;
    // The registry refuses this URL, so plant the tool as if its DNS had changed after registration.
    let name = "inside_https";
    let key = SecretsKey::parse(fleet_tests::fleet::TEST_SECRETS_KEY).unwrap();
    let tool = json!({"name": name, "description": "", "parameters": {}, "callback_url": front.url("/x"),
        "secret_ciphertext": key.encrypt(&format!("tool:{name}"), SECRET), "created_at_ms": 0, "updated_at_ms": 0});
    let mut con = fleet_tests::redis_connection(&redis::Client::open(fleet_tests::redis_url()).unwrap()).await;
    let _: () = redis::cmd("SET")
        .arg(Keys::new(&fleet.key_prefix).tool(name))
        .arg(tool.to_string())
        .query_async(&mut con)
        .await
        .unwrap();
    let id = fleet.call_tool(name, json!({"query": "x"})).await;
    let done = fleet.wait_status(&id, "dead_lettered", Duration::from_secs(20)).await;
    assert!(done["last_error"].as_str().unwrap().contains("refused"), "{done}");
    assert!(receiver.received().is_empty(), "nothing reached the private HTTPS target");
}

/// The client certificate is the fleet's own services' credential: the HTTPS client the worker
/// calls tool owners and the model with (and the trace exporter uses) is built without it, so a
/// server that asks for one gets none, while the services' client presents it.
#[test]
fn no_client_certificate_is_offered_to_a_tool_owner_the_model_or_a_collector() {
    fleet_tests::tls::install_crypto_provider();
    let ca = TestCa::new("client-cert-scope");
    let tls = client_tls(&ca.fleet_env(&ca.client("fleet-worker")));
    assert!(!tls.http_config().client_auth_cert_resolver.has_certs(), "the HTTPS client offers no certificate");
    assert!(tls.service_config().client_auth_cert_resolver.has_certs(), "the services' client presents it");
}
