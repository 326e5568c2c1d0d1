//! Durable consumers from async code (feature `async`): the
//! [`DurableConsumers`] calls run on the caller's tokio runtime's blocking
//! pool ([`crate::backend::on_blocking_pool`]), never on a worker thread.
//!
//! Opening a consumer waits on the backend (a cursor load, an ownership
//! lock or lease that may wait under [`OwnerPolicy::Wait`](super::OwnerPolicy),
//! a subscription's first read), so it must not run inline in a task. The
//! consumer it opens is handed back as a [`ConsumerStream`], whose reads
//! and cursor writes run on a thread of its own.
//!
//! These are free functions over `Arc<B>` rather than methods of
//! [`AsyncEventBus`](crate::AsyncEventBus): that trait cannot gain a
//! required method without breaking code written against the reference
//! trait, and a provided one could only refuse at run time on a bus with no
//! durable consumers. The bus is taken as an `Arc` because the blocking
//! work outlives the borrow of an `async fn` argument's caller.
//!
//! ```
//! # let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! # runtime.block_on(async {
//! use std::sync::Arc;
//! use futures::StreamExt as _;
//! use bus_core::consumer::{ConsumeOptions, consume_async};
//! use bus_core::{EventBus, Manifest, Selector, StartAt, TopicSpec, memory::MemoryBus};
//!
//! let bus = Arc::new(MemoryBus::new());
//! bus.provision(&Manifest::new([TopicSpec::new("audit", 1)])).unwrap();
//! bus.publish("audit", "k", &serde_json::json!({"n": 1})).unwrap();
//! let mut stream = consume_async(
//!     Arc::clone(&bus), "audit", "mailer", Selector::Topic, StartAt::Beginning,
//!     ConsumeOptions::default(),
//! ).await.unwrap();
//! let delivery = stream.next().await.unwrap().unwrap();
//! stream.ack(&delivery).await.unwrap();
//! # });
//! ```

use std::sync::Arc;

use super::{ConsumeOptions, ConsumerInfo, ConsumerStream, DurableConsumers};
use crate::BusError;
use crate::asynchronous::on_blocking_pool;
use crate::subscription::{Selector, StartAt};

/// The `backend` the blocking pool's own failure (a runtime shutting down)
/// is reported under: the bus behind `B` is not known here.
const BACKEND: &str = "bus";

/// [`DurableConsumers::consume`] on the blocking pool, as a
/// [`ConsumerStream`] (C20–C23 as the sync call keeps them).
pub async fn consume_async<B>(
    bus: Arc<B>,
    topic: &str,
    name: &str,
    selector: Selector,
    start_if_new: StartAt,
    options: ConsumeOptions,
) -> Result<ConsumerStream, BusError>
where
    B: DurableConsumers + Send + Sync + 'static + ?Sized,
{
    let (topic, name) = (topic.to_owned(), name.to_owned());
    on_blocking_pool(BACKEND, "consume", move || {
        bus.consume(&topic, &name, selector, start_if_new, options)?
            .into_stream()
    })
    .await
}

/// [`DurableConsumers::consumers`] on the blocking pool.
pub async fn consumers_async<B>(bus: Arc<B>, topic: &str) -> Result<Vec<ConsumerInfo>, BusError>
where
    B: DurableConsumers + Send + Sync + 'static + ?Sized,
{
    let topic = topic.to_owned();
    on_blocking_pool(BACKEND, "consumers", move || bus.consumers(&topic)).await
}

/// [`DurableConsumers::reset_consumer`] on the blocking pool.
pub async fn reset_consumer_async<B>(
    bus: Arc<B>,
    topic: &str,
    name: &str,
    start: StartAt,
) -> Result<(), BusError>
where
    B: DurableConsumers + Send + Sync + 'static + ?Sized,
{
    let (topic, name) = (topic.to_owned(), name.to_owned());
    on_blocking_pool(BACKEND, "reset_consumer", move || {
        bus.reset_consumer(&topic, &name, start)
    })
    .await
}

/// [`DurableConsumers::delete_consumer`] on the blocking pool.
pub async fn delete_consumer_async<B>(
    bus: Arc<B>,
    topic: &str,
    name: &str,
) -> Result<bool, BusError>
where
    B: DurableConsumers + Send + Sync + 'static + ?Sized,
{
    let (topic, name) = (topic.to_owned(), name.to_owned());
    on_blocking_pool(BACKEND, "delete_consumer", move || {
        bus.delete_consumer(&topic, &name)
    })
    .await
}
