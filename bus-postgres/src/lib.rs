//! `bus-postgres`: the bus [`EventBus`](bus_core::EventBus) over PostgreSQL.
//!
//! Every topic lives in tables of one schema (`bus` unless the URL says
//! `?schema=NAME`), created by `provision` with a schema-version row. Records
//! sit in one table keyed by `(topic, partition, offset)`; offsets come from a
//! per-partition counter row updated inside the inserting transaction, so
//! they are gap-free from 0 whatever rolls back. Concurrent publishers of a
//! partition share one transaction (group commit). A UID is claimed through a
//! unique index, so concurrent retries from several processes store one
//! record, and `find_event_by_uid` is one index lookup. Live subscriptions
//! `LISTEN` on a channel per topic; a `NOTIFY` after commit is only a
//! wake-up, and records are read from the table by offset.
//!
//! The async client (tokio-postgres, pooled by deadpool-postgres) runs on the
//! bus's own connector thread; every call is bounded by the operation timeout
//! (10 s by default, `?timeout_ms=N`).
//!
//! ```no_run
//! use bus_core::{EventBus, Manifest, TopicSpec};
//!
//! let bus = bus_postgres::PostgresBus::connect("postgres://bus:bus@127.0.0.1:5433/bus?schema=demo")?;
//! bus.provision(&Manifest::new([TopicSpec::new("audit", 4)]))?;
//! let ack = bus.publish_idempotent("audit", "agent-1", &serde_json::json!({"n": 1}), "evt-1")?;
//! assert_eq!(bus.find_event_by_uid("audit", "agent-1", "evt-1")?, Some(ack));
//! # Ok::<(), bus_core::BusError>(())
//! ```
//!
//! Spans: a bus built by hand (`PostgresBus::connect(url)`) opens no
//! `tracing` spans of its own; `bus::open` returns it wrapped in
//! [`bus_core::Traced`], and `Traced::new(bus)` gives a hand-built one the
//! same span schema (`bus.publish{backend="postgres" topic=..}`,
//! `bus.fetch{..}`, ..., on the sync and async surfaces). Without the
//! wrapper the backend still logs its own events (warnings, errors) and
//! records its metrics (feature `metrics`).

#[cfg(feature = "async")]
mod asynchronous;
mod bus;
mod errors;
mod fetch;
mod inner;
mod listen;
mod listener;
mod options;
mod publish;
mod queue;
mod shared;
mod sql;
mod subscribe;
mod tls;
mod topics;

pub use bus::PostgresBus;

/// URL schemes [`PostgresBus::connect`] accepts; the `bus` facade routes by
/// this list.
pub const SCHEMES: &[&str] = &["postgres", "postgresql"];
pub use options::{DEFAULT_POOL_SIZE, DEFAULT_SCHEMA, PostgresOptions};
pub use sql::Sql;
pub use tls::TlsFiles;
