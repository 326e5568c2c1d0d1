//! The async surface (feature `async`): the [`EventBus`](crate::EventBus)
//! operations as futures, for tokio applications.
//!
//! [`AsyncEventBus`] is object safe (`Arc<dyn AsyncEventBus>` works): each
//! method returns a boxed `Send` future borrowing its arguments. Every
//! contract rule holds as it does for the synchronous trait; what changes is
//! only where the caller waits:
//!
//! - memory: the operations run inline (they never wait on I/O);
//! - embedded: a publish joins the partition's group commit and awaits its
//!   answer while a commit thread of the bus writes and fsyncs; reads run on
//!   the caller's runtime's blocking pool, never on a worker;
//! - NATS: the operations await the backend's own async-nats code on the
//!   caller's runtime (no connector thread when the bus was made by
//!   `NatsBus::connect_async` or `NatsBus::from_client`);
//! - Kafka: a plain publish awaits its delivery report; what librdkafka only
//!   offers as blocking calls runs on the caller's blocking pool;
//! - PostgreSQL: the operations await the backend's own tokio-postgres code
//!   on the caller's runtime (no connector thread when the bus was made by
//!   `PostgresBus::connect_async`).
//!
//! A type that implements both traits has two methods named `publish`:
//! call through `Arc<dyn AsyncEventBus>` (or `AsyncEventBus::publish(&bus,
//! ..)`) when both traits are in scope.
//!
//! ```
//! # futures::executor::block_on(async {
//! use std::sync::Arc;
//! use bus_core::{AsyncEventBus, Manifest, TopicSpec, memory::MemoryBus};
//!
//! let bus: Arc<dyn AsyncEventBus> = Arc::new(MemoryBus::new());
//! bus.provision(&Manifest::new([TopicSpec::new("audit", 2)])).await.unwrap();
//! let ack = bus.publish_idempotent("audit", "k", &serde_json::json!({"n": 1}), "uid-1").await.unwrap();
//! assert_eq!(bus.find_event_by_uid("audit", "k", "uid-1").await.unwrap(), Some(ack));
//! # });
//! ```

use std::future::Future;
use std::pin::Pin;

use crate::subscription::{Selector, StartAt, SubscribeOptions, SubscriptionStream};
use crate::{
    BatchRecord, BatchRecordWithHeaders, BusError, Headers, Manifest, PartitionOffsets, PublishAck,
    StoredEvent, StoredRecord, TopicSpec,
};

/// A boxed, `Send` future: what every [`AsyncEventBus`] method returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs `work` on the caller's tokio runtime's blocking pool (never a
/// worker thread): what a backend's async surface does with a call that
/// only has a blocking form (files, librdkafka's consumer, rare
/// administrative calls). `backend` and `what` name it if the pool drops
/// it (a runtime shutting down).
pub async fn on_blocking_pool<T, F>(
    backend: &'static str,
    what: &'static str,
    work: F,
) -> Result<T, BusError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, BusError> + Send + 'static,
{
    // The caller's span (the operation's, under `Traced`) follows the work
    // onto the pool thread, so what the work logs is attributed to it.
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(work))
        .await
        .unwrap_or_else(|error| {
            Err(BusError::backend(
                backend,
                format!("{what} did not finish: {error}"),
            ))
        })
}

/// The [`EventBus`](crate::EventBus) operations as futures. See the module
/// documentation for where each backend waits.
pub trait AsyncEventBus: Send + Sync {
    /// `EventBus::publish`.
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<PublishAck, BusError>>;

    /// `EventBus::publish_idempotent`.
    fn publish_idempotent<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
        event_uid: &'a str,
    ) -> BoxFuture<'a, Result<PublishAck, BusError>>;

    /// `EventBus::publish_batch`.
    fn publish_batch<'a>(
        &'a self,
        topic: &'a str,
        records: &'a [BatchRecord],
    ) -> BoxFuture<'a, Result<Vec<PublishAck>, BusError>>;

    /// `EventBus::fetch`.
    fn fetch<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredEvent>, BusError>>;

    /// `EventBus::find_event_by_uid`.
    fn find_event_by_uid<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        event_uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<PublishAck>, BusError>>;

    /// `EventBus::publish_with_headers` (C25), with the same default: empty
    /// headers are a plain publish, others [`BusError::Unsupported`] until
    /// the backend stores them.
    fn publish_with_headers<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
        event_uid: Option<&'a str>,
        headers: &'a Headers,
    ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
        Box::pin(async move {
            if !headers.is_empty() {
                headers.validate()?;
                return Err(BusError::Unsupported {
                    operation: "publish_with_headers".to_owned(),
                    backend: "async".to_owned(),
                });
            }
            match event_uid {
                Some(uid) => self.publish_idempotent(topic, key, value, uid).await,
                None => self.publish(topic, key, value).await,
            }
        })
    }

    /// `EventBus::publish_batch_with_headers` (C25), with the same default:
    /// a batch without headers is a plain batch, headers are checked and
    /// then [`BusError::Unsupported`] until the backend stores them.
    fn publish_batch_with_headers<'a>(
        &'a self,
        topic: &'a str,
        records: &'a [BatchRecordWithHeaders],
    ) -> BoxFuture<'a, Result<Vec<PublishAck>, BusError>> {
        Box::pin(async move {
            let plain = crate::batch::without_headers(records, "async")?;
            self.publish_batch(topic, &plain).await
        })
    }

    /// `EventBus::fetch_with_headers` (C25); the default gives every record
    /// empty headers.
    fn fetch_with_headers<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredRecord>, BusError>> {
        Box::pin(async move {
            Ok(self
                .fetch(topic, partition, offset, max)
                .await?
                .into_iter()
                .map(StoredRecord::from)
                .collect())
        })
    }

    /// `EventBus::offsets`.
    fn offsets<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
    ) -> BoxFuture<'a, Result<PartitionOffsets, BusError>>;

    /// `EventBus::partitions`.
    fn partitions<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<u32, BusError>>;

    /// `EventBus::provision`.
    fn provision<'a>(&'a self, manifest: &'a Manifest) -> BoxFuture<'a, Result<(), BusError>>;

    /// `EventBus::topics`: the names of the provisioned topics.
    fn topics<'a>(&'a self) -> BoxFuture<'a, Result<Vec<String>, BusError>>;

    /// `EventBus::topic_spec`.
    fn topic_spec<'a>(
        &'a self,
        topic: &'a str,
    ) -> BoxFuture<'a, Result<Option<TopicSpec>, BusError>>;

    /// `EventBus::maintenance`: retention applied as of `now_ms`; the
    /// records expired.
    fn maintenance<'a>(&'a self, now_ms: u64) -> BoxFuture<'a, Result<u64, BusError>>;

    /// `EventBus::subscribe`, as a `Stream` of items (see
    /// [`SubscriptionStream`]).
    fn subscribe<'a>(
        &'a self,
        topic: &'a str,
        selector: Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> BoxFuture<'a, Result<SubscriptionStream, BusError>>;
}

/// Forwards every method, so an async bus travels as `Box<T>`, `Arc<T>` or `&T`.
macro_rules! forward_async_event_bus {
    ($($impl_head:tt)*) => {
        $($impl_head)* {
            fn publish<'a>(&'a self, topic: &'a str, key: &'a str, value: &'a serde_json::Value) -> BoxFuture<'a, Result<PublishAck, BusError>> {
                (**self).publish(topic, key, value)
            }
            fn publish_idempotent<'a>(&'a self, topic: &'a str, key: &'a str, value: &'a serde_json::Value, event_uid: &'a str) -> BoxFuture<'a, Result<PublishAck, BusError>> {
                (**self).publish_idempotent(topic, key, value, event_uid)
            }
            fn publish_batch<'a>(&'a self, topic: &'a str, records: &'a [BatchRecord]) -> BoxFuture<'a, Result<Vec<PublishAck>, BusError>> {
                (**self).publish_batch(topic, records)
            }
            fn publish_batch_with_headers<'a>(&'a self, topic: &'a str, records: &'a [BatchRecordWithHeaders]) -> BoxFuture<'a, Result<Vec<PublishAck>, BusError>> {
                (**self).publish_batch_with_headers(topic, records)
            }
            fn fetch<'a>(&'a self, topic: &'a str, partition: u32, offset: u64, max: usize) -> BoxFuture<'a, Result<Vec<StoredEvent>, BusError>> {
                (**self).fetch(topic, partition, offset, max)
            }
            fn find_event_by_uid<'a>(&'a self, topic: &'a str, key: &'a str, event_uid: &'a str) -> BoxFuture<'a, Result<Option<PublishAck>, BusError>> {
                (**self).find_event_by_uid(topic, key, event_uid)
            }
            fn publish_with_headers<'a>(&'a self, topic: &'a str, key: &'a str, value: &'a serde_json::Value, event_uid: Option<&'a str>, headers: &'a Headers) -> BoxFuture<'a, Result<PublishAck, BusError>> {
                (**self).publish_with_headers(topic, key, value, event_uid, headers)
            }
            fn fetch_with_headers<'a>(&'a self, topic: &'a str, partition: u32, offset: u64, max: usize) -> BoxFuture<'a, Result<Vec<StoredRecord>, BusError>> {
                (**self).fetch_with_headers(topic, partition, offset, max)
            }
            fn offsets<'a>(&'a self, topic: &'a str, partition: u32) -> BoxFuture<'a, Result<PartitionOffsets, BusError>> {
                (**self).offsets(topic, partition)
            }
            fn partitions<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<u32, BusError>> {
                (**self).partitions(topic)
            }
            fn provision<'a>(&'a self, manifest: &'a Manifest) -> BoxFuture<'a, Result<(), BusError>> {
                (**self).provision(manifest)
            }
            fn topics<'a>(&'a self) -> BoxFuture<'a, Result<Vec<String>, BusError>> {
                (**self).topics()
            }
            fn topic_spec<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<Option<TopicSpec>, BusError>> {
                (**self).topic_spec(topic)
            }
            fn maintenance<'a>(&'a self, now_ms: u64) -> BoxFuture<'a, Result<u64, BusError>> {
                (**self).maintenance(now_ms)
            }
            fn subscribe<'a>(&'a self, topic: &'a str, selector: Selector, start: StartAt, options: SubscribeOptions) -> BoxFuture<'a, Result<SubscriptionStream, BusError>> {
                (**self).subscribe(topic, selector, start, options)
            }
        }
    };
}

forward_async_event_bus!(impl<T: AsyncEventBus + ?Sized> AsyncEventBus for Box<T>);
forward_async_event_bus!(impl<T: AsyncEventBus + ?Sized> AsyncEventBus for std::sync::Arc<T>);
forward_async_event_bus!(impl<T: AsyncEventBus + ?Sized> AsyncEventBus for &T);

/// The memory backend never waits on I/O: its operations run inline.
impl AsyncEventBus for crate::memory::MemoryBus {
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
        Box::pin(async move { crate::EventBus::publish(self, topic, key, value) })
    }

    fn publish_idempotent<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
        event_uid: &'a str,
    ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
        Box::pin(
            async move { crate::EventBus::publish_idempotent(self, topic, key, value, event_uid) },
        )
    }

    fn publish_batch<'a>(
        &'a self,
        topic: &'a str,
        records: &'a [BatchRecord],
    ) -> BoxFuture<'a, Result<Vec<PublishAck>, BusError>> {
        Box::pin(async move { crate::EventBus::publish_batch(self, topic, records) })
    }

    fn publish_batch_with_headers<'a>(
        &'a self,
        topic: &'a str,
        records: &'a [BatchRecordWithHeaders],
    ) -> BoxFuture<'a, Result<Vec<PublishAck>, BusError>> {
        Box::pin(async move { crate::EventBus::publish_batch_with_headers(self, topic, records) })
    }

    fn fetch<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredEvent>, BusError>> {
        Box::pin(async move { crate::EventBus::fetch(self, topic, partition, offset, max) })
    }

    fn find_event_by_uid<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        event_uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<PublishAck>, BusError>> {
        Box::pin(async move { crate::EventBus::find_event_by_uid(self, topic, key, event_uid) })
    }

    fn publish_with_headers<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
        event_uid: Option<&'a str>,
        headers: &'a Headers,
    ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
        Box::pin(async move {
            crate::EventBus::publish_with_headers(self, topic, key, value, event_uid, headers)
        })
    }

    fn fetch_with_headers<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredRecord>, BusError>> {
        Box::pin(
            async move { crate::EventBus::fetch_with_headers(self, topic, partition, offset, max) },
        )
    }

    fn offsets<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
    ) -> BoxFuture<'a, Result<PartitionOffsets, BusError>> {
        Box::pin(async move { crate::EventBus::offsets(self, topic, partition) })
    }

    fn partitions<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<u32, BusError>> {
        Box::pin(async move { crate::EventBus::partitions(self, topic) })
    }

    fn provision<'a>(&'a self, manifest: &'a Manifest) -> BoxFuture<'a, Result<(), BusError>> {
        Box::pin(async move { crate::EventBus::provision(self, manifest) })
    }

    fn topics<'a>(&'a self) -> BoxFuture<'a, Result<Vec<String>, BusError>> {
        Box::pin(async move { Ok(crate::EventBus::topics(self)) })
    }

    fn topic_spec<'a>(
        &'a self,
        topic: &'a str,
    ) -> BoxFuture<'a, Result<Option<TopicSpec>, BusError>> {
        Box::pin(async move { crate::EventBus::topic_spec(self, topic) })
    }

    fn maintenance<'a>(&'a self, now_ms: u64) -> BoxFuture<'a, Result<u64, BusError>> {
        Box::pin(async move { crate::EventBus::maintenance(self, now_ms) })
    }

    fn subscribe<'a>(
        &'a self,
        topic: &'a str,
        selector: Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> BoxFuture<'a, Result<SubscriptionStream, BusError>> {
        Box::pin(async move {
            crate::EventBus::subscribe(self, topic, selector, start, options)?.into_stream()
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use futures::StreamExt as _;
    use serde_json::json;

    use super::*;
    use crate::memory::MemoryBus;
    use crate::{SubscriptionItem, TopicSpec};

    #[test]
    fn memory_round_trip_through_the_async_surface() {
        futures::executor::block_on(async {
            let bus: Arc<dyn AsyncEventBus> = Arc::new(MemoryBus::new());
            let manifest = Manifest::new([TopicSpec::new("t", 2)]);
            bus.provision(&manifest).await.unwrap();
            assert_eq!(bus.partitions("t").await.unwrap(), 2);
            let ack = bus
                .publish_idempotent("t", "k", &json!({"n": 1}), "u1")
                .await
                .unwrap();
            let again = bus
                .publish_idempotent("t", "k", &json!({"n": 1}), "u1")
                .await
                .unwrap();
            assert_eq!(ack, again);
            let batch = [BatchRecord::new("k", json!({"n": 2}))];
            let acks = bus.publish_batch("t", &batch).await.unwrap();
            assert_eq!(acks[0].offset, ack.offset + 1);
            let events = bus.fetch("t", ack.partition, 0, 10).await.unwrap();
            assert_eq!(events.len(), 2);
            assert_eq!(
                bus.find_event_by_uid("t", "k", "u1").await.unwrap(),
                Some(ack.clone())
            );
            assert_eq!(bus.offsets("t", ack.partition).await.unwrap().next, 2);
            let mut stream = bus
                .subscribe(
                    "t",
                    Selector::Partition(ack.partition),
                    StartAt::Beginning,
                    SubscribeOptions::default(),
                )
                .await
                .unwrap();
            let first = stream.next().await.unwrap().unwrap();
            assert!(
                matches!(first, SubscriptionItem::Record { ref event, .. } if event.offset == 0),
                "{first:?}"
            );
            assert!(matches!(
                bus.publish("nope", "k", &json!({})).await,
                Err(BusError::UnknownTopic(_))
            ));
        });
    }
}
