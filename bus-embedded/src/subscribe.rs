//! Live subscriptions (contract C17–C19): a feed that reads through the
//! log, woken by the bus's `Notifier` (in a read-only open, rung by the
//! open's one file watcher, see `watch`). A subscription holds no thread
//! or file of its own: dropping it releases what it held before `drop`
//! returns.

use std::sync::{Arc, Weak};

use bus_core::backend::Plan;
use bus_core::{
    BusError, EventBus, Selector, StartAt, StoredEvent, StoredRecord, SubscribeOptions,
    Subscription, backend::Feed,
};

use crate::inner::Inner;
use crate::notifier::Notifier;

/// Reads a topic for one subscription through the bus's shared state. It
/// holds that state weakly, so a subscription outliving its bus keeps no
/// file, lock or partition alive (its bell is closed by then).
struct LogFeed {
    inner: Weak<Inner>,
    topic: String,
    notifier: Arc<Notifier>,
    /// Whether it counts in the read-only open's watches of its topic
    /// (released on drop).
    watching: bool,
}

impl LogFeed {
    fn new(inner: &Arc<Inner>, topic: &str) -> Self {
        let notifier = Arc::clone(&inner.options.notifier);
        notifier.listen();
        Self {
            inner: Arc::downgrade(inner),
            topic: topic.to_owned(),
            notifier,
            watching: false,
        }
    }
}

impl Drop for LogFeed {
    fn drop(&mut self) {
        self.notifier.unlisten();
        if self.watching
            && let Some(inner) = self.inner.upgrade()
            && let Some(watches) = &inner.watches
        {
            watches.release(&self.topic);
        }
    }
}

impl Feed for LogFeed {
    fn read(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        Ok(self
            .read_records(partition, from, max)?
            .into_iter()
            .map(|record| record.event)
            .collect())
    }

    /// The records with their headers (C25): what the subscription reads.
    fn read_records(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        let Some(inner) = self.inner.upgrade() else {
            return Ok(Vec::new());
        };
        let auth = inner.auth();
        #[cfg(feature = "cold")]
        return crate::cold::fetch(&inner, &self.topic, partition, from, max, auth.as_ref());
        #[cfg(not(feature = "cold"))]
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
    let bell = inner.options.notifier.register(topic);
    let mut feed = LogFeed::new(inner, topic);
    if let Some(watches) = &inner.watches {
        let dirs: Vec<_> = spec.partitions.iter().map(|p| p.dir.clone()).collect();
        watches.acquire(topic, &dirs)?;
        feed.watching = true;
    }
    let plan = Plan::new(bus, topic, selector, start)?;
    Subscription::new(plan, options, Box::new(feed), bell)
}
