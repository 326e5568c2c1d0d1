//! `bus-embedded`: the embedded, durable backend of the `bus` event-bus
//! trait. Each topic partition is a directory of segment files holding
//! checksummed frames, one per group-committed batch; a sparse offset index
//! and a UID index per segment, and one UID locator per partition naming
//! the segments a UID may be in, keep fetch and lookup cost independent of
//! the log's length.
//!
//! ```
//! use bus_core::{EventBus, Manifest, TopicSpec};
//! use bus_embedded::EmbeddedBus;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let bus = EmbeddedBus::open(dir.path()).unwrap();
//! bus.provision(&Manifest::new([TopicSpec::new("audit", 1)])).unwrap();
//! let ack = bus.publish_idempotent("audit", "k", &serde_json::json!({"n": 1}), "uid-1").unwrap();
//! drop(bus);
//! let bus = EmbeddedBus::open(dir.path()).unwrap();
//! assert_eq!(bus.find_event_by_uid("audit", "k", "uid-1").unwrap(), Some(ack));
//! ```
//!
//! Durability: by default ([`Durability::Sync`]) a publish is acked only
//! after `fdatasync`; concurrent publishers of a partition share one
//! write and one fsync. A failed write or fsync fails the whole round and
//! poisons the partition until the bus is reopened.
//!
//! Spans: a bus built by hand (`EmbeddedBus::open(dir)`) opens no `tracing`
//! spans of its own; `bus::open` returns it wrapped in
//! [`bus_core::Traced`], and `Traced::new(bus)` gives a hand-built one the
//! same span schema (`bus.publish{backend="embedded" topic=..}`,
//! `bus.fetch{..}`, ..., on the sync and async surfaces). Without the
//! wrapper the backend still logs its own events (warnings, errors, such as
//! a torn tail truncated or a partition poisoned) and records its metrics
//! (feature `metrics`).
//!
//! On-disk layout (Linux file-name semantics; names are encoded so
//! case-insensitive file systems keep `x` and `X` apart):
//!
//! ```text
//! DIR/LOCK                                   flock held while open
//! DIR/topics/<name>/topic.json               the provisioned TopicSpec
//! DIR/topics/<name>/p0000/<base:020>.log     segment; the name is its first offset
//! DIR/topics/<name>/p0000/<base:020>.idx     sparse index of a sealed segment
//! DIR/topics/<name>/p0000/<base:020>.uids    UID table of a sealed segment (`uidtable`)
//! DIR/topics/<name>/p0000/<base:020>.cidx    the active segment's index at a clean close
//! DIR/topics/<name>/p0000/<base:020>.cuids   the active segment's UID table at a clean close
//! DIR/topics/<name>/p0000/uid-locator        which sealed segments hold a UID (`locator`), rewritten per seal, synced at a clean close
//! DIR/topics/<name>/p0000/acked              acked end, for read-only opens
//! DIR/topics/<name>/p0000/recovery-point     how far the log is known complete
//! ```

#[cfg(feature = "async")]
mod asynchronous;
mod bus;
mod fsutil;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod inner;
mod log;
mod notifier;
mod options;
mod partition;
mod publish;
mod subscribe;
mod topics;
mod uid;
mod watch;

#[doc(hidden)]
pub mod testing;

pub use bus::EmbeddedBus;

/// URL schemes the `bus` facade routes to this backend (`file://DIR`; a
/// bare path is taken as a directory too).
pub const SCHEMES: &[&str] = &["file"];
pub use options::{Durability, Options};
