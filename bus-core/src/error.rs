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
    /// Backend-specific failure, as the reference trait spells it: a
    /// message and nothing else. Code written against the reference
    /// builds and matches it; the backends of this workspace report their
    /// own failures as [`BusError::BackendFailure`], which names the
    /// backend and keeps the underlying error.
    #[error("bus backend: {0}")]
    Backend(String),
    /// A failure inside a backend or its client library that no other
    /// variant names; [`std::error::Error::source`] gives the client's or
    /// the OS's own error when there is one.
    #[error("{backend}: {message}")]
    BackendFailure {
        /// Which backend (`nats`, `kafka`, `postgres`, `embedded`, `memory`,
        /// or `bus` for the facade and the shared machinery).
        backend: String,
        /// What was being done and what went wrong, without secrets.
        message: String,
        /// The underlying error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
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
        /// The client's or the OS's own error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
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
        "topic {topic:?} partition {partition} is poisoned after a failed {cause}; {fix}",
        fix = if *disk_full {
            "the disk is full: free space, then reopen the bus"
        } else {
            "reopen the bus to recover"
        }
    )]
    Poisoned {
        /// Topic concerned.
        topic: String,
        /// Partition concerned.
        partition: u32,
        /// The failure that poisoned it (`write: ...`, `fsync: ...`).
        cause: String,
        /// Whether the failure was a full disk (or quota): freeing space
        /// is the fix, where any other I/O failure may mean a bad device.
        disk_full: bool,
        /// The OS error (a copy for every call the poisoning answers).
        #[source]
        source: Option<std::io::Error>,
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
    /// A durable consumer instance lost ownership of its cursor (C23):
    /// another instance took over, or the consumer was reset or deleted.
    /// Its acknowledgement was refused and advanced nothing; open the
    /// consumer again to go on.
    #[error(
        "consumer {consumer:?} of topic {topic:?} is fenced: {reason}; nothing was acknowledged (open the consumer again)"
    )]
    Fenced {
        /// Topic concerned.
        topic: String,
        /// The consumer name.
        consumer: String,
        /// Why (taken over, reset, deleted).
        reason: String,
    },
    /// Another live instance owns the durable consumer and the options
    /// said to fail rather than wait or take over (C23).
    #[error(
        "consumer {consumer:?} of topic {topic:?} is owned by another live instance; stop it, or open with OwnerPolicy::Wait or OwnerPolicy::TakeOver"
    )]
    ConsumerBusy {
        /// Topic concerned.
        topic: String,
        /// The consumer name.
        consumer: String,
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
    /// A [`BusError::BackendFailure`] with no underlying error.
    pub fn backend(backend: &str, message: impl Into<String>) -> Self {
        Self::BackendFailure {
            backend: backend.to_owned(),
            message: message.into(),
            source: None,
        }
    }

    /// A [`BusError::BackendFailure`] caused by `source` (a client library's
    /// or the OS's error), which [`std::error::Error::source`] then returns.
    pub fn backend_caused(
        backend: &str,
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Self::BackendFailure {
            backend: backend.to_owned(),
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A [`BusError::Timeout`]: `operation` did not finish within `after`.
    pub fn timeout(operation: impl Into<String>, after: std::time::Duration) -> Self {
        Self::Timeout {
            operation: operation.into(),
            after_ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// A [`BusError::Unavailable`] with no underlying error.
    pub fn unavailable(backend: &str, reason: impl Into<String>) -> Self {
        Self::Unavailable {
            backend: backend.to_owned(),
            reason: reason.into(),
            source: None,
        }
    }

    /// A [`BusError::Unavailable`] caused by `source` (a client library's or
    /// the OS's error), which [`std::error::Error::source`] then returns.
    pub fn unavailable_caused(
        backend: &str,
        reason: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Self::Unavailable {
            backend: backend.to_owned(),
            reason: reason.into(),
            source: Some(source.into()),
        }
    }

    /// Shorthand for [`BusError::InvalidArgument`].
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Whether retrying the same call later may succeed without anyone
    /// changing anything: a bounded wait ran out, the backend is down or
    /// busy, an interrupted system call. Everything else needs a change
    /// first (the input, the manifest, the configuration, a reopen).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Timeout { .. } | Self::Unavailable { .. } => true,
            Self::Io(error) => matches!(
                error.kind(),
                std::io::ErrorKind::Interrupted
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::WouldBlock
            ),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::io::ErrorKind;

    use super::*;

    /// One of every variant (and of each I/O kind that differs).
    fn every_variant() -> Vec<BusError> {
        let text = || "x".to_owned();
        vec![
            BusError::UnknownTopic(text()),
            BusError::Io(std::io::Error::from(ErrorKind::Interrupted)),
            BusError::Io(std::io::Error::from(ErrorKind::TimedOut)),
            BusError::Io(std::io::Error::from(ErrorKind::WouldBlock)),
            BusError::Io(std::io::Error::from(ErrorKind::NotFound)),
            BusError::Io(std::io::Error::from(ErrorKind::PermissionDenied)),
            BusError::Io(std::io::Error::from(ErrorKind::StorageFull)),
            BusError::Serde(serde_json::from_str::<u8>("x").unwrap_err()),
            BusError::Backend(text()),
            BusError::backend("x", text()),
            BusError::UnknownPartition {
                topic: text(),
                partition: 9,
                partitions: 1,
            },
            BusError::invalid("field", "reason"),
            BusError::Conflict {
                topic: text(),
                property: text(),
                existing: text(),
                requested: text(),
                fix: text(),
            },
            BusError::TooLarge {
                topic: text(),
                size: 2,
                limit: 1,
            },
            BusError::TooDeep {
                topic: text(),
                depth: 2,
                limit: 1,
            },
            BusError::Integrity {
                topic: text(),
                partition: 0,
                offset: 0,
                reason: text(),
            },
            BusError::Timeout {
                operation: text(),
                after_ms: 1,
            },
            BusError::unavailable("x", text()),
            BusError::Locked { path: "d".into() },
            BusError::ReadOnly {
                operation: text(),
                path: "d".into(),
            },
            BusError::Poisoned {
                topic: text(),
                partition: 0,
                cause: text(),
                disk_full: true,
                source: None,
            },
            BusError::Unsupported {
                operation: text(),
                backend: text(),
            },
            BusError::FeatureDisabled {
                scheme: text(),
                feature: text(),
            },
            BusError::Corrupt {
                location: text(),
                offset: 0,
                reason: text(),
            },
            BusError::Fenced {
                topic: text(),
                consumer: text(),
                reason: text(),
            },
            BusError::ConsumerBusy {
                topic: text(),
                consumer: text(),
            },
        ]
    }

    /// What each variant should answer, spelled out with no wildcard: a new
    /// variant does not compile here until someone decides.
    fn retrying_helps(error: &BusError) -> bool {
        match error {
            BusError::Timeout { .. } | BusError::Unavailable { .. } => true,
            BusError::Io(error) => matches!(
                error.kind(),
                ErrorKind::Interrupted | ErrorKind::TimedOut | ErrorKind::WouldBlock
            ),
            BusError::UnknownTopic(_)
            | BusError::Serde(_)
            | BusError::Backend(_)
            | BusError::BackendFailure { .. }
            | BusError::UnknownPartition { .. }
            | BusError::InvalidArgument { .. }
            | BusError::Conflict { .. }
            | BusError::TooLarge { .. }
            | BusError::TooDeep { .. }
            | BusError::Integrity { .. }
            | BusError::Locked { .. }
            | BusError::ReadOnly { .. }
            | BusError::Poisoned { .. }
            | BusError::Unsupported { .. }
            | BusError::FeatureDisabled { .. }
            | BusError::Corrupt { .. }
            | BusError::Fenced { .. }
            | BusError::ConsumerBusy { .. } => false,
        }
    }

    #[test]
    fn a_backend_error_keeps_its_cause() {
        use std::error::Error as _;
        let cause = std::io::Error::new(ErrorKind::ConnectionReset, "peer went away");
        let error = BusError::backend_caused("nats", "fetch from topic \"t\"", cause);
        assert_eq!(error.to_string(), "nats: fetch from topic \"t\"");
        let source = error.source().expect("a source");
        assert_eq!(source.to_string(), "peer went away");
        assert!(BusError::backend("bus", "no cause").source().is_none());

        let cause = std::io::Error::new(ErrorKind::ConnectionRefused, "nobody listens");
        let error = BusError::unavailable_caused("kafka", "fetching metadata", cause);
        assert_eq!(error.to_string(), "kafka unavailable: fetching metadata");
        assert_eq!(
            error.source().expect("a source").to_string(),
            "nobody listens"
        );
        assert!(error.is_transient());
        assert!(BusError::unavailable("nats", "down").source().is_none());
    }

    #[test]
    fn is_transient_is_right_for_every_variant() {
        let all = every_variant();
        let transient: Vec<String> = all
            .iter()
            .filter(|error| error.is_transient())
            .map(|error| format!("{error:?}"))
            .collect();
        // Exactly the timeouts, outages and retryable I/O kinds.
        assert_eq!(transient.len(), 5, "{transient:#?}");
        for error in &all {
            assert_eq!(error.is_transient(), retrying_helps(error), "{error:?}");
        }
    }
}
