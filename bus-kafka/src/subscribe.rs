//! Live subscriptions (contracts C17–C19): a [`Feed`] per subscription over
//! the bus's one shared subscription consumer (see `waker.rs`).
//!
//! A subscription at the tail of a partition reads the records the shared
//! consumer keeps for it, and is woken by it; one behind that window (its
//! history, or a subscriber that fell far behind) reads through the bus's
//! reader pool as `fetch` does, at once and never past the high watermark.
//! So a fresh subscription with history has its first record on the first
//! `try_recv`, and a subscription holds no consumer and no thread of its
//! own: it costs a doorbell and a map entry. Offsets are Kafka offsets, as
//! in `fetch`.

use std::sync::Arc;
use std::time::Instant;

use bus_core::backend::Plan;
use bus_core::backend::sync::lock;
use bus_core::{
    BusError, Selector, StartAt, StoredEvent, StoredRecord, SubscribeOptions, Subscription,
    backend::Feed,
};

use crate::waker::{Kept, Lookup, Waker, kafka_partition};
use crate::{Core, KafkaBus, fetch};

impl KafkaBus {
    /// `EventBus::subscribe`: see the module documentation.
    pub(crate) fn subscribe_live(
        &self,
        topic: &str,
        selector: &Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> Result<Subscription, BusError> {
        let entry = self.entry(topic)?;
        let plan = Plan::new(self, topic, selector, start)?;
        let bell = self.subscriptions.register(topic);
        let waker = self.waker()?;
        let partitions: Vec<u32> = plan.partitions.iter().map(|&(p, _)| p).collect();
        let id = waker.watch(
            topic,
            &entry.kafka_topic,
            &partitions,
            &bell,
            self.deadline(),
        )?;
        let feed = KafkaFeed {
            core: Arc::clone(&self.core),
            waker,
            topic: topic.to_owned(),
            kafka_topic: entry.kafka_topic,
            id,
        };
        Subscription::new(plan, options, Box::new(feed), bell)
    }

    /// The bus's shared subscription consumer, started on first use and
    /// kept while the bus or one of its subscriptions lives: subscribing
    /// and dropping in a loop never builds a client.
    fn waker(&self) -> Result<Arc<Waker>, BusError> {
        let mut slot = lock(&self.waker);
        if let Some(waker) = &*slot {
            return Ok(Arc::clone(waker));
        }
        let waker = Arc::new(Waker::start(Arc::clone(&self.core))?);
        *slot = Some(Arc::clone(&waker));
        Ok(waker)
    }
}

/// The [`Feed`] of one Kafka subscription.
pub(crate) struct KafkaFeed {
    core: Arc<Core>,
    waker: Arc<Waker>,
    topic: String,
    kafka_topic: String,
    /// Its registration with the waker.
    id: u64,
}

impl KafkaFeed {
    /// A fetch from the broker (through the bus's reader pool), bounded by
    /// the bus timeout: records from `from` on, up to the first forged one.
    fn read_direct(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        let core = &self.core;
        let auth = core.auth();
        let topic = &self.topic;
        let decoded = core.pool.read(
            &core.options,
            &self.kafka_topic,
            kafka_partition(partition),
            from,
            max,
            Instant::now() + core.options.timeout,
            |message| fetch::decode_one(topic, partition, message, auth.as_ref()),
        )?;
        fetch::authentic_prefix(decoded)
    }

    /// The records the waker kept, up to the first that failed its checks;
    /// that one is the error when it comes first.
    fn kept(&self, partition: u32, kept: Vec<Kept>) -> Result<Vec<StoredRecord>, BusError> {
        let mut ready = Vec::with_capacity(kept.len());
        for (offset, decoded) in kept {
            match decoded {
                Ok(event) => ready.push(event),
                Err(reason) if ready.is_empty() => {
                    return Err(BusError::Integrity {
                        topic: self.topic.clone(),
                        partition,
                        offset,
                        reason,
                    });
                }
                Err(_) => break,
            }
        }
        Ok(ready)
    }
}

impl Feed for KafkaFeed {
    fn read(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        Ok(events(self.read_records(partition, from, max)?))
    }

    fn read_below_head(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        Ok(events(self.read_records_below_head(partition, from, max)?))
    }

    /// [`Feed::read`] with the headers (C25): what the subscription reads.
    fn read_records(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        let caught_up = match self.waker.lookup(&self.kafka_topic, partition, from, max) {
            Lookup::Records(kept) if !kept.is_empty() => return self.kept(partition, kept),
            Lookup::Records(_) => true,
            Lookup::Behind => false,
        };
        if let Some(error) = self.waker.error() {
            // Known down: say so now rather than wait out the timeout.
            return Err(error);
        }
        if caught_up {
            // The waker rings when the next record arrives.
            return Ok(Vec::new());
        }
        self.read_direct(partition, from, max)
    }

    /// The waker's buffer when it holds `from`, else a fetch from the
    /// broker: the waker can trail the high watermark [`Feed::head`] read,
    /// and its "nothing yet" would cut a key catch-up short (C18).
    fn read_records_below_head(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        if let Lookup::Records(kept) = self.waker.lookup(&self.kafka_topic, partition, from, max)
            && !kept.is_empty()
        {
            return self.kept(partition, kept);
        }
        self.read_direct(partition, from, max)
    }

    fn head(&mut self, partition: u32) -> Result<u64, BusError> {
        if let Some(error) = self.waker.error() {
            return Err(error);
        }
        let core = &self.core;
        let (_, high) = core.pool.watermarks(
            &core.options,
            &self.kafka_topic,
            kafka_partition(partition),
            Instant::now() + core.options.timeout,
        )?;
        Ok(high)
    }
}

/// The events of `records`, their headers dropped.
fn events(records: Vec<StoredRecord>) -> Vec<StoredEvent> {
    records.into_iter().map(|record| record.event).collect()
}

impl Drop for KafkaFeed {
    fn drop(&mut self) {
        self.waker.unwatch(self.id);
    }
}
