//! RabbitMQ: connecting, declaring the topology, publishing with confirms, and a supervisor that
//! keeps one live connection (reconnecting with bounded exponential backoff) for the process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use backon::{BackoffBuilder, ExponentialBuilder};
use futures::StreamExt;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::tcp::{AMQPUriTcpExt, RustlsConnector};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, Event, ExchangeKind};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use fleet_protocol::envelope::{Envelope, CONTENT_TYPE, ENVELOPE_VERSION, VERSION_HEADER};
use fleet_protocol::topology::{ArgValue, ExchangeType, Topology};

use crate::metrics::Metrics;
use crate::tls::ClientTls;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("broker unavailable")]
    Unavailable,
    #[error("invalid broker URL: {0}")]
    InvalidUrl(String),
    #[error("broker error: {0}")]
    Amqp(#[from] lapin::Error),
    #[error("broker did not accept a connection within {0:?}")]
    ConnectTimeout(Duration),
    #[error("broker did not confirm within {0:?}")]
    ConfirmTimeout(Duration),
    #[error("broker refused the message (nack)")]
    Nacked,
    #[error("the message was not sent: {0}")]
    NotSent(lapin::Error),
    #[error("the channel failed after the message was sent: {0}")]
    SentUnconfirmed(lapin::Error),
    #[error("message was unroutable: is the topology declared?")]
    Unroutable,
    #[error("topology mismatch on {name}: {source}")]
    Topology { name: String, source: lapin::Error },
}

/// What a failed publish says about the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishFailure {
    /// It never reached the broker's queues (no channel, refused before sending, or returned
    /// unroutable): nothing was accepted.
    NotSent,
    /// It may be on a queue: the confirm did not come (timeout, channel lost after sending) or the
    /// broker nacked it, which RabbitMQ does not guarantee means "not enqueued".
    Unknown,
}

impl BrokerError {
    pub fn publish_failure(&self) -> PublishFailure {
        match self {
            BrokerError::Unavailable
            | BrokerError::InvalidUrl(_)
            | BrokerError::ConnectTimeout(_)
            | BrokerError::Topology { .. }
            | BrokerError::NotSent(_)
            | BrokerError::Unroutable => PublishFailure::NotSent,
            BrokerError::ConfirmTimeout(_)
            | BrokerError::Nacked
            | BrokerError::SentUnconfirmed(_)
            | BrokerError::Amqp(_) => PublishFailure::Unknown,
        }
    }
}

/// A `basic.publish` error: lapin checks the channel's state before queueing any frame, so a state
/// error means nothing left; anything later may have.
fn send_error(e: lapin::Error) -> BrokerError {
    match e.kind() {
        lapin::ErrorKind::InvalidChannelState(..)
        | lapin::ErrorKind::InvalidConnectionState(_)
        | lapin::ErrorKind::InvalidChannel(_) => BrokerError::NotSent(e),
        _ => BrokerError::SentUnconfirmed(e),
    }
}

/// How long one endpoint may take to accept a connection before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens a connection (heartbeat from the URL, default 10 s) with lapin's own recovery off: the
/// supervisor below owns reconnection, so there is exactly one recovery mechanism. `amqps://`
/// endpoints are reached over TLS with `tls`'s roots and client certificate.
pub async fn connect_one(url: &str, tls: &ClientTls) -> Result<Connection, BrokerError> {
    let uri: AMQPUri = with_default_heartbeat(url).parse().map_err(BrokerError::InvalidUrl)?;
    let connecting = async {
        match uri.scheme {
            AMQPScheme::AMQP => Ok(Connection::connect_uri(uri, ConnectionProperties::default()).await?),
            AMQPScheme::AMQPS => connect_tls(uri, tls).await,
        }
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(conn) => conn,
        Err(_) => Err(BrokerError::ConnectTimeout(CONNECT_TIMEOUT)),
    }
}

/// lapin's own TLS path trusts the platform's store plus extra roots and cannot be told otherwise;
/// this one dials plain TCP through lapin and does the handshake with the fleet's configuration,
/// so AMQP trusts exactly what Redis and HTTPS trust.
async fn connect_tls(uri: AMQPUri, tls: &ClientTls) -> Result<Connection, BrokerError> {
    let connector = RustlsConnector::from(tls.service_config());
    let runtime = lapin::runtime::default_runtime()?;
    let connection = Connection::connector(
        uri,
        runtime,
        async move |uri: AMQPUri, runtime| {
            let host = uri.authority.host.clone();
            let plain = AMQPUri { scheme: AMQPScheme::AMQP, ..uri };
            let stream = plain.connect_async(&runtime).await?;
            Ok(stream.into_rustls(&connector, &host).await?)
        },
        ConnectionProperties::default(),
    )
    .await?;
    Ok(connection)
}

/// Connects to the first reachable endpoint, in order; returns it with its index. Always starting
/// from the first means a process fails over to a later node and back once the first returns.
pub async fn connect(urls: &[String], tls: &ClientTls) -> Result<(Connection, usize), BrokerError> {
    let mut last = BrokerError::Unavailable;
    for (i, url) in urls.iter().enumerate() {
        match connect_one(url, tls).await {
            Ok(conn) => return Ok((conn, i)),
            Err(e) => {
                tracing::debug!(endpoint = i, error = %e, "broker endpoint unreachable");
                last = e;
            }
        }
    }
    Err(last)
}

fn with_default_heartbeat(url: &str) -> String {
    if url.contains("heartbeat=") {
        url.to_string()
    } else if url.contains('?') {
        format!("{url}&heartbeat=10")
    } else {
        format!("{url}?heartbeat=10")
    }
}

fn field_table(args: &[(&'static str, ArgValue)]) -> FieldTable {
    let mut table = FieldTable::default();
    for (k, v) in args {
        let value = match v {
            ArgValue::Str(s) => AMQPValue::LongString(LongString::from(s.as_bytes().to_vec())),
            ArgValue::Int(i) => AMQPValue::LongLongInt(*i),
        };
        table.insert(ShortString::from(*k), value);
    }
    table
}

/// Declares every exchange, queue and binding; idempotent when the topology already exists.
pub async fn declare_topology(channel: &Channel, topology: &Topology) -> Result<(), BrokerError> {
    for ex in topology.exchanges() {
        let kind = match ex.kind {
            ExchangeType::Direct => ExchangeKind::Direct,
            ExchangeType::Fanout => ExchangeKind::Fanout,
        };
        let options = ExchangeDeclareOptions { durable: true, ..Default::default() };
        channel
            .exchange_declare(ex.name.as_str().into(), kind, options, FieldTable::default())
            .await
            .map_err(|source| BrokerError::Topology { name: ex.name.clone(), source })?;
    }
    for q in topology.queues() {
        let options = QueueDeclareOptions { durable: true, ..Default::default() };
        channel
            .queue_declare(q.name.as_str().into(), options, field_table(&q.arguments))
            .await
            .map_err(|source| BrokerError::Topology { name: q.name.clone(), source })?;
        for (exchange, key) in &q.bindings {
            channel
                .queue_bind(
                    q.name.as_str().into(),
                    exchange.as_str().into(),
                    key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|source| BrokerError::Topology { name: q.name.clone(), source })?;
        }
    }
    Ok(())
}

/// Publishes on a confirm-mode channel; every publish waits for the broker's confirm (bounded).
///
/// A nack replaces the channel (at most once per [`CHANNEL_MIN_AGE`]): RabbitMQ 3.10 leaves a
/// channel that first published to a quorum queue while the queue's leader was being elected
/// nacking every later publish to it, until the old leader's node returns; a fresh channel
/// publishes to the new leader at once.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<PublisherInner>,
}

struct PublisherInner {
    connection: Arc<Connection>,
    channel: ArcSwap<Channel>,
    renewal: tokio::sync::Mutex<Renewal>,
    timeout: Duration,
}

/// The current channel's age, and the channels it replaced (closed once their publishes are
/// all past the publish timeout, so no confirm they still await is cut short).
struct Renewal {
    opened_at: Instant,
    retired: Vec<(Arc<Channel>, Instant)>,
}

/// A channel younger than this is not replaced again: a queue that really cannot take a
/// message (no majority) costs a new channel a second at most, not one per nack.
pub const CHANNEL_MIN_AGE: Duration = Duration::from_secs(1);

/// Whether a nack on the current channel, `age` old, replaces it.
pub fn replaces_channel_after_nack(age: Duration) -> bool {
    age >= CHANNEL_MIN_AGE
}

/// Whether a channel retired at `retired_at` may be closed at `now`: every publish it carried
/// has had its whole publish timeout (and a second more) to be confirmed.
pub fn retired_channel_closable(retired_at: Instant, now: Instant, publish_timeout: Duration) -> bool {
    now.saturating_duration_since(retired_at) > publish_timeout + Duration::from_secs(1)
}

async fn confirm_channel(connection: &Connection) -> Result<Channel, BrokerError> {
    let channel = connection.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok(channel)
}

impl Publisher {
    pub async fn open(connection: Arc<Connection>, timeout: Duration) -> Result<Self, BrokerError> {
        let channel = confirm_channel(&connection).await?;
        let renewal = tokio::sync::Mutex::new(Renewal { opened_at: Instant::now(), retired: vec![] });
        let inner = PublisherInner { connection, channel: ArcSwap::from_pointee(channel), renewal, timeout };
        Ok(Publisher { inner: Arc::new(inner) })
    }

    /// Publishes `body` as mandatory and persistent and returns once the broker confirmed it.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), BrokerError> {
        // A timeout while the frame still waits in the client's buffer (a blocked connection) is
        // no better: the buffer is sent when the broker reads again.
        let timeout = self.inner.timeout;
        tokio::time::timeout(timeout, self.send_and_confirm(exchange, routing_key, body, properties))
            .await
            .map_err(|_| BrokerError::ConfirmTimeout(timeout))?
    }

    /// Publishes every message back to back on this confirm channel, then waits for all their
    /// confirms at once (one confirm wait for the lot, not one round trip each); each message's
    /// result, in order. Every message is bounded by the publish timeout, counted from the start.
    pub async fn publish_many(&self, messages: &[Outgoing]) -> Vec<Result<(), BrokerError>> {
        // `join_all` polls each future once, in order, before any waits: every message's frames
        // are queued for the socket before the first confirm is awaited.
        let timeout = self.inner.timeout;
        let sends = messages.iter().map(|m| async {
            let confirmed = self.send_and_confirm(&m.exchange, &m.routing_key, &m.body, m.properties.clone());
            tokio::time::timeout(timeout, confirmed).await.map_err(|_| BrokerError::ConfirmTimeout(timeout))?
        });
        futures::future::join_all(sends).await
    }

    async fn send_and_confirm(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), BrokerError> {
        let channel = self.inner.channel.load_full();
        let confirm = channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions { mandatory: true, ..Default::default() },
                body,
                properties,
            )
            .await
            .map_err(send_error)?;
        match confirm.await.map_err(BrokerError::SentUnconfirmed)? {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(BrokerError::Unroutable),
            Confirmation::Nack(_) => {
                self.replace_nacking_channel(&channel).await;
                Err(BrokerError::Nacked)
            }
            Confirmation::NotRequested => unreachable!("the channel is in confirm mode"),
        }
    }

    /// Replaces `nacked` with a fresh confirm channel, unless another publish already did or it
    /// is younger than [`CHANNEL_MIN_AGE`]; closes the retired channels whose publishes are over.
    async fn replace_nacking_channel(&self, nacked: &Arc<Channel>) {
        let mut renewal = self.inner.renewal.lock().await;
        let now = Instant::now();
        let current = self.inner.channel.load();
        if Arc::ptr_eq(&current, nacked) && replaces_channel_after_nack(now - renewal.opened_at) {
            match confirm_channel(&self.inner.connection).await {
                Ok(fresh) => {
                    tracing::warn!("the broker nacked a publish; publishing on a fresh channel from now on");
                    self.inner.channel.store(Arc::new(fresh));
                    renewal.opened_at = now;
                    renewal.retired.push((nacked.clone(), now));
                }
                Err(e) => tracing::warn!(error = %e, "the broker nacked a publish and a fresh channel failed"),
            }
        }
        let timeout = self.inner.timeout;
        let (closable, kept) =
            renewal.retired.drain(..).partition(|(_, at)| retired_channel_closable(*at, now, timeout));
        renewal.retired = kept;
        for (channel, _) in closable {
            let _ = channel.close(200, "replaced after a nack".into()).await;
        }
    }

    /// Whether the connection it publishes on is still up (a publish that failed while it is may
    /// be tried again; once it is gone, so are the deliveries that came on it).
    pub fn connected(&self) -> bool {
        self.inner.connection.status().connected()
    }

    /// Publishes a job envelope to the work queue of its kind.
    pub async fn publish_job(
        &self,
        topology: &Topology,
        envelope: &Envelope,
        headers: FieldTable,
    ) -> Result<(), BrokerError> {
        let body = envelope.to_bytes();
        self.publish(&topology.jobs_exchange(), envelope.kind().as_str(), &body, job_properties(envelope, headers))
            .await
    }

    /// Parks a job envelope in a delay queue (through the default exchange).
    pub async fn publish_delayed(
        &self,
        queue: &str,
        envelope: &Envelope,
        headers: FieldTable,
    ) -> Result<(), BrokerError> {
        self.publish("", queue, &envelope.to_bytes(), job_properties(envelope, headers)).await
    }
}

/// One message for `Publisher::publish_many`.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// `""` is the default exchange, where the routing key names the queue (a delay queue).
    pub exchange: String,
    pub routing_key: String,
    pub body: Vec<u8>,
    pub properties: BasicProperties,
}

impl Outgoing {
    /// A job envelope as a message to `exchange` with `routing_key`.
    pub fn job(exchange: String, routing_key: String, envelope: &Envelope, headers: FieldTable) -> Self {
        Outgoing { exchange, routing_key, body: envelope.to_bytes(), properties: job_properties(envelope, headers) }
    }
}

/// AMQP properties of a job message: persistent JSON, id = execution id, type = kind.
pub fn job_properties(envelope: &Envelope, mut headers: FieldTable) -> BasicProperties {
    headers.insert(VERSION_HEADER.into(), AMQPValue::LongLongInt(ENVELOPE_VERSION as i64));
    BasicProperties::default()
        .with_content_type(CONTENT_TYPE.into())
        .with_delivery_mode(2)
        .with_message_id(envelope.execution_id.as_str().into())
        .with_type(envelope.kind().as_str().into())
        .with_timestamp((envelope.enqueued_at_ms / 1000) as u64)
        .with_headers(headers)
}

/// A live connection and its confirm-mode publisher.
#[derive(Clone)]
pub struct Live {
    pub connection: Arc<Connection>,
    pub publisher: Publisher,
}

/// The process's view of the broker: the current live connection, if any.
#[derive(Clone)]
pub struct BrokerLink {
    rx: watch::Receiver<Option<Live>>,
}

impl BrokerLink {
    pub fn current(&self) -> Option<Live> {
        self.rx.borrow().clone()
    }

    pub fn publisher(&self) -> Result<Publisher, BrokerError> {
        self.current().map(|l| l.publisher).ok_or(BrokerError::Unavailable)
    }

    /// Waits until a live connection exists (or `cancel` fires).
    pub async fn wait_live(&mut self, cancel: &CancellationToken) -> Option<Live> {
        loop {
            if let Some(live) = self.current() {
                return Some(live);
            }
            tokio::select! {
                changed = self.rx.changed() => if changed.is_err() { return None },
                _ = cancel.cancelled() => return None,
            }
        }
    }

    /// Resolves when the connection `live` came from is gone.
    pub async fn lost(&mut self, live: &Live) {
        loop {
            match &*self.rx.borrow_and_update() {
                Some(now) if Arc::ptr_eq(&now.connection, &live.connection) => {}
                _ => return,
            }
            if self.rx.changed().await.is_err() {
                return;
            }
        }
    }
}

/// Keeps one live, topology-declared connection until `cancel` fires. The returned future must be
/// awaited by its owner (it closes the connection on shutdown).
pub fn supervise(
    urls: Vec<String>,
    tls: ClientTls,
    topology: Topology,
    publish_timeout: Duration,
    metrics: Metrics,
    cancel: CancellationToken,
) -> (BrokerLink, impl std::future::Future<Output = ()>) {
    let (tx, rx) = watch::channel(None::<Live>);
    let task = async move {
        let backoff = || {
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(100))
                .with_max_delay(Duration::from_secs(5))
                .with_jitter()
                .without_max_times()
                .build()
        };
        let mut delays = backoff();
        while !cancel.is_cancelled() {
            match open_live(&urls, &tls, &topology, publish_timeout).await {
                Ok((live, endpoint)) => {
                    delays = backoff();
                    metrics.amqp_reconnects.inc();
                    metrics.broker_connected.set(1);
                    tracing::info!(endpoint, "broker connected, topology declared");
                    let events = live.connection.events_listener();
                    tx.send_replace(Some(live.clone()));
                    tokio::select! {
                        _ = cancel.cancelled() => {}
                        why = connection_lost(&live.connection, events) => {
                            metrics.amqp_errors.inc();
                            tracing::warn!(%why, "broker connection lost; reconnecting");
                        }
                    }
                    tx.send_replace(None);
                    metrics.broker_connected.set(0);
                    if cancel.is_cancelled() {
                        let _ = live.connection.close(200, "shutdown".into()).await;
                    }
                }
                Err(e) => {
                    metrics.amqp_errors.inc();
                    let wait = delays.next().unwrap_or(Duration::from_secs(5));
                    let hint = crate::tls::untrusted_hint(&crate::tls::error_chain(&e));
                    tracing::warn!(error = %e, hint, retry_in_ms = wait.as_millis() as u64, "broker connect failed");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = cancel.cancelled() => {}
                    }
                }
            }
        }
    };
    (BrokerLink { rx }, task)
}

async fn open_live(
    urls: &[String],
    tls: &ClientTls,
    topology: &Topology,
    publish_timeout: Duration,
) -> Result<(Live, usize), BrokerError> {
    let (connection, endpoint) = connect(urls, tls).await?;
    let channel = connection.create_channel().await?;
    declare_topology(&channel, topology).await?;
    let _ = channel.close(200, "declared".into()).await;
    let connection = Arc::new(connection);
    let publisher = Publisher::open(connection.clone(), publish_timeout).await?;
    Ok((Live { connection, publisher }, endpoint))
}

async fn connection_lost(connection: &Connection, events: impl futures::Stream<Item = Event> + Unpin) -> String {
    let mut events = events;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            event = events.next() => match event {
                // Channel-level errors (a passive declare of a missing queue, say) are reported
                // here too; only a connection that is no longer connected is lost.
                Some(Event::Error(e)) if !connection.status().connected() => return e.to_string(),
                Some(Event::Error(e)) => tracing::debug!(error = %e, "channel error on a live connection"),
                Some(_) => {}
                None => return "event stream ended".into(),
            },
            _ = tick.tick() => {
                if !connection.status().connected() {
                    return "connection no longer connected".into();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nack_replaces_a_channel_once_it_is_a_second_old() {
        assert!(!replaces_channel_after_nack(Duration::ZERO));
        assert!(!replaces_channel_after_nack(Duration::from_millis(999)));
        assert!(replaces_channel_after_nack(CHANNEL_MIN_AGE));
        assert!(replaces_channel_after_nack(Duration::from_secs(3600)));
    }

    #[test]
    fn a_retired_channel_closes_only_after_its_publishes_timed_out() {
        let retired = Instant::now();
        let timeout = Duration::from_secs(5);
        assert!(!retired_channel_closable(retired, retired, timeout));
        assert!(!retired_channel_closable(retired, retired + Duration::from_secs(6), timeout));
        assert!(retired_channel_closable(retired, retired + Duration::from_millis(6001), timeout));
        // A clock read before the retirement (another task's `now`) is not past it.
        assert!(!retired_channel_closable(retired + Duration::from_secs(1), retired, timeout));
    }

    #[test]
    fn only_a_publish_that_never_left_or_came_back_unroutable_is_certainly_not_accepted() {
        let state = lapin::Error::from(lapin::ErrorKind::InvalidChannelState(lapin::ChannelState::Closed, "publish"));
        assert_eq!(send_error(state).publish_failure(), PublishFailure::NotSent);
        let io = lapin::Error::from(lapin::ErrorKind::IOError(Arc::new(std::io::Error::other("reset"))));
        assert_eq!(send_error(io).publish_failure(), PublishFailure::Unknown);
        for e in [BrokerError::Unavailable, BrokerError::Unroutable] {
            assert_eq!(e.publish_failure(), PublishFailure::NotSent, "{e}");
        }
        for e in [BrokerError::ConfirmTimeout(Duration::from_secs(1)), BrokerError::Nacked] {
            assert_eq!(e.publish_failure(), PublishFailure::Unknown, "{e}");
        }
    }
}
