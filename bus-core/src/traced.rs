//! [`Traced`]: the one place the span schema is written. Every backend's
//! operations get the same span names and fields by being wrapped, instead
//! of each backend repeating `#[tracing::instrument]` on each method.

use crate::consumer::{ConsumeOptions, Consumer, ConsumerInfo, DurableConsumers};
use crate::subscription::{Selector, StartAt, SubscribeOptions, Subscription};
use crate::{
    BatchRecord, BatchRecordWithHeaders, BusError, Capabilities, EventBus, Headers, Manifest,
    PartitionOffsets, PublishAck, StoredEvent, StoredRecord, TopicSpec,
};

/// A bus whose operations each run in a `tracing` span of the bus span
/// schema; everything else is the wrapped bus's own behaviour.
///
/// `bus::open` and `bus::open_async` return their buses wrapped in it. A
/// backend built by hand (`EmbeddedBus::open(dir)`, `NatsBus::connect(url)`,
/// `MemoryBus::new()`, ...) opens **no** spans of its own: wrap it with
/// [`Traced::new`] to get them. What a bare backend still gives: its
/// `tracing` events (warnings such as a truncated torn tail, errors such as
/// a poisoned partition, connection state changes; they are then not
/// inside an operation's span) and its metrics (feature `metrics`, which
/// the backends record themselves, with or without the wrapper).
///
/// The schema, the same on the sync ([`EventBus`]) and the async
/// (`AsyncEventBus`, feature `async`) surfaces; every span is at level
/// `INFO`, and `backend` is the name [`Capabilities::backend`] reports
/// (`"memory"`, `"embedded"`, `"nats"`, `"kafka"`, `"postgres"`):
///
/// | span | fields |
/// |---|---|
/// | `bus.publish` | `backend`, `topic` |
/// | `bus.publish_idempotent` | `backend`, `topic`, `uid` |
/// | `bus.publish_batch` | `backend`, `topic`, `records` (the batch's length) |
/// | `bus.find_event_by_uid` | `backend`, `topic`, `uid` |
/// | `bus.fetch` | `backend`, `topic`, `partition`, `offset`, `max` |
/// | `bus.offsets` | `backend`, `topic`, `partition` |
/// | `bus.topic_spec` | `backend`, `topic` |
/// | `bus.provision` | `backend` |
/// | `bus.maintenance` | `backend` |
/// | `bus.subscribe` | `backend`, `topic` (the call that opens the subscription) |
/// | `bus.consume` | `backend`, `topic`, `consumer` (the call that opens a durable consumer, C20) |
/// | `bus.consumers` | `backend`, `topic` |
/// | `bus.consumer.reset` | `backend`, `topic`, `consumer` |
/// | `bus.consumer.delete` | `backend`, `topic`, `consumer` |
///
/// The durable-consumer spans ([`DurableConsumers`], where the wrapped bus
/// implements it) cover the call only: a [`Consumer`]'s deliveries and
/// acknowledgements run later, outside them, as a subscription's records
/// do.
///
/// `partitions`, `topics`, `capabilities` and `set_control_key` are cheap
/// lookups and run without a span. Errors are returned, not recorded on the
/// span: the caller decides whether a refusal (an unknown topic, a
/// duplicate) is worth a log line.
///
/// ```
/// use bus_core::{EventBus, Manifest, TopicSpec, Traced, memory::MemoryBus};
///
/// let bus = Traced::new(MemoryBus::new());
/// bus.provision(&Manifest::new([TopicSpec::new("audit", 1)])).unwrap();
/// // Runs in the span `bus.publish{backend="memory" topic=audit}`.
/// bus.publish("audit", "k", &serde_json::json!({"n": 1})).unwrap();
/// let bare: MemoryBus = bus.into_inner();
/// assert_eq!(bare.topics(), ["audit"]);
/// ```
#[derive(Debug, Clone)]
pub struct Traced<B> {
    inner: B,
    backend: &'static str,
    /// `messaging.system` of the OpenTelemetry spans (feature `otel`).
    #[cfg(feature = "otel")]
    system: &'static str,
    /// Whether the wrapped bus stores headers, so a publish may carry the
    /// trace context (feature `otel`).
    #[cfg(feature = "otel")]
    keeps_headers: bool,
}

impl<B: EventBus> Traced<B> {
    /// Wraps `bus`; its spans name the backend [`Capabilities::backend`]
    /// reports (asked once, here).
    pub fn new(bus: B) -> Self {
        let capabilities = bus.capabilities();
        #[cfg_attr(not(feature = "otel"), allow(unused_mut))]
        let mut traced = Self::named(bus, capabilities.backend);
        #[cfg(feature = "otel")]
        {
            traced.keeps_headers = capabilities.headers;
        }
        traced
    }
}

impl<B> Traced<B> {
    /// Wraps `bus` with `backend` as the spans' `backend` field: for a type
    /// that implements only the async surface, which has no `capabilities`.
    /// With the feature `otel`, such a bus is not known to keep headers, so
    /// its publishes carry no trace context (its spans are recorded).
    pub fn named(bus: B, backend: &'static str) -> Self {
        Self {
            inner: bus,
            backend,
            #[cfg(feature = "otel")]
            system: crate::otel::messaging_system(backend),
            #[cfg(feature = "otel")]
            keeps_headers: false,
        }
    }

    /// The wrapped bus (its calls open no spans).
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The wrapped bus, unwrapped.
    pub fn into_inner(self) -> B {
        self.inner
    }

    /// The `backend` field of the spans.
    pub fn backend(&self) -> &'static str {
        self.backend
    }
}

/// The span of each traced operation, shared by the sync and async
/// surfaces so the two cannot drift apart. `info_span!` needs its field
/// names at compile time, hence one arm per operation.
macro_rules! op_span {
    ($self:ident, publish, $topic:expr) => {
        tracing::info_span!("bus.publish", backend = $self.backend, topic = %$topic)
    };
    ($self:ident, publish_idempotent, $topic:expr, $uid:expr) => {
        tracing::info_span!("bus.publish_idempotent", backend = $self.backend, topic = %$topic, uid = %$uid)
    };
    ($self:ident, publish_batch, $topic:expr, $records:expr) => {
        tracing::info_span!("bus.publish_batch", backend = $self.backend, topic = %$topic, records = $records)
    };
    ($self:ident, find_event_by_uid, $topic:expr, $uid:expr) => {
        tracing::info_span!("bus.find_event_by_uid", backend = $self.backend, topic = %$topic, uid = %$uid)
    };
    ($self:ident, fetch, $topic:expr, $partition:expr, $offset:expr, $max:expr) => {
        tracing::info_span!("bus.fetch", backend = $self.backend, topic = %$topic, partition = $partition, offset = $offset, max = $max)
    };
    ($self:ident, offsets, $topic:expr, $partition:expr) => {
        tracing::info_span!("bus.offsets", backend = $self.backend, topic = %$topic, partition = $partition)
    };
    ($self:ident, topic_spec, $topic:expr) => {
        tracing::info_span!("bus.topic_spec", backend = $self.backend, topic = %$topic)
    };
    ($self:ident, provision) => {
        tracing::info_span!("bus.provision", backend = $self.backend)
    };
    ($self:ident, maintenance) => {
        tracing::info_span!("bus.maintenance", backend = $self.backend)
    };
    ($self:ident, subscribe, $topic:expr) => {
        tracing::info_span!("bus.subscribe", backend = $self.backend, topic = %$topic)
    };
    ($self:ident, consume, $topic:expr, $consumer:expr) => {
        tracing::info_span!("bus.consume", backend = $self.backend, topic = %$topic, consumer = %$consumer)
    };
    ($self:ident, consumers, $topic:expr) => {
        tracing::info_span!("bus.consumers", backend = $self.backend, topic = %$topic)
    };
    ($self:ident, consumer_reset, $topic:expr, $consumer:expr) => {
        tracing::info_span!("bus.consumer.reset", backend = $self.backend, topic = %$topic, consumer = %$consumer)
    };
    ($self:ident, consumer_delete, $topic:expr, $consumer:expr) => {
        tracing::info_span!("bus.consumer.delete", backend = $self.backend, topic = %$topic, consumer = %$consumer)
    };
}

/// Durable consumers (C20–C23) of a wrapped bus that has them, each call
/// in its span of the schema.
impl<B: DurableConsumers> DurableConsumers for Traced<B> {
    fn consume(
        &self,
        topic: &str,
        name: &str,
        selector: Selector,
        start_if_new: StartAt,
        options: ConsumeOptions,
    ) -> Result<Consumer, BusError> {
        op_span!(self, consume, topic, name).in_scope(|| {
            #[cfg_attr(not(feature = "otel"), allow(unused_mut))]
            let mut consumer = self
                .inner
                .consume(topic, name, selector, start_if_new, options)?;
            #[cfg(feature = "otel")]
            consumer.trace_deliveries(self.system);
            Ok(consumer)
        })
    }

    fn consumers(&self, topic: &str) -> Result<Vec<ConsumerInfo>, BusError> {
        op_span!(self, consumers, topic).in_scope(|| self.inner.consumers(topic))
    }

    fn reset_consumer(&self, topic: &str, name: &str, start: StartAt) -> Result<(), BusError> {
        op_span!(self, consumer_reset, topic, name)
            .in_scope(|| self.inner.reset_consumer(topic, name, start))
    }

    fn delete_consumer(&self, topic: &str, name: &str) -> Result<bool, BusError> {
        op_span!(self, consumer_delete, topic, name)
            .in_scope(|| self.inner.delete_consumer(topic, name))
    }
}

impl<B: EventBus> Traced<B> {
    /// One publish, by the call the caller made (`headers` for
    /// `publish_with_headers`, `uid` for the idempotent ones).
    #[cfg(not(feature = "otel"))]
    fn send(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        uid: Option<&str>,
        headers: Option<&Headers>,
    ) -> Result<PublishAck, BusError> {
        match (headers, uid) {
            (Some(headers), _) => self
                .inner
                .publish_with_headers(topic, key, value, uid, headers),
            (None, Some(uid)) => self.inner.publish_idempotent(topic, key, value, uid),
            (None, None) => self.inner.publish(topic, key, value),
        }
    }

    /// One publish in its `send` span, with the trace context added to
    /// the headers where the bus keeps them (see [`crate::otel`]).
    #[cfg(feature = "otel")]
    fn send(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        uid: Option<&str>,
        headers: Option<&Headers>,
    ) -> Result<PublishAck, BusError> {
        let sending = crate::otel::Sending::start(
            self.system,
            topic,
            headers.unwrap_or(&crate::otel::NO_HEADERS),
            self.keeps_headers,
        )?;
        let acked = match (sending.headers().or(headers), uid) {
            (Some(headers), _) => self
                .inner
                .publish_with_headers(topic, key, value, uid, headers),
            (None, Some(uid)) => self.inner.publish_idempotent(topic, key, value, uid),
            (None, None) => self.inner.publish(topic, key, value),
        };
        sending.finish(uid, value, &acked);
        acked
    }
}

impl<B: EventBus> EventBus for Traced<B> {
    fn set_control_key(&self, key: [u8; 32]) -> Result<(), BusError> {
        self.inner.set_control_key(key)
    }

    fn publish(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
    ) -> Result<PublishAck, BusError> {
        op_span!(self, publish, topic).in_scope(|| self.send(topic, key, value, None, None))
    }

    fn publish_idempotent(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: &str,
    ) -> Result<PublishAck, BusError> {
        op_span!(self, publish_idempotent, topic, event_uid)
            .in_scope(|| self.send(topic, key, value, Some(event_uid), None))
    }

    fn find_event_by_uid(
        &self,
        topic: &str,
        key: &str,
        event_uid: &str,
    ) -> Result<Option<PublishAck>, BusError> {
        op_span!(self, find_event_by_uid, topic, event_uid)
            .in_scope(|| self.inner.find_event_by_uid(topic, key, event_uid))
    }

    fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        op_span!(self, fetch, topic, partition, offset, max).in_scope(|| {
            #[cfg(feature = "otel")]
            let receiving = crate::otel::Receiving::start(self.system, topic, partition);
            let fetched = self.inner.fetch(topic, partition, offset, max);
            #[cfg(feature = "otel")]
            receiving.finish_events(&fetched);
            fetched
        })
    }

    /// In the `bus.publish` span: headers are a publish's argument, not
    /// another operation (C25).
    fn publish_with_headers(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        op_span!(self, publish, topic)
            .in_scope(|| self.send(topic, key, value, event_uid, Some(headers)))
    }

    /// In the `bus.fetch` span.
    fn fetch_with_headers(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        op_span!(self, fetch, topic, partition, offset, max).in_scope(|| {
            #[cfg(feature = "otel")]
            let receiving = crate::otel::Receiving::start(self.system, topic, partition);
            let fetched = self.inner.fetch_with_headers(topic, partition, offset, max);
            #[cfg(feature = "otel")]
            receiving.finish_records(&fetched);
            fetched
        })
    }

    fn delete_below(&self, topic: &str, partition: u32, offset: u64) -> Result<u64, BusError> {
        self.inner.delete_below(topic, partition, offset)
    }

    fn partitions(&self, topic: &str) -> Result<u32, BusError> {
        self.inner.partitions(topic)
    }

    fn topics(&self) -> Vec<String> {
        self.inner.topics()
    }

    fn maintenance(&self, now_ms: u64) -> Result<u64, BusError> {
        op_span!(self, maintenance).in_scope(|| self.inner.maintenance(now_ms))
    }

    fn provision(&self, manifest: &Manifest) -> Result<(), BusError> {
        op_span!(self, provision).in_scope(|| self.inner.provision(manifest))
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn topic_spec(&self, topic: &str) -> Result<Option<TopicSpec>, BusError> {
        op_span!(self, topic_spec, topic).in_scope(|| self.inner.topic_spec(topic))
    }

    fn offsets(&self, topic: &str, partition: u32) -> Result<PartitionOffsets, BusError> {
        op_span!(self, offsets, topic, partition).in_scope(|| self.inner.offsets(topic, partition))
    }

    fn publish_batch(
        &self,
        topic: &str,
        records: &[BatchRecord],
    ) -> Result<Vec<PublishAck>, BusError> {
        op_span!(self, publish_batch, topic, records.len()).in_scope(|| {
            #[cfg(feature = "otel")]
            let sending = crate::otel::Sending::batch(self.system, topic, records.len());
            let acks = self.inner.publish_batch(topic, records);
            #[cfg(feature = "otel")]
            sending.finish_batch(&acks);
            acks
        })
    }

    /// In the `bus.publish_batch` span, as [`EventBus::publish_with_headers`]
    /// is in `bus.publish`.
    fn publish_batch_with_headers(
        &self,
        topic: &str,
        records: &[BatchRecordWithHeaders],
    ) -> Result<Vec<PublishAck>, BusError> {
        op_span!(self, publish_batch, topic, records.len())
            .in_scope(|| self.inner.publish_batch_with_headers(topic, records))
    }

    fn subscribe(
        &self,
        topic: &str,
        selector: Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> Result<Subscription, BusError> {
        op_span!(self, subscribe, topic).in_scope(|| {
            #[cfg_attr(not(feature = "otel"), allow(unused_mut))]
            let mut subscription = self.inner.subscribe(topic, selector, start, options)?;
            #[cfg(feature = "otel")]
            subscription.trace_deliveries(self.system);
            Ok(subscription)
        })
    }
}

#[cfg(feature = "async")]
mod asynchronous {
    use tracing::Instrument as _;

    use super::Traced;
    use crate::subscription::{Selector, StartAt, SubscribeOptions, SubscriptionStream};
    use crate::{
        AsyncEventBus, BatchRecord, BatchRecordWithHeaders, BoxFuture, BusError, Headers, Manifest,
        PartitionOffsets, PublishAck, StoredEvent, StoredRecord, TopicSpec,
    };

    impl<B: AsyncEventBus> Traced<B> {
        /// [`Traced::send`] for the async surface: the inner call's future.
        #[cfg(not(feature = "otel"))]
        fn send_async<'a>(
            &'a self,
            topic: &'a str,
            key: &'a str,
            value: &'a serde_json::Value,
            uid: Option<&'a str>,
            headers: Option<&'a Headers>,
        ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
            match (headers, uid) {
                (Some(headers), _) => self
                    .inner
                    .publish_with_headers(topic, key, value, uid, headers),
                (None, Some(uid)) => self.inner.publish_idempotent(topic, key, value, uid),
                (None, None) => self.inner.publish(topic, key, value),
            }
        }

        /// [`Traced::send`] for the async surface. The span starts (and the
        /// current context is read) when the call is made, not when the
        /// future is first polled.
        #[cfg(feature = "otel")]
        fn send_async<'a>(
            &'a self,
            topic: &'a str,
            key: &'a str,
            value: &'a serde_json::Value,
            uid: Option<&'a str>,
            headers: Option<&'a Headers>,
        ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
            let sending = crate::otel::Sending::start(
                self.system,
                topic,
                headers.unwrap_or(&crate::otel::NO_HEADERS),
                self.keeps_headers,
            );
            Box::pin(async move {
                let sending = sending?;
                let acked = match (sending.headers().or(headers), uid) {
                    (Some(headers), _) => {
                        self.inner
                            .publish_with_headers(topic, key, value, uid, headers)
                            .await
                    }
                    (None, Some(uid)) => {
                        self.inner.publish_idempotent(topic, key, value, uid).await
                    }
                    (None, None) => self.inner.publish(topic, key, value).await,
                };
                sending.finish(uid, value, &acked);
                acked
            })
        }
    }

    /// Each future runs in the span the sync surface opens for the same
    /// operation (entered on every poll, closed when the future is done or
    /// dropped).
    impl<B: AsyncEventBus> AsyncEventBus for Traced<B> {
        fn publish<'a>(
            &'a self,
            topic: &'a str,
            key: &'a str,
            value: &'a serde_json::Value,
        ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
            let span = op_span!(self, publish, topic);
            Box::pin(
                self.send_async(topic, key, value, None, None)
                    .instrument(span),
            )
        }

        fn publish_idempotent<'a>(
            &'a self,
            topic: &'a str,
            key: &'a str,
            value: &'a serde_json::Value,
            event_uid: &'a str,
        ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
            let span = op_span!(self, publish_idempotent, topic, event_uid);
            Box::pin(
                self.send_async(topic, key, value, Some(event_uid), None)
                    .instrument(span),
            )
        }

        fn publish_batch<'a>(
            &'a self,
            topic: &'a str,
            records: &'a [BatchRecord],
        ) -> BoxFuture<'a, Result<Vec<PublishAck>, BusError>> {
            let span = op_span!(self, publish_batch, topic, records.len());
            #[cfg(feature = "otel")]
            {
                let sending = crate::otel::Sending::batch(self.system, topic, records.len());
                let batch = self.inner.publish_batch(topic, records);
                Box::pin(
                    async move {
                        let acks = batch.await;
                        sending.finish_batch(&acks);
                        acks
                    }
                    .instrument(span),
                )
            }
            #[cfg(not(feature = "otel"))]
            Box::pin(self.inner.publish_batch(topic, records).instrument(span))
        }

        fn publish_batch_with_headers<'a>(
            &'a self,
            topic: &'a str,
            records: &'a [BatchRecordWithHeaders],
        ) -> BoxFuture<'a, Result<Vec<PublishAck>, BusError>> {
            let span = op_span!(self, publish_batch, topic, records.len());
            Box::pin(
                self.inner
                    .publish_batch_with_headers(topic, records)
                    .instrument(span),
            )
        }

        fn fetch<'a>(
            &'a self,
            topic: &'a str,
            partition: u32,
            offset: u64,
            max: usize,
        ) -> BoxFuture<'a, Result<Vec<StoredEvent>, BusError>> {
            let span = op_span!(self, fetch, topic, partition, offset, max);
            #[cfg(feature = "otel")]
            {
                let receiving = crate::otel::Receiving::start(self.system, topic, partition);
                let fetch = self.inner.fetch(topic, partition, offset, max);
                Box::pin(
                    async move {
                        let fetched = fetch.await;
                        receiving.finish_events(&fetched);
                        fetched
                    }
                    .instrument(span),
                )
            }
            #[cfg(not(feature = "otel"))]
            Box::pin(
                self.inner
                    .fetch(topic, partition, offset, max)
                    .instrument(span),
            )
        }

        fn find_event_by_uid<'a>(
            &'a self,
            topic: &'a str,
            key: &'a str,
            event_uid: &'a str,
        ) -> BoxFuture<'a, Result<Option<PublishAck>, BusError>> {
            let span = op_span!(self, find_event_by_uid, topic, event_uid);
            Box::pin(
                self.inner
                    .find_event_by_uid(topic, key, event_uid)
                    .instrument(span),
            )
        }

        fn publish_with_headers<'a>(
            &'a self,
            topic: &'a str,
            key: &'a str,
            value: &'a serde_json::Value,
            event_uid: Option<&'a str>,
            headers: &'a Headers,
        ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
            let span = op_span!(self, publish, topic);
            Box::pin(
                self.send_async(topic, key, value, event_uid, Some(headers))
                    .instrument(span),
            )
        }

        fn fetch_with_headers<'a>(
            &'a self,
            topic: &'a str,
            partition: u32,
            offset: u64,
            max: usize,
        ) -> BoxFuture<'a, Result<Vec<StoredRecord>, BusError>> {
            let span = op_span!(self, fetch, topic, partition, offset, max);
            #[cfg(feature = "otel")]
            {
                let receiving = crate::otel::Receiving::start(self.system, topic, partition);
                let fetch = self.inner.fetch_with_headers(topic, partition, offset, max);
                Box::pin(
                    async move {
                        let fetched = fetch.await;
                        receiving.finish_records(&fetched);
                        fetched
                    }
                    .instrument(span),
                )
            }
            #[cfg(not(feature = "otel"))]
            Box::pin(
                self.inner
                    .fetch_with_headers(topic, partition, offset, max)
                    .instrument(span),
            )
        }

        fn offsets<'a>(
            &'a self,
            topic: &'a str,
            partition: u32,
        ) -> BoxFuture<'a, Result<PartitionOffsets, BusError>> {
            let span = op_span!(self, offsets, topic, partition);
            Box::pin(self.inner.offsets(topic, partition).instrument(span))
        }

        fn partitions<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<u32, BusError>> {
            self.inner.partitions(topic)
        }

        fn provision<'a>(&'a self, manifest: &'a Manifest) -> BoxFuture<'a, Result<(), BusError>> {
            let span = op_span!(self, provision);
            Box::pin(self.inner.provision(manifest).instrument(span))
        }

        fn topics<'a>(&'a self) -> BoxFuture<'a, Result<Vec<String>, BusError>> {
            self.inner.topics()
        }

        fn topic_spec<'a>(
            &'a self,
            topic: &'a str,
        ) -> BoxFuture<'a, Result<Option<TopicSpec>, BusError>> {
            let span = op_span!(self, topic_spec, topic);
            Box::pin(self.inner.topic_spec(topic).instrument(span))
        }

        fn maintenance<'a>(&'a self, now_ms: u64) -> BoxFuture<'a, Result<u64, BusError>> {
            let span = op_span!(self, maintenance);
            Box::pin(self.inner.maintenance(now_ms).instrument(span))
        }

        fn subscribe<'a>(
            &'a self,
            topic: &'a str,
            selector: Selector,
            start: StartAt,
            options: SubscribeOptions,
        ) -> BoxFuture<'a, Result<SubscriptionStream, BusError>> {
            let span = op_span!(self, subscribe, topic);
            #[cfg(feature = "otel")]
            {
                let subscribe = self.inner.subscribe(topic, selector, start, options);
                let system = self.system;
                Box::pin(
                    async move {
                        let mut stream = subscribe.await?;
                        stream.trace_deliveries(system);
                        Ok(stream)
                    }
                    .instrument(span),
                )
            }
            #[cfg(not(feature = "otel"))]
            Box::pin(
                self.inner
                    .subscribe(topic, selector, start, options)
                    .instrument(span),
            )
        }
    }
}
