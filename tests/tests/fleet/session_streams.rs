//! Session SSE streams at scale and at shutdown: idle streams cost Redis nothing per stream (one
//! reader per session, woken by a notification, instead of a poll per stream), SIGTERM ends
//! open streams so the dispatcher exits promptly, and events are sent as soon as they are read.

use std::time::Duration;

use fleet_tests::redis_instance::RedisInstance;
use fleet_tests::sse::{commands_per_second, open_stream, Next, SseReader};
use fleet_tests::{spawn_fleet, FleetOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_idle_streams_add_almost_no_redis_commands() {
    // A Redis of this test's own, so nobody else's commands are counted.
    let redis = RedisInstance::start(&[]).await;
    let fleet = spawn_fleet(FleetOptions::default().workers(0).env("FLEET_REDIS_URL", &redis.url())).await;
    let window = Duration::from_secs(3);
    let baseline = commands_per_second(&redis.url(), window).await;

    let http = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let mut streams = Vec::new();
    for n in 0..200 {
        // 100 sessions with two listeners each.
        let resp = open_stream(&http, &fleet, &format!("s_idle_{}", n % 100), "", &[]).await;
        assert_eq!(resp.status(), 200);
        streams.push(SseReader::new(resp));
    }
    for s in &mut streams {
        s.opened(Duration::from_secs(30)).await;
    }
    let idle = commands_per_second(&redis.url(), window).await;
    assert!(
        idle - baseline < 10.0,
        "200 idle streams cost {idle:.1} Redis commands/s against {baseline:.1} without them"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_open_streams_and_the_dispatcher_exits_promptly() {
    let mut fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    let http = reqwest::Client::new();
    let mut streams = Vec::new();
    for n in 0..5 {
        let resp = open_stream(&http, &fleet, &format!("s_term_{n}"), "", &[]).await;
        assert_eq!(resp.status(), 200);
        streams.push(SseReader::new(resp));
    }
    for s in &mut streams {
        s.opened(Duration::from_secs(30)).await;
    }
    let code = fleet.stop_dispatcher(libc::SIGTERM, Duration::from_secs(5)).await;
    assert_eq!(code, Some(0), "the dispatcher exits cleanly with streams open");
    for s in &mut streams {
        match s.next(Duration::from_secs(5)).await {
            Next::End => {}
            other => panic!("the stream should end cleanly at shutdown, got {other:?}"),
        }
    }
}

/// A stream opened before its turn gets the turn's events as they are written, on a connection
/// the client has used before too: the dispatcher's socket sends each small write at once instead
/// of holding it until the client has acknowledged the previous one (Nagle's algorithm meeting the
/// client's delayed ACK, which a kept-alive connection has: ~40 ms on Linux).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_a_kept_alive_connection_gets_a_turns_events_at_once() {
    use fleet_tests::llm::{LlmReply, MockLlm};
    use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
    let llm =
        MockLlm::start(|_, _| LlmReply::Text { tokens: vec!["Hi".into(), " there".into()], delay: Duration::ZERO })
            .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    // One connection, kept alive: every request after the first reuses it.
    let http = reqwest::Client::builder().pool_max_idle_per_host(1).build().unwrap();
    let mut lags = Vec::new();
    for n in 0..10 {
        let session = format!("s_kept_alive_{n}");
        let warm = http.get(format!("{}/v1/executions?limit=1", fleet.api)).bearer_auth(&fleet.token).send().await;
        assert_eq!(warm.unwrap().status(), 200);
        let mut stream = SseReader::new(open_stream(&http, &fleet, &session, "", &[]).await);
        stream.opened(Duration::from_secs(30)).await;
        post_turn(&fleet, &turn_body(&session, "hi", &[])).await;
        loop {
            match stream.next(Duration::from_secs(30)).await {
                Next::Frame(f) if f.event == "done" => break,
                Next::Frame(_) => {}
                other => panic!("the stream stopped before `done`: {other:?}"),
            }
        }
        let done_at = std::time::Instant::now();
        let answered = llm.requests().last().and_then(|r| r.ended).expect("the model answered");
        lags.push(done_at - answered);
    }
    lags.sort();
    let median = lags[lags.len() / 2];
    println!("the model's answer → `done` on the stream: {lags:?}");
    assert!(median < Duration::from_millis(20), "`done` came {median:?} after the model's answer (median of {lags:?})");
}
