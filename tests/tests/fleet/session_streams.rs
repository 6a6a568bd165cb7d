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

/// A stream's events go out as soon as they are written: the dispatcher's sockets set
/// `TCP_NODELAY`. Without it, Nagle's algorithm held each small write (an SSE frame) until the
/// client had acknowledged the previous one, and a kept-alive client delays its ACK by 40 ms or
/// more: a turn's events reached a stream on a connection the client had used before ~40 ms late
/// (the bench's turn part, to `done` streamed: 43 ms a turn before, 5 after). Read from the
/// dispatcher's own socket, not timed, so a loaded machine cannot make it pass or fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatchers_sockets_send_small_writes_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    let api_port: u16 = fleet.api.rsplit(':').next().unwrap().parse().unwrap();
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", api_port)).await.unwrap();
    // Answered: the dispatcher has accepted the connection and set up its socket.
    tcp.write_all(b"GET /v1/sessions/s/stream HTTP/1.1\r\nHost: fleet\r\n\r\n").await.unwrap();
    let mut head = [0u8; 12];
    tcp.read_exact(&mut head).await.unwrap();
    assert!(head.starts_with(b"HTTP/1.1 "), "{:?}", String::from_utf8_lossy(&head));
    let pid = fleet.dispatcher_pid().expect("the dispatcher runs as a process");
    let client_port = tcp.local_addr().unwrap().port();
    let nodelay = fleet_tests::sockets::nodelay_of(pid, api_port, client_port).unwrap();
    assert!(nodelay, "the dispatcher's end of an API connection has TCP_NODELAY unset: Nagle holds its small writes");
}
