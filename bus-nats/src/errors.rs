//! Maps async-nats failures into [`BusError`] in one place. Messages carry
//! what failed and never the connection's secrets (async-nats errors hold
//! none: credentials are not part of the server URLs handed to it).

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::context::{
    PublishError, PublishErrorKind, RequestError, RequestErrorKind,
};
use bus_core::BusError;

/// The backend name used in errors and capabilities.
pub(crate) const BACKEND: &str = "nats";

pub(crate) fn unavailable(reason: impl Into<String>) -> BusError {
    BusError::Unavailable {
        backend: BACKEND.to_owned(),
        reason: reason.into(),
    }
}

pub(crate) fn timed_out(operation: &str, after: Duration) -> BusError {
    BusError::Timeout {
        operation: operation.to_owned(),
        after_ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
    }
}

/// A JetStream API request failed: either the server answered with an
/// error, or the request never got an answer.
#[derive(Debug)]
pub(crate) enum ApiFailure {
    /// The server refused (stream not found, bad config, ...).
    Api(jetstream::Error),
    /// Transport: timeout, no responders, disconnected.
    Request(RequestError),
}

impl ApiFailure {
    pub(crate) fn into_bus(self, what: &str, timeout: Duration) -> BusError {
        match self {
            Self::Api(error) => BusError::Backend(format!("{what}: JetStream refused: {error}")),
            Self::Request(error) => request_error(what, timeout, &error),
        }
    }
}

pub(crate) fn request_error(what: &str, timeout: Duration, error: &RequestError) -> BusError {
    match error.kind() {
        RequestErrorKind::TimedOut => timed_out(what, timeout),
        RequestErrorKind::NoResponders => unavailable(format!(
            "{what}: no JetStream responders (is the server running with -js?)"
        )),
        _ => unavailable(format!("{what}: {error}")),
    }
}

/// What a failed publish means for the caller.
pub(crate) enum PublishFailure {
    /// The UID's subject already holds the record with this stream sequence.
    AlreadyStored(u64),
    /// The partition's stream is gone.
    StreamGone,
    /// Anything else, already mapped.
    Other(BusError),
}

pub(crate) fn publish_failure(
    error: &PublishError,
    what: &str,
    timeout: Duration,
    size: usize,
    max_payload: usize,
    topic: &str,
) -> PublishFailure {
    match error.kind() {
        PublishErrorKind::WrongLastSequence => match existing_sequence(error) {
            Some(sequence) if sequence > 0 => PublishFailure::AlreadyStored(sequence),
            _ => PublishFailure::Other(BusError::Backend(format!(
                "{what}: conditional publish refused without a usable sequence: {error}"
            ))),
        },
        PublishErrorKind::StreamNotFound => PublishFailure::StreamGone,
        PublishErrorKind::TimedOut => PublishFailure::Other(timed_out(what, timeout)),
        PublishErrorKind::MaxPayloadExceeded => PublishFailure::Other(BusError::TooLarge {
            topic: topic.to_owned(),
            size: size as u64,
            limit: max_payload as u64,
        }),
        PublishErrorKind::BrokenPipe => PublishFailure::Other(unavailable(format!(
            "{what}: connection lost before the ack"
        ))),
        _ => PublishFailure::Other(BusError::Backend(format!("{what}: {error}"))),
    }
}

/// `N` of the server's "wrong last sequence: N" (error code 10071).
fn existing_sequence(error: &PublishError) -> Option<u64> {
    let source = std::error::Error::source(error)?;
    let text = source
        .downcast_ref::<jetstream::Error>()
        .map_or_else(|| source.to_string(), ToString::to_string);
    let tail = text.split("wrong last sequence:").nth(1)?;
    let digits: String = tail
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}
