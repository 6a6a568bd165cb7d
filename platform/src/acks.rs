//! Acks batched per channel: a settled delivery's ack waits (briefly) for the deliveries before it,
//! so contiguous settled tags go out as one `basic.ack` with `multiple`, which costs the broker one
//! operation instead of one per message. `AckBook` decides (pure); `BatchAcks` sends.
//!
//! A multiple ack of tag T acks every unacked delivery up to T on the channel, so T is only used
//! once every tag up to it has been seen and settled (acked or requeued): a delivery still running,
//! or not yet taken from its consumer's buffer, stops the batch there. A settled delivery stuck
//! behind a running one is acked on its own after `linger`, so one slow job never holds the others'
//! prefetch slots.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::options::{BasicAckOptions, BasicNackOptions};
use tokio::sync::Notify;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Taken from the consumer and not settled yet.
    Running,
    /// Its work is durable; its ack is owed, since this instant.
    Settled(Instant),
    /// Acked on its own or requeued: nothing more to send for it.
    Gone,
}

/// What to send now.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AckBatch {
    /// One `basic.ack` with `multiple` up to this tag.
    pub up_to: Option<u64>,
    /// Tags to ack one by one (settled, but stuck behind a delivery still running).
    pub singles: Vec<u64>,
}

impl AckBatch {
    pub fn is_empty(&self) -> bool {
        self.up_to.is_none() && self.singles.is_empty()
    }
}

/// The deliveries of one channel above the highest tag with nothing left to send.
#[derive(Debug, Default)]
pub struct AckBook {
    /// Every tag up to here is acked or requeued (a channel's tags start at 1).
    floor: u64,
    open: BTreeMap<u64, State>,
}

impl AckBook {
    /// A delivery taken from its consumer (in any order across a channel's consumers).
    pub fn delivered(&mut self, tag: u64) {
        if tag > self.floor {
            self.open.insert(tag, State::Running);
        }
    }

    /// Its work is durable: its ack is owed.
    pub fn settled(&mut self, tag: u64, now: Instant) {
        if tag > self.floor {
            self.open.insert(tag, State::Settled(now));
        }
    }

    /// Sent on its own (a requeue), or never to be sent (its channel is gone).
    pub fn gone(&mut self, tag: u64) {
        if tag > self.floor {
            self.open.insert(tag, State::Gone);
        }
    }

    /// Whether any ack is owed.
    pub fn owes(&self) -> bool {
        self.open.values().any(|s| matches!(s, State::Settled(_)))
    }

    /// When the oldest ack stuck behind a running delivery is due on its own.
    pub fn next_due(&self, linger: Duration) -> Option<Instant> {
        self.open.values().filter_map(|s| if let State::Settled(at) = s { Some(*at + linger) } else { None }).min()
    }

    /// The acks to send at `now`: the contiguous settled prefix as one multiple ack, and every
    /// settled tag owed for `linger` or longer on its own (`Duration::ZERO`: all of them).
    pub fn take(&mut self, now: Instant, linger: Duration) -> AckBatch {
        let mut batch = AckBatch::default();
        while let Some(entry) = self.open.first_entry() {
            if *entry.key() != self.floor + 1 {
                break;
            }
            match *entry.get() {
                State::Running => break,
                State::Settled(_) => batch.up_to = Some(*entry.key()),
                State::Gone => {}
            }
            entry.remove();
            self.floor += 1;
        }
        for (tag, state) in self.open.iter_mut() {
            if let State::Settled(at) = *state {
                if now.saturating_duration_since(at) >= linger {
                    batch.singles.push(*tag);
                    *state = State::Gone;
                }
            }
        }
        batch
    }
}

/// A channel's acks, sent by a task of their own (`run`) as the book allows. Nacks are sent at
/// once, before the book marks them, so no multiple ack can cover a requeued delivery first.
pub struct BatchAcks {
    channel: lapin::Channel,
    book: Mutex<AckBook>,
    /// Held while a batch is taken and sent: two batches sent out of order could ack a tag twice
    /// (the broker closes the channel for an unknown tag).
    sending: tokio::sync::Mutex<()>,
    wake: Notify,
    linger: Duration,
}

impl BatchAcks {
    pub fn new(channel: lapin::Channel, linger: Duration) -> Arc<Self> {
        Arc::new(BatchAcks {
            channel,
            book: Mutex::default(),
            sending: tokio::sync::Mutex::new(()),
            wake: Notify::new(),
            linger,
        })
    }

    pub fn delivered(&self, tag: u64) {
        self.book.lock().unwrap().delivered(tag);
    }

    /// The delivery's work is durable; its ack goes out with the next batch.
    pub fn ack(&self, tag: u64) {
        self.book.lock().unwrap().settled(tag, Instant::now());
        self.wake.notify_one();
    }

    /// Returns the delivery to its queue now.
    pub async fn requeue(&self, tag: u64) -> Result<(), lapin::Error> {
        let sent = self.channel.basic_nack(tag, BasicNackOptions { requeue: true, multiple: false }).await;
        self.book.lock().unwrap().gone(tag);
        self.wake.notify_one();
        sent
    }

    /// The channel is gone: the broker returns the delivery by itself.
    pub fn abandon(&self, tag: u64) {
        self.book.lock().unwrap().gone(tag);
    }

    /// Sends acks as they become owed, until `stop`; then sends every ack still owed.
    pub async fn run(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        loop {
            let due = self.book.lock().unwrap().next_due(self.linger);
            let wait = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = wait => {}
                _ = stop.cancelled() => break,
            }
            // The jobs ready to run on this thread settle first: their acks join this batch, one
            // frame (and one wake of the connection's I/O thread) for several deliveries.
            tokio::task::yield_now().await;
            if self.send(self.linger).await.is_err() {
                // The channel is gone: its unacked deliveries return to their queues by themselves.
                return;
            }
        }
        let _ = self.send(Duration::ZERO).await;
    }

    /// Sends what the book allows now; with `Duration::ZERO`, every ack owed.
    pub async fn send(&self, linger: Duration) -> Result<(), lapin::Error> {
        let _sending = self.sending.lock().await;
        let batch = self.book.lock().unwrap().take(Instant::now(), linger);
        if let Some(tag) = batch.up_to {
            self.channel.basic_ack(tag, BasicAckOptions { multiple: true }).await?;
        }
        for tag in batch.singles {
            self.channel.basic_ack(tag, BasicAckOptions { multiple: false }).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINGER: Duration = Duration::from_millis(2);

    #[test]
    fn contiguous_settled_tags_go_out_as_one_multiple_ack() {
        let now = Instant::now();
        let mut book = AckBook::default();
        for tag in 1..=4 {
            book.delivered(tag);
        }
        for tag in [2, 1, 3] {
            book.settled(tag, now);
        }
        assert_eq!(book.take(now, LINGER), AckBatch { up_to: Some(3), singles: vec![] });
        assert!(!book.owes());
        book.settled(4, now);
        assert_eq!(book.take(now, LINGER), AckBatch { up_to: Some(4), singles: vec![] });
        assert!(book.take(now, LINGER).is_empty());
    }

    #[test]
    fn a_running_delivery_stops_the_batch_and_what_waits_behind_it_is_acked_alone_after_the_linger() {
        let now = Instant::now();
        let mut book = AckBook::default();
        for tag in 1..=3 {
            book.delivered(tag);
        }
        book.settled(1, now);
        book.settled(3, now);
        assert_eq!(book.take(now, LINGER), AckBatch { up_to: Some(1), singles: vec![] });
        assert_eq!(book.next_due(LINGER), Some(now + LINGER));
        assert_eq!(book.take(now + LINGER, LINGER), AckBatch { up_to: None, singles: vec![3] });
        // 3 went alone: once 2 settles, the batch is 2 only.
        book.settled(2, now);
        assert_eq!(book.take(now, LINGER), AckBatch { up_to: Some(2), singles: vec![] });
    }

    #[test]
    fn a_tag_not_yet_taken_from_its_consumer_is_never_covered() {
        // Tag 2 waits in another consumer's buffer: acking 3 with `multiple` would ack it unrun.
        let now = Instant::now();
        let mut book = AckBook::default();
        book.delivered(1);
        book.delivered(3);
        book.settled(1, now);
        book.settled(3, now);
        assert_eq!(book.take(now, LINGER), AckBatch { up_to: Some(1), singles: vec![] });
        book.delivered(2);
        book.settled(2, now);
        assert_eq!(book.take(now, LINGER), AckBatch { up_to: Some(3), singles: vec![] });
    }

    #[test]
    fn a_requeued_delivery_is_passed_over_but_never_the_tag_of_a_multiple_ack() {
        let now = Instant::now();
        let mut book = AckBook::default();
        for tag in 1..=3 {
            book.delivered(tag);
        }
        book.settled(1, now);
        book.gone(3);
        book.settled(2, now);
        assert_eq!(book.take(now, LINGER), AckBatch { up_to: Some(2), singles: vec![] });
        assert!(book.take(now, Duration::ZERO).is_empty());
        book.delivered(4);
        book.gone(4);
        assert!(book.take(now, LINGER).is_empty(), "a requeue alone sends no ack");
    }

    #[test]
    fn a_final_flush_sends_every_owed_ack() {
        let now = Instant::now();
        let mut book = AckBook::default();
        for tag in 1..=3 {
            book.delivered(tag);
        }
        book.settled(3, now);
        assert_eq!(book.take(now, Duration::ZERO), AckBatch { up_to: None, singles: vec![3] });
        assert!(!book.owes());
    }
}
