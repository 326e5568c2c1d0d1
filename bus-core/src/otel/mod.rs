//! W3C trace context in record headers and OpenTelemetry messaging spans
//! (cargo feature `otel`; contract C25).
//!
//! [`Traced`](crate::Traced) does the work, so `bus::open` and friends get
//! it with the feature on; a bare backend does none of it. Through the
//! global tracer provider of the [`opentelemetry`] API (what the
//! application installed with `opentelemetry::global::set_tracer_provider`;
//! without one nothing is recorded):
//!
//! - **Publish** (`publish`, `publish_idempotent`, `publish_with_headers`,
//!   sync and async) runs in a `PRODUCER` span `send <topic>`, and writes
//!   that span's context as the W3C [`TRACEPARENT`] (and [`TRACESTATE`]
//!   when it has one) into the record's headers. The span is a child of
//!   the current context, so with no span recording and no current context
//!   nothing is written. A caller that set `traceparent` itself keeps it
//!   unchanged (the send span links to it); one that is not a W3C
//!   `traceparent` is refused as `InvalidArgument` on field
//!   `headers.traceparent`, nothing stored. When the caller's headers leave
//!   no room for the trace context under the [`Headers`] limits, the record
//!   is published without it and a `warn!` says so.
//! - **A batch** (`publish_batch`, `publish_batch_with_headers`) runs in
//!   one `send <topic>` span with `messaging.batch.message_count`, and
//!   every record carries that span's context: `publish_batch` writes it
//!   into each record's headers (publishing the batch through
//!   `publish_batch_with_headers` where the bus keeps headers), and
//!   `publish_batch_with_headers` into each record without a
//!   `traceparent` of its own. A record's own context stays (the span
//!   links to it); one that is not W3C refuses the whole batch as
//!   `InvalidArgument` on `records[i].headers.traceparent`, nothing
//!   stored.
//! - **A delivery** of a [`Subscription`](crate::Subscription), a
//!   [`SubscriptionStream`](crate::SubscriptionStream) or a durable
//!   [`Consumer`](crate::consumer::Consumer) starts a `CONSUMER` span
//!   `process <topic>` whose **parent is the record's creation context**
//!   (its `traceparent`), with a link to that context too, and a link to
//!   the caller's current span when there is one (the conventions' opt-in
//!   structure: one trace from publish to delivery). A record without a
//!   context gets a span that is a child of the current one. The span lasts
//!   until the next item is asked for (or the subscription is dropped), so
//!   it covers the handling of the record; `delivery_context()` on the
//!   subscription gives its context, to parent the handler's own spans
//!   (the async consumer stream does not expose it). A malformed
//!   `traceparent` from another producer is ignored with a `warn!`, and
//!   the record is delivered as it is.
//! - **`fetch`** and **`fetch_with_headers`** run in a `CLIENT` span
//!   `receive <topic>`; `fetch_with_headers` links it to the creation
//!   context of each record it returns.
//!
//! Attributes (OpenTelemetry messaging semantic conventions):
//! `messaging.system` (`kafka`, `nats`, `postgresql`, and `embedded` or
//! `memory` for the bus's own logs), `messaging.destination.name` (the
//! topic), `messaging.operation.type` (`send`, `process`, `receive`),
//! `messaging.operation.name` (the same word), `messaging.destination.partition.id`,
//! `messaging.message.id` (the record's UID, when it has one),
//! `messaging.batch.message_count` (batches and fetches); on Kafka
//! `messaging.kafka.offset` and `messaging.kafka.message.key`; on every
//! backend `bus.offset`. A failed publish sets the span's status to error
//! and `error.type` to the [`BusError`] variant.
//!
//! When nothing records (no provider installed, or a sampler said no),
//! spans are started under a fixed name with the three fixed attributes
//! only: the topic's span name and the other attributes are built only for
//! a span that records. A sampler therefore sees `send`, `process` or
//! `receive` as the name, with `messaging.system` and the operation.

mod deliver;
mod send;
mod w3c;

use std::borrow::Cow;

use opentelemetry::trace::{SpanBuilder, SpanContext, SpanKind};
use opentelemetry::{InstrumentationScope, KeyValue, global};

use crate::{BusError, Headers};

pub(crate) use deliver::{Deliveries, Receiving};
pub(crate) use send::Sending;
pub use w3c::{TRACEPARENT, TRACESTATE};

/// The headers of a publish that passed none.
pub(crate) static NO_HEADERS: Headers = Headers::new();

/// The creation context `headers` carry (their `traceparent` and
/// `tracestate`), marked remote; `None` without one. A `traceparent` that
/// is not W3C is ignored with a `warn!` (the record itself is fine).
pub fn creation_context(headers: &Headers) -> Option<SpanContext> {
    let traceparent = headers.get(TRACEPARENT)?;
    match w3c::parse(traceparent, headers.get(TRACESTATE)) {
        Ok(span) => Some(span),
        Err(why) => {
            tracing::warn!(
                traceparent,
                reason = %why,
                "a record's traceparent is not a W3C trace context: ignored"
            );
            None
        }
    }
}

/// `messaging.system` for a backend as [`Capabilities::backend`](crate::Capabilities)
/// names it.
pub fn messaging_system(backend: &str) -> &'static str {
    match backend {
        "kafka" => "kafka",
        "nats" => "nats",
        "postgres" => "postgresql",
        "embedded" => "embedded",
        "memory" => "memory",
        _ => "bus",
    }
}

/// The tracer of this crate, from the global provider (asked per span, so
/// a provider installed after the bus was opened is used).
fn tracer() -> global::BoxedTracer {
    global::tracer_with_scope(
        InstrumentationScope::builder("bus")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
    )
}

/// A span of `kind` named `operation`, with only the attributes that cost
/// no allocation of their own; the caller adds the rest if it records.
fn start(
    system: &'static str,
    operation: &'static str,
    kind: SpanKind,
    parent: &opentelemetry::Context,
) -> global::BoxedSpan {
    let tracer = tracer();
    SpanBuilder::from_name(Cow::Borrowed(operation))
        .with_kind(kind)
        .with_attributes([
            KeyValue::new("messaging.system", system),
            KeyValue::new("messaging.operation.type", operation),
            KeyValue::new("messaging.operation.name", operation),
        ])
        .start_with_context(&tracer, parent)
}

/// `error.type` of a failed operation: the variant, low in cardinality.
fn error_type(error: &BusError) -> &'static str {
    match error {
        BusError::UnknownTopic(_) => "UnknownTopic",
        BusError::Io(_) => "Io",
        BusError::Serde(_) => "Serde",
        BusError::Backend(_) => "Backend",
        BusError::BackendFailure { .. } => "BackendFailure",
        BusError::UnknownPartition { .. } => "UnknownPartition",
        BusError::InvalidArgument { .. } => "InvalidArgument",
        BusError::Conflict { .. } => "Conflict",
        BusError::TooLarge { .. } => "TooLarge",
        BusError::TooDeep { .. } => "TooDeep",
        BusError::Integrity { .. } => "Integrity",
        BusError::Timeout { .. } => "Timeout",
        BusError::Unavailable { .. } => "Unavailable",
        BusError::Locked { .. } => "Locked",
        BusError::ReadOnly { .. } => "ReadOnly",
        BusError::Poisoned { .. } => "Poisoned",
        BusError::Unsupported { .. } => "Unsupported",
        _ => "_OTHER",
    }
}
