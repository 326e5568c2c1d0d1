//! The doorbells the writer rings once a round's records are acked and
//! visible to fetch, for this bus's live subscriptions.

use std::sync::atomic::{AtomicUsize, Ordering};

use bus_core::backend::DoorbellRegistry;

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

    /// Rings the bells of every topic (the watcher may have missed a
    /// change).
    pub(crate) fn ring_all(&self) {
        if self.listeners.load(Ordering::Relaxed) > 0 {
            self.bells.ring_all();
        }
    }

    /// A live feed starts listening: the commit path rings from now on.
    pub(crate) fn listen(&self) {
        self.listeners.fetch_add(1, Ordering::Relaxed);
    }

    /// A live feed stopped listening.
    pub(crate) fn unlisten(&self) {
        self.listeners.fetch_sub(1, Ordering::Relaxed);
    }

    /// A new doorbell rung for every record of `topic`.
    pub(crate) fn register(&self, topic: &str) -> std::sync::Arc<bus_core::backend::Doorbell> {
        self.bells.register(topic)
    }

    /// Ends every subscription's waits (the bus is closing).
    pub(crate) fn close_all(&self) {
        self.bells.close_all();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ring_reaches_the_registry_only_while_a_feed_listens() {
        let notifier = Notifier::default();
        let bell = notifier.register("t");
        let seen = bell.generation();
        notifier.ring("t");
        assert_eq!(bell.generation(), seen, "nobody counted as listening");
        notifier.listen();
        notifier.ring("t");
        assert_ne!(bell.generation(), seen);
    }
}
