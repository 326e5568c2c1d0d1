//! [`Traced`]: the one place the span schema is written. Every backend's
//! operations get the same span names and fields by being wrapped, instead
//! of each backend repeating `#[tracing::instrument]` on each method.

#[cfg(doc)]
use crate::Capabilities;
use crate::consumer::{ConsumeOptions, Consumer, ConsumerInfo, DurableConsumers};
use crate::subscription::{Selector, StartAt};
use crate::{BusError, EventBus, Headers, PublishAck};

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

    fn shared_cursor_store(&self) -> Option<std::sync::Arc<dyn crate::consumer::CursorStore>> {
        self.inner.shared_cursor_store()
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

mod sync;

#[cfg(feature = "async")]
mod asynchronous;
