#![doc = include_str!("../README.md")]

#[cfg(feature = "async")]
mod asynchronous;
pub mod auth;
pub mod backend;
mod batch;
mod bus;
mod capabilities;
#[cfg(feature = "cloudevents")]
pub mod cloudevents;
mod cold_spec;
pub mod consumer;
mod error;
mod event;
#[cfg(feature = "connector")]
mod executor;
mod headers;
mod manifest;
pub mod memory;
mod metrics;
#[cfg(feature = "otel")]
pub mod otel;
mod partition;
mod percent;
mod prepare;
mod record;
mod secrets;
mod subscription;
mod sync;
mod traced;

// The user API: what code that publishes, fetches and subscribes names. What
// a backend author needs besides is in [`backend`].
#[cfg(feature = "async")]
pub use asynchronous::{AsyncEventBus, BoxFuture};
pub use batch::{BatchRecord, BatchRecordWithHeaders};
pub use bus::{EventBus, EventBusExt, PartitionOffsets};
pub use capabilities::{AckDurability, Capabilities, DedupHorizon};
pub use cold_spec::ColdSpec;
pub use error::BusError;
pub use event::{PublishAck, StoredEvent, StoredRecord, embedded_uid, now_ms, resolve_uid};
pub use headers::{
    Headers, MAX_HEADER_NAME_BYTES, MAX_HEADER_VALUE_BYTES, MAX_HEADERS, MAX_HEADERS_BYTES,
    RESERVED_HEADER_PREFIXES, is_reserved_header,
};
pub use manifest::{
    Compression, DEFAULT_DEDUP_WINDOW_MS, DEFAULT_MAX_RECORD_BYTES, InvalidName, MAX_PARTITIONS,
    MAX_RECORD_BYTES_LIMIT, Manifest, TopicSpec, validate_topic_name,
};
pub use partition::partition_for;
pub use record::{MAX_JSON_DEPTH, MAX_KEY_BYTES, MAX_UID_BYTES};
pub use subscription::{
    Selector, StartAt, SubscribeOptions, Subscription, SubscriptionItem, SubscriptionStream,
};
pub use traced::Traced;
