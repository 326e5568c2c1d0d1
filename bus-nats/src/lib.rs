//! `bus-nats`: the bus [`EventBus`](bus_core::EventBus) over NATS
//! JetStream.
//!
//! One JetStream stream per topic partition (file storage), so offsets are
//! partition-local and gap-free: offset = stream sequence − 1. Each record's
//! key, UID and authentication tag travel in headers. Records with a UID go
//! to a subject of their own, published on the condition that it is empty,
//! so a UID is stored once for as long as its record is retained and
//! `find_event_by_uid` is one indexed direct get. With a control key set, a
//! message injected onto a UID's subject without a valid tag answers for
//! nothing: the genuine record is stored after it (see `uid.rs`).
//!
//! The server's `max_payload` (1MB by default) must hold a topic's largest
//! record plus its headers; provisioning refuses a topic that would not
//! fit, naming `max_record_bytes` (scripts/nats.sh starts the server with
//! `max_payload: 8MB`). The async client runs on
//! the bus's own connector thread; every call is bounded by the operation
//! timeout (10 s by default).
//!
//! ```no_run
//! use bus_core::{EventBus, Manifest, TopicSpec};
//!
//! let bus = bus_nats::NatsBus::connect("nats://127.0.0.1:4222?prefix=demo&timeout_ms=2000")?;
//! bus.provision(&Manifest::new([TopicSpec::new("audit", 4)]))?;
//! let ack = bus.publish_idempotent("audit", "agent-1", &serde_json::json!({"n": 1}), "evt-1")?;
//! assert_eq!(bus.find_event_by_uid("audit", "agent-1", "evt-1")?, Some(ack));
//! # Ok::<(), bus_core::BusError>(())
//! ```
//!
//! A live subscription (`EventBus::subscribe`) keeps, per partition, a
//! push consumer (ephemeral, in memory, started just after the stream's
//! last sequence) followed by a task on the bus's connector runtime: each
//! delivery is buffered and rings the subscription's doorbell, no thread of
//! its own and no polling. The task checks that deliveries and heartbeats
//! follow each other and re-creates the consumer, under a new name, from
//! the last sequence known when they do not or heartbeats stop. History, and whatever a slow subscriber's bounded buffer
//! dropped, is read by sequence through `fetch`'s code with a cursor of the
//! subscription's own; both paths decode and verify as `fetch` does. While
//! the connection is down reads fail at once as `Unavailable`; afterwards
//! the stream's end is asked again, so nothing is skipped. Dropping the
//! subscription deletes its consumers. See `subscribe.rs`.
//!
//! A publish that times out during an outage may still be stored once the
//! connection returns (the client resends what it buffered): retry with a
//! UID to make that harmless.
//!
//! Spans: a bus built by hand (`NatsBus::connect(url)`) opens no `tracing`
//! spans of its own; `bus::open` returns it wrapped in
//! [`bus_core::Traced`], and `Traced::new(bus)` gives a hand-built one the
//! same span schema (`bus.publish{backend="nats" topic=..}`,
//! `bus.fetch{..}`, ..., on the sync and async surfaces). Without the
//! wrapper the backend still logs its own events (warnings, errors, such as
//! connection state changes) and records its metrics (feature `metrics`).

#[cfg(feature = "async")]
mod asynchronous;
mod bus;
mod cursor;
mod errors;
mod fetch;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod get;
pub mod naming;
mod options;
mod publish;
mod record;
mod shared;
mod subscribe;
mod topics;
mod uid;

pub use bus::NatsBus;

/// URL schemes [`NatsBus::connect`] accepts (`tls://` requires TLS); the
/// `bus` facade routes by this list.
pub const SCHEMES: &[&str] = &["nats", "tls"];
pub use options::{DEFAULT_PREFIX, NatsOptions};
