//! A TCP proxy between a fleet process and a service, which a test can cut to simulate an outage,
//! or arm to act on the first request that carries given bytes (a Redis command naming a key):
//! hold it for a while, or let it through and then cut every connection.

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
    armed: Armed,
    _task: tokio::task::JoinHandle<()>,
}

/// What the proxy does to the first client request that holds every needle of an armed trigger.
#[derive(Debug, Clone, Copy)]
pub enum Trigger {
    /// Holds that request (and whatever follows it on its connection) this long.
    Delay(std::time::Duration),
    /// Lets it through, waits for its reply, then cuts every connection and refuses new ones for
    /// this long: the request took effect and everything after it fails.
    CutAfterReply(std::time::Duration),
}

/// A trigger waiting for its request: the needles and what to do; taken by the first match.
type Armed = Arc<std::sync::Mutex<Option<(Vec<Vec<u8>>, Trigger)>>>;

/// Whether `chunk` holds every needle.
fn holds_all(chunk: &[u8], needles: &[Vec<u8>]) -> bool {
    needles.iter().all(|n| chunk.windows(n.len()).any(|w| w == n.as_slice()))
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
        let armed: Armed = Arc::new(std::sync::Mutex::new(None));
        let armed_for_task = armed.clone();
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
                let requests = Requests {
                    armed: armed_for_task.clone(),
                    cut: cut_for_task.clone(),
                    cut_after_reply: Arc::new(std::sync::Mutex::new(None)),
                };
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(upstream).await else { return };
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    // The cut first: a connection cut while its bytes were held never passes them on,
                    // however late this task runs after the cut (and after a thaw that follows it).
                    tokio::select! {
                        biased;
                        _ = token.cancelled() => {}
                        _ = pump(ri, wo, frozen, Side::Requests(requests.clone())) => {}
                        _ = pump(ro, wi, frozen_replies, Side::Replies(requests)) => {}
                    }
                });
            }
        });
        Proxy { addr, frozen, frozen_replies, accepted, cut, armed, _task: task }
    }

    /// Arms `trigger` for the first client request holding every one of `needles`.
    pub fn arm(&self, needles: &[&[u8]], trigger: Trigger) {
        *self.armed.lock().unwrap() = Some((needles.iter().map(|n| n.to_vec()).collect(), trigger));
    }

    /// Whether the armed trigger has fired.
    pub fn fired(&self) -> bool {
        self.armed.lock().unwrap().is_none()
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

/// One connection's view of an armed trigger and of the proxy's cut: the client's side checks each
/// request against the trigger; the upstream's side cuts after the reply a trigger waits for.
#[derive(Clone)]
struct Requests {
    armed: Armed,
    cut: Arc<std::sync::Mutex<CancellationToken>>,
    /// Set by a request that fired `CutAfterReply`: the outage that follows its reply.
    cut_after_reply: Arc<std::sync::Mutex<Option<std::time::Duration>>>,
}

impl Requests {
    /// Acts on a client's `chunk` if it fires the armed trigger.
    async fn before_sending(&self, chunk: &[u8]) {
        let trigger = {
            let mut armed = self.armed.lock().unwrap();
            match armed.as_ref() {
                Some((needles, trigger)) if holds_all(chunk, needles) => {
                    let trigger = *trigger;
                    *armed = None;
                    trigger
                }
                _ => return,
            }
        };
        match trigger {
            Trigger::Delay(d) => tokio::time::sleep(d).await,
            Trigger::CutAfterReply(outage) => *self.cut_after_reply.lock().unwrap() = Some(outage),
        }
    }

    /// After a reply went back to the client: the cut a trigger asked for, at once (before the client
    /// can send anything else), and new connections accepted again after the outage.
    fn after_reply(&self) {
        let Some(outage) = self.cut_after_reply.lock().unwrap().take() else { return };
        self.cut.lock().unwrap().cancel();
        let cut = self.cut.clone();
        tokio::spawn(async move {
            tokio::time::sleep(outage).await;
            *cut.lock().unwrap() = CancellationToken::new();
        });
    }
}

/// Which way a pump copies.
enum Side {
    Requests(Requests),
    Replies(Requests),
}

/// Copies bytes one way, pausing (without closing anything) while `frozen`; the requests' side
/// checks each request against the armed trigger, the replies' side cuts after a reply if asked.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<std::sync::atomic::AtomicBool>,
    side: Side,
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
        if let Side::Requests(r) = &side {
            r.before_sending(&buf[..n]).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if let Side::Replies(r) = &side {
            r.after_reply();
        }
    }
}
