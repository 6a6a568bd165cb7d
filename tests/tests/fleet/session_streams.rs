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

/// A stream's events go out as soon as they are read, on a connection the client has used before
/// too: the dispatcher's socket does not hold a small write until the client has acknowledged the
/// previous one (Nagle's algorithm meeting the delayed ACK of a kept-alive client, 40 ms or more on
/// Linux, which held every event a turn streamed within 40 ms of the stream's opening). Measured on
/// a finished turn's backlog, which the dispatcher writes right after the stream's opening comment,
/// so nothing but the dispatcher's own writes is timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streams_events_on_a_kept_alive_connection_are_sent_at_once() {
    use fleet_tests::llm::{LlmReply, MockLlm};
    use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
    let llm =
        MockLlm::start(|_, _| LlmReply::Text { tokens: vec!["Hi".into(), " there".into()], delay: Duration::ZERO })
            .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let session = "s_kept_alive";
    let id = post_turn(&fleet, &turn_body(session, "hi", &[])).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    // One connection, kept alive: the stream's request reuses the one a read just used.
    let http = reqwest::Client::builder().pool_max_idle_per_host(1).build().unwrap();
    let mut waits = Vec::new();
    for _ in 0..10 {
        let read = http.get(format!("{}/v1/executions/{id}", fleet.api)).bearer_auth(&fleet.token).send().await;
        assert_eq!(read.unwrap().status(), 200);
        let asked = std::time::Instant::now();
        let mut stream = SseReader::new(open_stream(&http, &fleet, session, "", &[("Last-Event-ID", "0-0")]).await);
        let frames = stream.until_done(Duration::from_secs(30)).await;
        waits.push(asked.elapsed());
        assert!(frames.iter().any(|f| f.event == "message_complete"), "the turn's events: {frames:?}");
    }
    waits.sort();
    let median = waits[waits.len() / 2];
    println!("the stream's request → its backlog's `done`: {waits:?}");
    assert!(
        median < Duration::from_millis(20),
        "the backlog's `done` came {median:?} after the request (median of {waits:?})"
    );
}
