#![doc = include_str!("../README.md")]

#[cfg(feature = "async")]
pub mod asynchronous;
pub mod auth;
mod bus;
mod capabilities;
pub mod consumer;
mod error;
mod event;
#[cfg(feature = "connector")]
pub mod executor;
mod manifest;
pub mod memory;
pub mod metrics;
mod partition;
mod percent;
mod prepare;
pub mod record;
mod secrets;
pub mod subscription;
pub mod sync;
mod traced;

#[cfg(feature = "async")]
pub use asynchronous::{AsyncEventBus, BoxFuture, on_blocking_pool};
pub use bus::{BatchRecord, EventBus, EventBusExt, FetchFeed, PartitionOffsets};
pub use capabilities::{AckDurability, Capabilities, DedupHorizon};
pub use error::BusError;
pub use event::{PublishAck, StoredEvent, embedded_uid, now_ms, resolve_uid};
#[cfg(feature = "connector")]
pub use executor::ConnectorExecutor;
pub use manifest::{
    Compression, DEFAULT_DEDUP_WINDOW_MS, DEFAULT_MAX_RECORD_BYTES, InvalidName, MAX_PARTITIONS,
    MAX_RECORD_BYTES_LIMIT, Manifest, TopicSpec, validate_topic_name,
};
pub use partition::{fnv1a64, partition_for};
pub use percent::{percent_decode, percent_encode};
pub use prepare::{PreparedRecord, prepare_record, uid_partition};
pub use record::{
    MAX_JSON_DEPTH, RawRecord, check_partition, encode_value, json_depth, validate_key,
    validate_topic, validate_uid,
};
pub use secrets::is_secret_setting;
pub use subscription::{
    Doorbell, DoorbellRegistry, Feed, Selector, StartAt, SubscribeOptions, Subscription,
    SubscriptionItem, SubscriptionOwner, SubscriptionStream,
};
pub use traced::Traced;
