//! CloudEvents in binary content mode over record headers (cargo feature
//! `cloudevents`; contract C25).
//!
//! A [CloudEvent](https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/spec.md)
//! travels as one record: its context attributes and extensions are
//! headers, its data is the record's JSON value. That is the protocol
//! bindings' *binary content mode*, so a consumer written against Kafka's
//! or NATS's CloudEvents binding reads what the bus stored, and the bus
//! reads what such a producer wrote.
//!
//! The mapping works on the official SDK's [`Event`](cloudevents::Event) (crate
//! `cloudevents-sdk`, library name `cloudevents`): it is the type callers
//! already build and hand to other transports, and its own binary-mode
//! machinery ([`BinaryDeserializer`](cloudevents::message::BinaryDeserializer),
//! [`BinarySerializer`](cloudevents::message::BinarySerializer)) writes
//! and parses the attributes, so `time` (RFC 3339), `dataschema` (URI) and
//! `specversion` are checked by the SDK, not by a second implementation
//! here. The dependency is only there with the feature on; none of the
//! SDK's protocol bindings are enabled.
//!
//! # The mapping
//!
//! - **Attributes and extensions** → headers named by the [`Spelling`]'s
//!   prefix and the attribute name: `ce_id`, `ce_source`, `ce_type`,
//!   `ce_specversion`, `ce_subject`, `ce_time`, `ce_dataschema`, and one per
//!   extension (`ce_partitionkey`). `datacontenttype` is the `content-type`
//!   header, as both bindings map it. Header values are text; an integer
//!   or boolean extension is written as its text (`42`, `true`) and read
//!   back as a string extension: binary mode carries no attribute types
//!   (the SDK's own Kafka binding reads them the same way).
//! - **Data** → the record's value. JSON data (a
//!   [`Data::Json`](cloudevents::Data::Json), or text or bytes under a JSON
//!   content type: `application/json`, `text/json`, `*+json`, or none, which
//!   the bus takes as `application/json`) is stored as the JSON value it
//!   parses to; a [`Data::String`](cloudevents::Data::String) under any
//!   other content type (`text/plain`) is stored as a JSON string and read
//!   back as `Data::String`. Bytes under a non-JSON content type, and text
//!   that does not parse under a JSON one, are refused (`InvalidArgument`,
//!   field `data`): bus values are JSON, and nothing is dropped silently;
//!   base64 such bytes into a string first. An event without data is stored
//!   as `null`, and a `null` value reads back as an event without data.
//! - **Key** (the partition key, so one source's events keep their order):
//!   the event's `partitionkey` extension (the CloudEvents *Partitioning*
//!   extension) when it has one, else its `subject`, else its `id`.
//!
//! Reading a record back ([`to_event`]) detects the spelling from its
//! `*specversion` header, ignores headers that are not CloudEvents
//! attributes (`traceparent`, the caller's own), and answers
//! `InvalidArgument` naming the header at fault for a missing or empty
//! `specversion`, `id`, `source` or `type`, an unknown `specversion` (the
//! SDK knows `1.0` and `0.3`), a malformed `time` or `dataschema`, or a
//! record carrying both spellings. It never panics on what another producer
//! stored.
//!
//! On NATS the bus percent-encodes every header value on the wire (C25):
//! bus to bus the attributes travel exactly, but a NATS client outside the
//! bus sees `ce-source` and the like percent-encoded. On Kafka the headers
//! are the Kafka binding's as they are.
//!
//! # Example
//!
//! ```
//! use bus_core::cloudevents::sdk::{EventBuilder, EventBuilderV10};
//! use bus_core::cloudevents::{self as ce, Spelling};
//! use bus_core::memory::MemoryBus;
//! use bus_core::{EventBus, Manifest, TopicSpec};
//!
//! let bus = MemoryBus::new();
//! bus.provision(&Manifest::new([TopicSpec::new("orders", 4)]))?;
//! let event = EventBuilderV10::new()
//!     .id("order-17")
//!     .source("/shop/eu")
//!     .ty("com.example.order.placed")
//!     .subject("customer-9")
//!     .data("application/json", serde_json::json!({"total": 42}))
//!     .build()
//!     .expect("a complete event");
//!
//! let ack = ce::publish(&bus, "orders", &event)?;
//! assert_eq!(Spelling::for_bus(&bus), Spelling::Underscore);
//!
//! let records = bus.fetch_with_headers("orders", ack.partition, ack.offset, 1)?;
//! assert_eq!(records[0].event.key, "customer-9");
//! assert_eq!(records[0].headers.get("ce_type"), Some("com.example.order.placed"));
//! assert_eq!(ce::to_event(&records[0])?, event);
//! # Ok::<(), bus_core::BusError>(())
//! ```

mod decode;
mod encode;

/// The CloudEvents SDK this module maps to (crate `cloudevents-sdk`), so a
/// caller builds events with the very version the mapping speaks.
pub use ::cloudevents as sdk;
pub use decode::{RecordMessage, to_event};
pub use encode::{PublishParts, publish, to_publish};

use crate::{BusError, EventBus};

/// The header `datacontenttype` travels in, in both spellings (the Kafka
/// and NATS bindings, like HTTP, map it to the protocol's content type).
pub const CONTENT_TYPE_HEADER: &str = "content-type";

/// How CloudEvents attribute headers are spelled.
///
/// [`Spelling::for_backend`] picks the one a backend's consumers expect:
/// `ce-` on NATS (its binding writes headers the HTTP way), `ce_` on Kafka
/// (its binding's), and `ce_` on memory, embedded, PostgreSQL and any other
/// backend: they have no CloudEvents binding of their own, and `ce_` is the
/// spelling no header-case folding can touch (NATS and HTTP tools may
/// change the case of `ce-` names; the bus refuses names that differ only
/// in case, and reads `ce-` names without regard to case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Spelling {
    /// `ce_id`, `ce_source`, …: the Kafka protocol binding.
    Underscore,
    /// `ce-id`, `ce-source`, …: the NATS (and HTTP) protocol binding.
    Dash,
}

impl Spelling {
    /// Every spelling, in the order [`to_event`] looks for them.
    pub const ALL: [Spelling; 2] = [Spelling::Underscore, Spelling::Dash];

    /// The prefix of an attribute's header name: `ce_` or `ce-`.
    pub const fn prefix(self) -> &'static str {
        match self {
            Spelling::Underscore => "ce_",
            Spelling::Dash => "ce-",
        }
    }

    /// The spelling for a backend named as in
    /// [`Capabilities::backend`](crate::Capabilities::backend): `ce-` for
    /// `nats`, `ce_` for everything else.
    pub fn for_backend(backend: &str) -> Self {
        if backend == "nats" {
            Spelling::Dash
        } else {
            Spelling::Underscore
        }
    }

    /// The spelling for `bus`, by its capabilities report.
    pub fn for_bus(bus: &(impl EventBus + ?Sized)) -> Self {
        Self::for_backend(bus.capabilities().backend)
    }

    /// The header name of attribute (or extension) `name`.
    pub fn header(self, name: &str) -> String {
        if name == "datacontenttype" {
            CONTENT_TYPE_HEADER.to_owned()
        } else {
            format!("{}{name}", self.prefix())
        }
    }

    /// The attribute a header of this spelling carries, if it is one
    /// (`content-type` is `datacontenttype` in either spelling). `ce-`
    /// names compare without regard to ASCII case, as NATS and HTTP
    /// headers do; attribute names are lowercase by the specification.
    pub(crate) fn attribute(self, header: &str) -> Option<String> {
        if header.eq_ignore_ascii_case(CONTENT_TYPE_HEADER) {
            return Some("datacontenttype".to_owned());
        }
        let prefix = self.prefix();
        let head = header.get(..prefix.len())?;
        let name = &header[prefix.len()..];
        match self {
            Spelling::Underscore if head == prefix => Some(name.to_owned()),
            Spelling::Dash if head.eq_ignore_ascii_case(prefix) => Some(name.to_ascii_lowercase()),
            _ => None,
        }
    }
}

/// Whether a `datacontenttype` says the data is JSON (as the SDK decides
/// it); no content type is JSON too, the bus's values being JSON.
pub(crate) fn is_json(content_type: Option<&str>) -> bool {
    content_type.is_none_or(|ct| {
        let ct = ct.trim_start().to_ascii_lowercase();
        let essence = ct.split(';').next().unwrap_or_default().trim_end();
        essence == "application/json" || essence == "text/json" || essence.ends_with("+json")
    })
}

/// An SDK error on `field`, its message kept in the reason.
pub(crate) fn sdk_error(field: impl Into<String>, error: &cloudevents::message::Error) -> BusError {
    BusError::invalid(field, format!("the CloudEvents SDK refused it: {error}"))
}
