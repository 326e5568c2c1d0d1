//! The backend kit: what a backend author needs besides the user API at the
//! crate root. A user of the bus names none of it; every backend of this
//! workspace (memory, embedded, NATS, Kafka, PostgreSQL) is built from it,
//! so the checks, encodings and helpers that keep a contract rule live once
//! here rather than once per backend.
//!
//! | need | items |
//! |---|---|
//! | publish preparation: UID, size, auth tag, partition (C2, C5, C12, C14) | [`prepare_record`], [`PreparedRecord`], [`uid_partition`], [`RawRecord`], [`encode_value`] |
//! | one batch path for batches with and without headers (C25) | [`BatchItem`] |
//! | validation of arguments before storage is touched | [`validate_topic`], [`validate_key`], [`validate_uid`], [`check_partition`], [`json_depth`], [`MAX_JSON_DEPTH`] |
//! | names a broker cannot hold as they are | [`percent_encode`], [`percent_decode`] |
//! | the partitioner's hash | [`fnv1a64`] |
//! | subscriptions (C17-C19): feeds, doorbells, start plans | [`Feed`], [`FetchFeed`], [`Doorbell`], [`DoorbellRegistry`], [`SubscriptionOwner`], [`Plan`], [`resolve_start`] |
//! | network clients for synchronous callers (C9, feature `connector`) | [`executor`], `ConnectorExecutor` |
//! | the async surface (feature `async`) | `on_blocking_pool` (a blocking call on the caller's runtime's blocking pool, in the caller's span) |
//! | poison-tolerant locks | [`sync`] |
//! | operator metrics, one set of names for every backend | [`metrics`] |
//! | settings that must never be logged | [`is_secret_setting`] |
//!
//! Spans are not the backend's job: [`Traced`](crate::Traced) opens the bus span
//! schema around any backend, and the facade's `bus::open` wraps every bus
//! in it.

pub use crate::batch::BatchItem;
pub use crate::bus::FetchFeed;
pub use crate::partition::fnv1a64;
pub use crate::percent::{percent_decode, percent_encode};
pub use crate::prepare::{PreparedRecord, prepare_record, prepare_record_with, uid_partition};
pub use crate::record::{
    MAX_JSON_DEPTH, RawRecord, check_partition, encode_value, json_depth, validate_key,
    validate_topic, validate_uid,
};
pub use crate::secrets::is_secret_setting;
pub use crate::subscription::{
    Doorbell, DoorbellRegistry, Feed, Plan, SubscriptionOwner, resolve_start,
};

#[cfg(feature = "async")]
pub use crate::asynchronous::on_blocking_pool;
#[cfg(feature = "connector")]
pub use crate::executor::ConnectorExecutor;

/// Poison-tolerant lock guards, the one place every crate takes them.
pub mod sync {
    pub use crate::sync::*;
}

/// Operator metrics: the names every backend reports under, through the
/// [`metrics`](https://docs.rs/metrics) facade (cargo feature `metrics`;
/// without it every function here is an empty inline call).
pub mod metrics {
    pub use crate::metrics::*;
}

/// The connector executor (feature `connector`): a dedicated thread owning
/// a single-worker tokio runtime, through which network backends run their
/// async clients for synchronous callers (C9).
#[cfg(feature = "connector")]
pub mod executor {
    pub use crate::executor::*;
}
