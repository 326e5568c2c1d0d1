//! Durable consumers (contract C20–C23): named cursors kept by the backend,
//! explicit acknowledgement, redelivery, one owner at a time and a
//! dead-letter topic.
//!
//! The design in one paragraph. A [`Consumer`] is an ordinary
//! [`Subscription`](crate::Subscription) (C17) started at the cursor the
//! backend stored under (topic, consumer name), with a bookkeeping layer on
//! top that is the same for every backend (this module): which deliveries
//! are in flight, when they are due again (`ack_wait`), how often each was
//! delivered, what is acknowledged, when to write the cursor (batching), and
//! dead-lettering. A backend supplies only a [`CursorStore`]: load, a
//! compare-and-set store fenced by an owner token, list, replace (reset and
//! delete), and ownership (acquire and release). The user-facing operations
//! are the [`DurableConsumers`] trait, which a backend implements beside
//! [`EventBus`](crate::EventBus) rather than inside it: code written against
//! the reference trait implements `EventBus` and must compile unchanged, so
//! the trait gains no method (not even a provided one, whose default could
//! only refuse at run time what the type system can refuse at compile
//! time: a bus without durable consumers simply does not implement the
//! trait).
//!
//! ```
//! use bus_core::consumer::{ConsumeOptions, DurableConsumers};
//! use bus_core::memory::MemoryBus;
//! use bus_core::{EventBus, Manifest, Selector, StartAt, TopicSpec};
//!
//! let bus = MemoryBus::new();
//! bus.provision(&Manifest::new([TopicSpec::new("audit", 1)])).unwrap();
//! bus.publish("audit", "k", &serde_json::json!({"n": 1})).unwrap();
//! let mut consumer = bus
//!     .consume("audit", "mailer", Selector::Topic, StartAt::Beginning, ConsumeOptions::default())
//!     .unwrap();
//! let delivery = consumer.try_recv().unwrap().unwrap();
//! assert_eq!(delivery.event.value["n"], 1);
//! consumer.ack(&delivery).unwrap(); // durable before it returns (ack_every(1))
//! ```

mod acked;
mod admin;
#[cfg(feature = "async")]
mod asynchronous;
mod engine;
mod memory;
mod options;
#[cfg(feature = "otel")]
mod otel;
mod store;
mod stream;

pub use admin::{delete_consumer, list_consumers, open_consumer, reset_consumer};
#[cfg(feature = "async")]
pub use asynchronous::{
    consume_async, consumers_async, delete_consumer_async, reset_consumer_async,
};
pub use engine::{Consumer, Delivery, ExternalAck};
pub use memory::MemoryCursorStore;
pub use options::{ConsumeOptions, OwnerPolicy};
pub use store::{
    CursorState, CursorStore, OwnerToken, PartitionState, StoredSelector, check_owner, fenced_error,
};
pub use stream::ConsumerStream;

use std::time::Duration;

use crate::BusError;
use crate::subscription::{Selector, StartAt};

/// Per partition, where a durable consumer stands (C20).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerPartition {
    /// The partition.
    pub partition: u32,
    /// The first offset not acknowledged: every record below it is
    /// acknowledged (or lies before where the consumer started).
    pub cursor: u64,
    /// Records at or above `cursor` acknowledged out of order.
    pub acked_above: u64,
    /// Records stored at or after `cursor` and not acknowledged (for a key
    /// consumer, counted over the whole partition).
    pub lag_records: u64,
    /// Age of the oldest record not acknowledged (now minus its
    /// `stored_at`), `None` when nothing is waiting.
    pub lag_time: Option<Duration>,
}

/// One durable consumer of a topic, as stored by the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerInfo {
    /// Its name.
    pub name: String,
    /// What it consumes.
    pub selector: Selector,
    /// Where it stands, per partition of its selector.
    pub partitions: Vec<ConsumerPartition>,
}

/// Durable consumers (C20–C23), implemented per backend beside
/// [`EventBus`](crate::EventBus).
pub trait DurableConsumers {
    /// Opens the durable consumer `name` of `topic`: a new one starts at
    /// `start_if_new`, an existing one right after what it acknowledged
    /// (per partition). The name follows the topic-name rule; options are
    /// checked before anything is stored; the dead-letter topic must be
    /// provisioned. Another live owner is handled as
    /// [`ConsumeOptions::owner`] says.
    fn consume(
        &self,
        topic: &str,
        name: &str,
        selector: Selector,
        start_if_new: StartAt,
        options: ConsumeOptions,
    ) -> Result<Consumer, BusError>;

    /// Every durable consumer of `topic`, with its lag in records and time.
    fn consumers(&self, topic: &str) -> Result<Vec<ConsumerInfo>, BusError>;

    /// Moves consumer `name` to `start` (resolved as a subscription's start
    /// on its selector). A running instance is fenced.
    fn reset_consumer(&self, topic: &str, name: &str, start: StartAt) -> Result<(), BusError>;

    /// Deletes consumer `name`; `false` when there was none. A running
    /// instance is fenced.
    fn delete_consumer(&self, topic: &str, name: &str) -> Result<bool, BusError>;

    /// Where this bus keeps its consumers' cursors, for a wrapper that
    /// delivers records its own way and keeps cursors where the bus does
    /// (`bus_cold::ColdBus` serves history below the hot log from its
    /// tier, C24). `None` (the default): not shared.
    fn shared_cursor_store(&self) -> Option<std::sync::Arc<dyn CursorStore>> {
        None
    }
}

/// Forwards every method, so a bus with durable consumers travels as
/// `Box<T>`, `Arc<T>` or `&T` (the facade's `Box<dyn bus::Bus>` among them).
macro_rules! forward_durable_consumers {
    ($($impl_head:tt)*) => {
        $($impl_head)* {
            fn consume(
                &self,
                topic: &str,
                name: &str,
                selector: Selector,
                start_if_new: StartAt,
                options: ConsumeOptions,
            ) -> Result<Consumer, BusError> {
                (**self).consume(topic, name, selector, start_if_new, options)
            }
            fn consumers(&self, topic: &str) -> Result<Vec<ConsumerInfo>, BusError> {
                (**self).consumers(topic)
            }
            fn reset_consumer(&self, topic: &str, name: &str, start: StartAt) -> Result<(), BusError> {
                (**self).reset_consumer(topic, name, start)
            }
            fn delete_consumer(&self, topic: &str, name: &str) -> Result<bool, BusError> {
                (**self).delete_consumer(topic, name)
            }
            fn shared_cursor_store(&self) -> Option<std::sync::Arc<dyn CursorStore>> {
                (**self).shared_cursor_store()
            }
        }
    };
}

forward_durable_consumers!(impl<T: DurableConsumers + ?Sized> DurableConsumers for std::sync::Arc<T>);
forward_durable_consumers!(impl<T: DurableConsumers + ?Sized> DurableConsumers for Box<T>);
forward_durable_consumers!(impl<T: DurableConsumers + ?Sized> DurableConsumers for &T);

/// Checks a consumer name: the topic-name rule (C20), reported on field
/// `consumer`.
pub fn validate_consumer_name(name: &str) -> Result<(), BusError> {
    crate::validate_topic_name(name).map_err(|invalid| {
        BusError::invalid(
            "consumer",
            format!(
                "{name:?}: {} (consumer names follow the topic-name rule)",
                invalid.0
            ),
        )
    })
}
