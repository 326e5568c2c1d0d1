//! What a bus knows for waking its live subscriptions: the doorbells of
//! subscribed topics, which `LISTEN` channel stands for which topics, and
//! the listening connection once there is one (`listen.rs` runs it).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use bus_core::{backend::Doorbell, backend::DoorbellRegistry};
use tokio_postgres::Client;

#[derive(Default)]
pub(crate) struct Listener {
    pub(crate) bells: DoorbellRegistry,
    /// Channel → topics (a hash collision may put two topics on one channel).
    pub(crate) channels: Mutex<HashMap<String, HashSet<String>>>,
    /// The listening connection, once a subscription asked for it.
    pub(crate) client: tokio::sync::Mutex<Option<Client>>,
}

impl Listener {
    pub(crate) fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashSet<String>>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Rings `topic` after this bus committed to it (the `NOTIFY` would too,
    /// one round trip later).
    pub(crate) fn ring_local(&self, topic: &str) {
        self.bells.ring(topic);
    }

    pub(crate) fn register(&self, topic: &str) -> Arc<Doorbell> {
        self.bells.register(topic)
    }

    pub(crate) fn close_all(&self) {
        self.bells.close_all();
    }

    pub(crate) fn ring_channel(&self, channel: &str) {
        let topics: Vec<String> = self
            .channels()
            .get(channel)
            .map(|topics| topics.iter().cloned().collect())
            .unwrap_or_default();
        for topic in topics {
            self.bells.ring(&topic);
        }
    }
}
