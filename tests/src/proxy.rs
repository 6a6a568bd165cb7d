//! A TCP proxy between a fleet process and a service, which a test can cut to simulate an outage.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub struct Proxy {
    pub addr: SocketAddr,
    /// Client→upstream bytes held.
    frozen: Arc<std::sync::atomic::AtomicBool>,
    /// Upstream→client bytes held.
    frozen_replies: Arc<std::sync::atomic::AtomicBool>,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    cut: Arc<std::sync::Mutex<CancellationToken>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Forwards connections on a new loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(std::sync::Mutex::new(CancellationToken::new()));
        let cut_for_task = cut.clone();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = accepted.clone();
        let frozen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let frozen_for_task = frozen.clone();
        let frozen_replies = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let replies_for_task = frozen_replies.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else { return };
                let token = cut_for_task.lock().unwrap().clone();
                if token.is_cancelled() {
                    drop(inbound);
                    continue;
                }
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let frozen = frozen_for_task.clone();
                let frozen_replies = replies_for_task.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(upstream).await else { return };
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    tokio::select! {
                        _ = pump(ri, wo, frozen) => {}
                        _ = pump(ro, wi, frozen_replies) => {}
                        _ = token.cancelled() => {}
                    }
                });
            }
        });
        Proxy { addr, frozen, frozen_replies, accepted, cut, _task: task }
    }

    /// Closes every proxied connection and refuses new ones until `restore`.
    pub fn cut(&self) {
        self.cut.lock().unwrap().cancel();
    }

    /// Stops moving bytes but keeps every socket open: a half-open peer, as after a network
    /// partition, which only heartbeats can detect.
    pub fn freeze(&self) {
        self.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
        self.frozen_replies.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Holds only what the upstream sends back (the client's requests still get through): a
    /// request that arrives but whose answer does not, like a publish whose confirm is lost.
    pub fn freeze_replies(&self) {
        self.frozen_replies.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Moves bytes both ways again; what was held is delivered, in order.
    pub fn thaw(&self) {
        self.frozen.store(false, std::sync::atomic::Ordering::SeqCst);
        self.frozen_replies.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Connections forwarded so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn restore(&self) {
        *self.cut.lock().unwrap() = CancellationToken::new();
    }
}

/// Copies bytes one way, pausing (without closing anything) while `frozen`.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<std::sync::atomic::AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        while frozen.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while frozen.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
