//! Live subscriptions (contract C17–C19): a feed that reads through the
//! log, and the doorbells the writer rings once a round's records are acked
//! and visible to fetch (a read-only open is rung by its file watcher
//! instead, see `watch`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use bus_core::subscription::Plan;
use bus_core::{
    BusError, DoorbellRegistry, EventBus, Feed, Selector, StartAt, StoredEvent, SubscribeOptions,
    Subscription,
};

use crate::broker::Inner;
use crate::watch::Watch;

/// The doorbells of one bus's live subscriptions.
#[derive(Debug, Default)]
pub(crate) struct Notifier {
    /// Live feeds: the commit path skips the registry while it is zero.
    listeners: AtomicUsize,
    bells: DoorbellRegistry,
}

impl Notifier {
    /// Rings the bells of `topic`; a load of one atomic when nobody listens.
    ///
    /// Relaxed is enough: a feed counts itself before its subscription
    /// first reads the partition, and that read is ordered with the
    /// writer's update of what fetch sees (the partition's read lock), so
    /// a writer that finds zero here published records that read sees.
    pub(crate) fn ring(&self, topic: &str) {
        if self.listeners.load(Ordering::Relaxed) > 0 {
            self.bells.ring(topic);
        }
    }

    /// Ends every subscription's waits (the bus is closing).
    pub(crate) fn close_all(&self) {
        self.bells.close_all();
    }
}

/// Reads a topic for one subscription through the bus's shared state. It
/// holds that state weakly, so a subscription outliving its bus keeps no
/// file, lock or partition alive (its bell is closed by then).
struct LogFeed {
    inner: Weak<Inner>,
    topic: String,
    notifier: Arc<Notifier>,
    /// Wakes a read-only open's subscription when the writer (another
    /// process) appends; dropped with the feed, which ends its thread.
    _watch: Option<Watch>,
}

impl LogFeed {
    fn new(inner: &Arc<Inner>, topic: &str) -> Self {
        let notifier = Arc::clone(&inner.options.notifier);
        notifier.listeners.fetch_add(1, Ordering::Relaxed);
        Self {
            inner: Arc::downgrade(inner),
            topic: topic.to_owned(),
            notifier,
            _watch: None,
        }
    }
}

impl Drop for LogFeed {
    fn drop(&mut self) {
        self.notifier.listeners.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Feed for LogFeed {
    fn read(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        let Some(inner) = self.inner.upgrade() else {
            return Ok(Vec::new());
        };
        let auth = inner.auth();
        inner
            .readable(&self.topic, partition)?
            .fetch(from, max, auth.as_ref())
    }

    fn head(&mut self, partition: u32) -> Result<u64, BusError> {
        let Some(inner) = self.inner.upgrade() else {
            return Ok(0);
        };
        Ok(inner.readable(&self.topic, partition)?.offsets().next)
    }
}

/// `EventBus::subscribe` of the embedded bus `bus`, whose shared state is
/// `inner`.
pub(crate) fn subscribe(
    bus: &dyn EventBus,
    inner: &Arc<Inner>,
    topic: &str,
    selector: &Selector,
    start: StartAt,
    options: SubscribeOptions,
) -> Result<Subscription, BusError> {
    let spec = inner.topic(topic)?;
    // Listen before the start positions are read: a record acked after
    // that read then rings this bell (or is seen by the first read).
    let bell = inner.options.notifier.bells.register(topic);
    let mut feed = LogFeed::new(inner, topic);
    if inner.options.read_only {
        let dirs = spec.partitions.iter().map(|p| p.dir.clone()).collect();
        feed._watch = Some(Watch::start(dirs, Arc::clone(&bell))?);
    }
    let plan = Plan::new(bus, topic, selector, start)?;
    Ok(Subscription::new(plan, options, Box::new(feed), bell))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ring_reaches_the_registry_only_while_a_feed_listens() {
        let notifier = Notifier::default();
        let bell = notifier.bells.register("t");
        let seen = bell.generation();
        notifier.ring("t");
        assert_eq!(bell.generation(), seen, "nobody counted as listening");
        notifier.listeners.fetch_add(1, Ordering::Relaxed);
        notifier.ring("t");
        assert_ne!(bell.generation(), seen);
    }
}
