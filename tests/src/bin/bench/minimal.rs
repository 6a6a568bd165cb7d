//! The minimal pipeline: the fleet's job with nothing but what the contract requires per job,
//! written as plainly as it can be, as the yardstick of the fleet's drain. It runs as a process of
//! its own (`fleet-bench --minimal-pipeline`, started by the bench), drains the fleet's own work
//! queue (same quorum queue and arguments, same jobs, same receiver), and per delivery: parses the
//! envelope, claims `idempotency:<id>` (`SET NX EX`) before the side effect, signs the seed's body
//! (HMAC-SHA256), POSTs it, stores the result for 7 days (`SET EX`), and acks (one by one, or in
//! batches with `multiple` when `MINIMAL_BATCHED_ACKS=1`). One AMQP connection per consumer, as the
//! fleet has one per worker; the consumer's prefetch is its concurrency.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

use fleet_platform::acks::BatchAcks;
use fleet_protocol::callback::CallbackBody;
use fleet_protocol::envelope::{Envelope, Job};
use fleet_protocol::signature_scheme::{signature_headers, SignatureScheme};
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::IDEMPOTENCY_TTL_SECS;

/// The pipeline's settings, passed by the bench in the environment.
#[derive(Clone)]
pub struct Settings {
    pub queue: String,
    pub key_prefix: String,
    pub receiver_url: String,
    pub secret: String,
    pub consumers: usize,
    pub prefetch: u16,
    pub batched_acks: bool,
}

impl Settings {
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("MINIMAL_QUEUE", self.queue.clone()),
            ("MINIMAL_KEY_PREFIX", self.key_prefix.clone()),
            ("MINIMAL_RECEIVER_URL", self.receiver_url.clone()),
            ("MINIMAL_SECRET", self.secret.clone()),
            ("MINIMAL_CONSUMERS", self.consumers.to_string()),
            ("MINIMAL_PREFETCH", self.prefetch.to_string()),
            ("MINIMAL_BATCHED_ACKS", if self.batched_acks { "1" } else { "0" }.to_string()),
        ]
    }

    fn from_env() -> anyhow::Result<Self> {
        let var = |name: &str| std::env::var(name).with_context(|| format!("{name} is not set"));
        Ok(Settings {
            queue: var("MINIMAL_QUEUE")?,
            key_prefix: var("MINIMAL_KEY_PREFIX")?,
            receiver_url: var("MINIMAL_RECEIVER_URL")?,
            secret: var("MINIMAL_SECRET")?,
            consumers: var("MINIMAL_CONSUMERS")?.parse()?,
            prefetch: var("MINIMAL_PREFETCH")?.parse()?,
            batched_acks: var("MINIMAL_BATCHED_ACKS")? == "1",
        })
    }
}

/// What every consumer of the pipeline shares: its settings, one Redis connection, one HTTP client.
struct Pipeline {
    settings: Settings,
    redis: redis::aio::MultiplexedConnection,
    http: reqwest::Client,
}

/// Runs until killed.
pub async fn main() -> anyhow::Result<()> {
    let settings = Settings::from_env()?;
    let redis = redis::Client::open(fleet_tests::redis_url())?.get_multiplexed_async_connection().await?;
    let http = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(1024).build()?;
    let shared = Arc::new(Pipeline { settings: settings.clone(), redis, http });
    let mut consumers = tokio::task::JoinSet::new();
    for n in 0..settings.consumers {
        consumers.spawn(consume(shared.clone(), n));
    }
    while let Some(done) = consumers.join_next().await {
        done??;
    }
    Ok(())
}

async fn consume(shared: Arc<Pipeline>, n: usize) -> anyhow::Result<()> {
    let conn = Connection::connect(&fleet_tests::amqp_url(), ConnectionProperties::default()).await?;
    let channel = conn.create_channel().await?;
    channel.basic_qos(shared.settings.prefetch, BasicQosOptions::default()).await?;
    let tag = format!("minimal-{n}");
    let queue = shared.settings.queue.as_str();
    let mut deliveries = channel
        .basic_consume(queue.into(), tag.as_str().into(), BasicConsumeOptions::default(), FieldTable::default())
        .await?;
    let acks = shared.settings.batched_acks.then(|| BatchAcks::new(channel.clone(), Duration::from_millis(2)));
    if let Some(acks) = &acks {
        tokio::spawn(acks.clone().run(tokio_util::sync::CancellationToken::new()));
    }
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery?;
        if let Some(acks) = &acks {
            acks.delivered(delivery.delivery_tag);
        }
        let (shared, acks) = (shared.clone(), acks.clone());
        tokio::spawn(async move {
            if let Err(e) =
                job(&shared, &delivery.data, delivery.properties.content_type().as_ref().map(|s| s.as_str())).await
            {
                eprintln!("minimal pipeline: {e:#}");
            }
            match acks {
                Some(acks) => acks.ack(delivery.delivery_tag),
                None => {
                    let _ = delivery.ack(BasicAckOptions::default()).await;
                }
            }
        });
    }
    Ok(())
}

/// One job: claim, sign, POST, store the result. (A copy whose claim exists is only acked.)
async fn job(shared: &Pipeline, data: &[u8], content_type: Option<&str>) -> anyhow::Result<()> {
    let envelope = Envelope::decode(data, content_type).map_err(|e| anyhow::anyhow!("poison: {e}"))?;
    let Job::ToolCall(call) = &envelope.job else { anyhow::bail!("not a tool call") };
    let id = envelope.execution_id.as_str();
    let prefix = &shared.settings.key_prefix;
    let mut redis = shared.redis.clone();
    let claimed: Option<String> = redis::cmd("SET")
        .arg(format!("{prefix}idempotency:{id}"))
        .arg("claimed")
        .arg("NX")
        .arg("EX")
        .arg(IDEMPOTENCY_TTL_SECS)
        .query_async(&mut redis)
        .await?;
    if claimed.is_none() {
        return Ok(());
    }
    let now = fleet_platform::now_ms();
    let timestamp = rfc3339_from_millis(now);
    let body = CallbackBody {
        tool_name: &call.tool_name,
        parameters: &call.parameters,
        execution_id: id,
        room_id: call.room_id.as_deref(),
        assistant_id: call.assistant_id.as_deref(),
        timestamp: &timestamp,
    }
    .to_bytes();
    let headers = signature_headers(SignatureScheme::Interactor, id, now, &body, &shared.settings.secret, None)?;
    let mut request = shared.http.post(&shared.settings.receiver_url).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let response = request.body(body).send().await?;
    anyhow::ensure!(response.status().is_success(), "receiver answered {}", response.status());
    let result = response.bytes().await?;
    let () = redis::cmd("SET")
        .arg(format!("{prefix}result:{id}"))
        .arg(result.as_ref())
        .arg("EX")
        .arg(IDEMPOTENCY_TTL_SECS)
        .query_async(&mut redis)
        .await?;
    Ok(())
}
