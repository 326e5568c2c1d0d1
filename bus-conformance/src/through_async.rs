//! The suite through the async surface (feature `async`): [`ThroughAsync`]
//! presents an [`AsyncEventBus`] as an [`EventBus`], so every case runs its
//! publishes, fetches, lookups, offsets, provisioning, topic listing,
//! topic specs and maintenance through the backend's async code.

use std::future::Future;

use bus_core::{
    AsyncEventBus, BatchRecord, BatchRecordWithHeaders, BusError, Capabilities, EventBus, Headers,
    Manifest, PartitionOffsets, PublishAck, Selector, StartAt, StoredEvent, StoredRecord,
    SubscribeOptions, Subscription, TopicSpec,
};

/// A bus whose [`EventBus`] methods run through its [`AsyncEventBus`]
/// surface where that has them, each awaited on the calling thread with a
/// runtime of the wrapper's own entered (two workers, for the backend's
/// timers and blocking pool). The methods the async surface lacks
/// (`set_control_key`, `capabilities`: no I/O) and `subscribe` (the cases need the sync
/// [`Subscription`]; the stream adapter has tests of its own) go to the
/// sync trait.
pub struct ThroughAsync<B> {
    bus: B,
    runtime: Option<tokio::runtime::Runtime>,
}

impl<B> ThroughAsync<B> {
    /// Wraps `bus`.
    pub fn new(bus: B) -> Result<Self, BusError> {
        Self::build(|| async move { Ok(bus) })
    }

    /// Wraps the bus `make` builds on the wrapper's runtime (a NATS bus
    /// made by `connect_async` keeps its connection there: the runtime of
    /// the async caller).
    pub fn build<F, Fut>(make: F) -> Result<Self, BusError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<B, BusError>>,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("through-async")
            .enable_all()
            .build()?;
        let bus = runtime.block_on(make())?;
        Ok(Self {
            bus,
            runtime: Some(runtime),
        })
    }

    /// The wrapped bus.
    pub fn inner(&self) -> &B {
        &self.bus
    }

    fn wait<T>(&self, future: impl Future<Output = T>) -> T {
        let _entered = self.runtime.as_ref().map(tokio::runtime::Runtime::enter);
        futures::executor::block_on(future)
    }
}

impl<B> Drop for ThroughAsync<B> {
    fn drop(&mut self) {
        // Cases drop buses inside runtimes too, where a blocking shutdown
        // would panic.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl<B: EventBus + AsyncEventBus> EventBus for ThroughAsync<B> {
    fn set_control_key(&self, key: [u8; 32]) -> Result<(), BusError> {
        EventBus::set_control_key(&self.bus, key)
    }

    fn publish(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
    ) -> Result<PublishAck, BusError> {
        self.wait(AsyncEventBus::publish(&self.bus, topic, key, value))
    }

    fn publish_idempotent(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: &str,
    ) -> Result<PublishAck, BusError> {
        self.wait(AsyncEventBus::publish_idempotent(
            &self.bus, topic, key, value, event_uid,
        ))
    }

    fn find_event_by_uid(
        &self,
        topic: &str,
        key: &str,
        event_uid: &str,
    ) -> Result<Option<PublishAck>, BusError> {
        self.wait(AsyncEventBus::find_event_by_uid(
            &self.bus, topic, key, event_uid,
        ))
    }

    fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        self.wait(AsyncEventBus::fetch(
            &self.bus, topic, partition, offset, max,
        ))
    }

    fn publish_with_headers(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        self.wait(AsyncEventBus::publish_with_headers(
            &self.bus, topic, key, value, event_uid, headers,
        ))
    }

    fn fetch_with_headers(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        self.wait(AsyncEventBus::fetch_with_headers(
            &self.bus, topic, partition, offset, max,
        ))
    }

    fn partitions(&self, topic: &str) -> Result<u32, BusError> {
        self.wait(AsyncEventBus::partitions(&self.bus, topic))
    }

    fn topics(&self) -> Vec<String> {
        // The sync call has no error to return; a failure here is the
        // async surface's, and fails the case.
        self.wait(AsyncEventBus::topics(&self.bus))
            .unwrap_or_else(|error| panic!("AsyncEventBus::topics failed: {error}"))
    }

    fn maintenance(&self, now_ms: u64) -> Result<u64, BusError> {
        self.wait(AsyncEventBus::maintenance(&self.bus, now_ms))
    }

    fn provision(&self, manifest: &Manifest) -> Result<(), BusError> {
        self.wait(AsyncEventBus::provision(&self.bus, manifest))
    }

    fn capabilities(&self) -> Capabilities {
        EventBus::capabilities(&self.bus)
    }

    fn topic_spec(&self, topic: &str) -> Result<Option<TopicSpec>, BusError> {
        self.wait(AsyncEventBus::topic_spec(&self.bus, topic))
    }

    fn offsets(&self, topic: &str, partition: u32) -> Result<PartitionOffsets, BusError> {
        self.wait(AsyncEventBus::offsets(&self.bus, topic, partition))
    }

    fn publish_batch(
        &self,
        topic: &str,
        records: &[BatchRecord],
    ) -> Result<Vec<PublishAck>, BusError> {
        self.wait(AsyncEventBus::publish_batch(&self.bus, topic, records))
    }

    fn publish_batch_with_headers(
        &self,
        topic: &str,
        records: &[BatchRecordWithHeaders],
    ) -> Result<Vec<PublishAck>, BusError> {
        self.wait(AsyncEventBus::publish_batch_with_headers(
            &self.bus, topic, records,
        ))
    }

    fn subscribe(
        &self,
        topic: &str,
        selector: Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> Result<Subscription, BusError> {
        EventBus::subscribe(&self.bus, topic, selector, start, options)
    }
}
