//! The one error type every backend maps its failures into.

use std::path::PathBuf;

/// Every failure a bus operation can report.
///
/// Variants carry structured fields so callers (and the conformance suite)
/// match on what went wrong, never on message text. Messages name the topic
/// or partition involved and, where there is one, the fix. No variant ever
/// carries a secret (password, token, control key).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BusError {
    /// Topic does not exist (provision first: publishing into the void is a
    /// silent-error class, so it's an error, not an auto-create).
    #[error("unknown topic {0:?} (provision it via the manifest first)")]
    UnknownTopic(String),
    /// I/O failure.
    #[error("bus io: {0}")]
    Io(#[from] std::io::Error),
    /// Serialization failure.
    #[error("bus serde: {0}")]
    Serde(#[from] serde_json::Error),
    /// Backend-specific failure (network brokers).
    #[error("bus backend: {0}")]
    Backend(String),
    /// The partition is outside `0..partitions` for the topic.
    #[error(
        "topic {topic:?} has no partition {partition} (it has {partitions}: use 0..{partitions})"
    )]
    UnknownPartition {
        /// Topic asked for.
        topic: String,
        /// Partition asked for.
        partition: u32,
        /// Partitions the topic has.
        partitions: u32,
    },
    /// An argument (or a manifest field) is not acceptable.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The argument or manifest field at fault, e.g. `topics[1].partitions`.
        field: String,
        /// What is wrong with it and what would be accepted.
        reason: String,
    },
    /// What exists on the backend disagrees with what was asked for.
    #[error(
        "topic {topic:?}: {property} is {existing} on the backend but {requested} was requested; {fix}"
    )]
    Conflict {
        /// Topic concerned.
        topic: String,
        /// The property that differs (e.g. `partitions`).
        property: String,
        /// The value found on the backend.
        existing: String,
        /// The value that was asked for.
        requested: String,
        /// How to resolve it.
        fix: String,
    },
    /// A record is larger than the topic's `max_record_bytes`.
    #[error(
        "record of {size} bytes exceeds max_record_bytes {limit} of topic {topic:?} (nothing stored; raise max_record_bytes in the manifest or send a smaller value)"
    )]
    TooLarge {
        /// Topic concerned.
        topic: String,
        /// Encoded size of the record's value.
        size: u64,
        /// The topic's limit.
        limit: u64,
    },
    /// A value nests arrays and objects deeper than the bus can read back
    /// ([`crate::record::MAX_JSON_DEPTH`]).
    #[error(
        "value for topic {topic:?} nests {depth} levels of arrays and objects, over the limit of {limit} (nothing stored; flatten the value or carry its deep part as a string)"
    )]
    TooDeep {
        /// Topic concerned.
        topic: String,
        /// How deep the value nests.
        depth: usize,
        /// The most the bus accepts.
        limit: usize,
    },
    /// A stored record failed its checksum or authentication tag.
    #[error(
        "integrity failure in topic {topic:?} partition {partition} at offset {offset}: {reason} (the record is not returned; fetch from offset {next} to skip it deliberately)",
        next = offset.saturating_add(1)
    )]
    Integrity {
        /// Topic concerned.
        topic: String,
        /// Partition concerned.
        partition: u32,
        /// Offset of the failing record.
        offset: u64,
        /// What failed (tag mismatch, missing tag, checksum).
        reason: String,
    },
    /// A bounded wait ran out.
    #[error(
        "{operation} timed out after {after_ms} ms (check that the broker is reachable, or raise the operation timeout)"
    )]
    Timeout {
        /// What was being done.
        operation: String,
        /// The bound that was exceeded.
        after_ms: u64,
    },
    /// The backend is not reachable or not able to serve.
    #[error("{backend} unavailable: {reason}")]
    Unavailable {
        /// Which backend (`nats`, `kafka`, ...).
        backend: String,
        /// Why, without secrets.
        reason: String,
    },
    /// The data directory is in use by another bus (process or instance).
    #[error(
        "data directory {path:?} is locked by another bus instance; close it first (a lock left by a dead process is released by the OS)"
    )]
    Locked {
        /// The locked directory.
        path: PathBuf,
    },
    /// The bus was opened read-only and `operation` would write.
    #[error("{operation} refused: the bus at {path:?} was opened read-only")]
    ReadOnly {
        /// The refused operation (`publish`, `provision`, ...).
        operation: String,
        /// The data directory.
        path: PathBuf,
    },
    /// A partition refuses writes after a failed write or fsync.
    #[error(
        "topic {topic:?} partition {partition} is poisoned after a failed {cause}; reopen the bus to recover"
    )]
    Poisoned {
        /// Topic concerned.
        topic: String,
        /// Partition concerned.
        partition: u32,
        /// The failure that poisoned it.
        cause: String,
    },
    /// The backend does not support the operation.
    #[error("{operation} is not supported by the {backend} backend")]
    Unsupported {
        /// Operation asked for.
        operation: String,
        /// Backend name.
        backend: String,
    },
    /// A URL scheme names a backend that was not compiled in.
    #[error(
        "{scheme}:// needs the `{feature}` cargo feature of the `bus` crate; enable it to use this backend"
    )]
    FeatureDisabled {
        /// The URL scheme.
        scheme: String,
        /// The cargo feature that provides it.
        feature: String,
    },
    /// Data on disk (or on the broker) cannot be recovered safely.
    #[error("corrupt data in {location} at offset {offset}: {reason}")]
    Corrupt {
        /// Segment file or stream concerned.
        location: String,
        /// First offset affected.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
}

impl BusError {
    /// Shorthand for [`BusError::InvalidArgument`].
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Whether retrying the same call later may succeed (timeouts, outages).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Timeout { .. } | Self::Unavailable { .. })
    }
}
