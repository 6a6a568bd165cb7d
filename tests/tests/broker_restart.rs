//! A real broker restart under load (`rabbitmqctl stop_app` / `start_app`). It stops the shared
//! RabbitMQ, so `make test` runs this file alone, after every other test.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use fleet_tests::{spawn_fleet, wait_for, FleetOptions, Receiver};

const SECRET: &str = "whsec_broker_restart_secret";

fn rabbitmqctl(args: &[&str]) {
    let out = std::process::Command::new("rabbitmqctl").args(args).output().expect("rabbitmqctl on PATH");
    assert!(out.status.success(), "rabbitmqctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_under_load_loses_no_accepted_job() {
    let receiver = Receiver::echo(SECRET).await;
    let fleet = Arc::new(spawn_fleet(FleetOptions::default().workers(2)).await);
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let accepted = Arc::new(Mutex::new(Vec::<String>::new()));
    let refused = Arc::new(Mutex::new(0usize));
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (fleet, accepted, refused, stop) = (fleet.clone(), accepted.clone(), refused.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let (status, body) = fleet
                    .post(
                        "/v1/tool-calls",
                        &json!({"tool_name": "echo", "parameters": {"query": format!("{n}"), "n": n}}),
                    )
                    .await;
                match status {
                    202 => accepted.lock().unwrap().push(body["data"]["execution_id"].as_str().unwrap().to_string()),
                    503 => *refused.lock().unwrap() += 1,
                    other => panic!("unexpected {other}: {body}"),
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _restart_even_on_failure = StartAppOnDrop;
    rabbitmqctl(&["stop_app"]);
    let ready = format!("{}/readyz", fleet.api);
    wait_for("readiness to report the outage", Duration::from_secs(20), || async {
        let r = fleet.http.get(&ready).send().await.ok()?;
        (r.status().as_u16() == 503).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    rabbitmqctl(&["start_app"]);
    let restarted = Instant::now();
    let before = accepted.lock().unwrap().len();
    wait_for("jobs to be accepted again", Duration::from_secs(60), || async {
        (accepted.lock().unwrap().len() > before).then_some(())
    })
    .await;
    let recovery = restarted.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    load.await.unwrap();
    let accepted = accepted.lock().unwrap().clone();
    for id in &accepted {
        fleet.wait_status(id, "succeeded", Duration::from_secs(60)).await;
        assert_eq!(receiver.side_effects(id), 1);
    }
    println!(
        "broker restart: {} accepted, {} refused with 503 during the outage, 0 lost, accepting again {:.1} s after start_app",
        accepted.len(),
        refused.lock().unwrap(),
        recovery.as_secs_f64()
    );
}

/// Whatever happens in the test, the shared broker is running again when it ends.
struct StartAppOnDrop;

impl Drop for StartAppOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl").arg("start_app").output();
    }
}
