//! A tap on the jobs exchange: a queue of the test's own bound to it for every job kind, holding a
//! copy of every job published to the fleet's work queues (fresh jobs, next steps, wakes, and
//! retries and parks as their delay queues hand them back). A test takes a copy it wants and
//! publishes it again, as a duplicate publish or a broker redelivery would deliver it.

use std::time::Duration;

use lapin::options::{BasicGetOptions, BasicPublishOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde_json::Value;

use fleet_protocol::envelope::{JobKind, CONTENT_TYPE};

use crate::{amqp_url, wait_for, Fleet};

/// AMQP header a tap puts on the copies it publishes, so it never taps its own copies.
pub const COPY_HEADER: &str = "x-test-copy";

/// One job as the tap saw it: its body, parsed.
#[derive(Debug, Clone)]
pub struct Tapped {
    pub body: Vec<u8>,
    pub json: Value,
}

impl Tapped {
    pub fn execution_id(&self) -> &str {
        self.json["execution_id"].as_str().unwrap_or_default()
    }
    pub fn kind(&self) -> &str {
        self.json["kind"].as_str().unwrap_or_default()
    }
}

pub struct JobTap {
    connection: Connection,
    channel: Channel,
    queue: String,
    exchange: String,
    seen: std::sync::Mutex<Vec<Tapped>>,
}

impl JobTap {
    /// Binds a fresh exclusive queue to `fleet`'s jobs exchange for every kind and light lane.
    pub async fn start(fleet: &Fleet) -> Self {
        let connection = Connection::connect(&amqp_url(), ConnectionProperties::default()).await.unwrap();
        let channel = connection.create_channel().await.unwrap();
        let options = QueueDeclareOptions { exclusive: true, ..Default::default() };
        let queue = channel.queue_declare("".into(), options, FieldTable::default()).await.unwrap();
        let queue = queue.name().as_str().to_string();
        let exchange = fleet.topology.jobs_exchange();
        let lanes = JobKind::ALL.into_iter().filter_map(fleet_protocol::topology::light_key);
        let keys: Vec<String> = JobKind::ALL.iter().map(|k| k.as_str().to_string()).chain(lanes).collect();
        for key in &keys {
            channel
                .queue_bind(
                    queue.as_str().into(),
                    exchange.as_str().into(),
                    key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        }
        channel.confirm_select(Default::default()).await.unwrap();
        JobTap { connection, channel, queue, exchange, seen: std::sync::Mutex::new(vec![]) }
    }

    /// Moves what the tap queue holds into `seen` (skipping the tap's own copies).
    async fn drain(&self) {
        while let Some(got) =
            self.channel.basic_get(self.queue.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap()
        {
            let delivery = got.delivery;
            let copy = delivery.properties.headers().as_ref().is_some_and(|h| h.inner().contains_key(COPY_HEADER));
            if copy {
                continue;
            }
            let json = serde_json::from_slice(&delivery.data).unwrap_or(Value::Null);
            self.seen.lock().unwrap().push(Tapped { body: delivery.data.clone(), json });
        }
    }

    /// Every job tapped so far, in the order the tap saw them.
    pub async fn seen(&self) -> Vec<Tapped> {
        self.drain().await;
        self.seen.lock().unwrap().clone()
    }

    /// Waits for the first tapped job that `matches`.
    pub async fn first(&self, what: &str, matches: impl Fn(&Tapped) -> bool) -> Tapped {
        wait_for(what, Duration::from_secs(30), || async {
            self.drain().await;
            self.seen.lock().unwrap().iter().find(|t| matches(t)).cloned()
        })
        .await
    }

    /// Publishes `job` to the jobs exchange again, byte for byte (confirmed), marked as a copy.
    pub async fn republish(&self, job: &Tapped) {
        let mut headers = FieldTable::default();
        headers.insert(COPY_HEADER.into(), AMQPValue::Boolean(true));
        let properties = BasicProperties::default()
            .with_content_type(CONTENT_TYPE.into())
            .with_delivery_mode(2)
            .with_message_id(job.execution_id().into())
            .with_headers(headers);
        self.channel
            .basic_publish(
                self.exchange.as_str().into(),
                job.kind().into(),
                BasicPublishOptions { mandatory: true, ..Default::default() },
                &job.body,
                properties,
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }

    pub async fn close(self) {
        let _ = self.connection.close(200, "".into()).await;
    }
}
