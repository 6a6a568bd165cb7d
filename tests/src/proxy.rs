//! A TCP proxy between a fleet process and a service, which a test can cut to simulate an outage.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub struct Proxy {
    pub addr: SocketAddr,
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
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { return };
                let token = cut_for_task.lock().unwrap().clone();
                if token.is_cancelled() {
                    drop(inbound);
                    continue;
                }
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = token.cancelled() => {}
                    }
                });
            }
        });
        Proxy { addr, accepted, cut, _task: task }
    }

    /// Closes every proxied connection and refuses new ones until `restore`.
    pub fn cut(&self) {
        self.cut.lock().unwrap().cancel();
    }

    /// Connections forwarded so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn restore(&self) {
        *self.cut.lock().unwrap() = CancellationToken::new();
    }
}
