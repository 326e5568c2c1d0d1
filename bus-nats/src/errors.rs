//! Maps async-nats failures into [`BusError`] in one place. Messages carry
//! what failed and never the connection's secrets (async-nats errors hold
//! none: credentials are not part of the server URLs handed to it).

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{
    PublishError, PublishErrorKind, RequestError, RequestErrorKind,
};
use bus_core::BusError;

/// The backend name used in errors and capabilities.
pub(crate) const BACKEND: &str = "nats";

pub(crate) fn unavailable(reason: impl Into<String>) -> BusError {
    BusError::unavailable(BACKEND, reason)
}

/// [`unavailable`] keeping the client's error as the `source()`.
pub(crate) fn unavailable_caused(
    reason: impl Into<String>,
    error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
) -> BusError {
    BusError::unavailable_caused(BACKEND, reason, error)
}

pub(crate) fn timed_out(operation: &str, after: Duration) -> BusError {
    BusError::timeout(operation, after)
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
            Self::Api(error) => api_error(what, error),
            Self::Request(error) => request_error(what, timeout, error),
        }
    }
}

/// Whether a JetStream API error says JetStream is not serving right now
/// (a server starting or shutting down, a cluster without quorum) rather
/// than anything about the request.
pub(crate) fn out_of_service(code: ErrorCode) -> bool {
    [
        ErrorCode::JETSTREAM_NOT_ENABLED,
        ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT,
        ErrorCode::CLUSTER_NOT_AVAILABLE,
        ErrorCode::CLUSTER_NOT_ACTIVE,
        ErrorCode::CLUSTER_NOT_LEADER,
        ErrorCode::CLUSTER_NO_PEERS,
    ]
    .contains(&code)
}

/// An error answer of the JetStream API, kept as the `source()`.
pub(crate) fn api_error(what: &str, error: jetstream::Error) -> BusError {
    let (down, message) = refusal(what, &error);
    refused(down, message, error)
}

/// Whether an API refusal means JetStream is down, and its message; read
/// before the error that holds the refusal is moved into the result.
fn refusal(what: &str, api: &jetstream::Error) -> (bool, String) {
    if out_of_service(api.error_code()) {
        (true, format!("{what}: {api}"))
    } else {
        (false, format!("{what}: JetStream refused: {api}"))
    }
}

fn refused(
    down: bool,
    message: String,
    cause: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
) -> BusError {
    if down {
        unavailable_caused(message, cause)
    } else {
        BusError::backend_caused(BACKEND, message, cause)
    }
}

/// A JetStream API request that got no usable answer, kept as the
/// `source()` (a timeout is only a timeout).
pub(crate) fn request_error(what: &str, timeout: Duration, error: RequestError) -> BusError {
    match error.kind() {
        RequestErrorKind::TimedOut => timed_out(what, timeout),
        RequestErrorKind::NoResponders => unavailable_caused(
            format!("{what}: no JetStream responders (is the server running with -js?)"),
            error,
        ),
        _ => unavailable_caused(format!("{what}: {error}"), error),
    }
}

/// What a failed publish means for the caller.
pub(crate) enum PublishFailure {
    /// A clustered stream is still storing another publish with the same
    /// Nats-Msg-Id ("duplicate message id is in process", code 10158): the
    /// UID's record is about to exist; look it up again shortly. Also a
    /// conditional publish refused while another is uncommitted (10164).
    InProcess,
    /// The UID's subject already holds the record with this stream sequence.
    AlreadyStored(u64),
    /// Nothing answered on the stream's subject ("no responders"): the
    /// stream is gone, or JetStream is not serving it (a server shutting
    /// down stops its streams before it drops connections). Only asking
    /// for the stream tells which (`topics::unanswered`).
    NoResponders,
    /// Anything else, already mapped.
    Other(BusError),
}

/// Inspects `error` first, then moves it into the mapped error as its
/// `source()`.
pub(crate) fn publish_failure(
    error: PublishError,
    what: &str,
    timeout: Duration,
    size: usize,
    max_payload: usize,
    topic: &str,
) -> PublishFailure {
    match error.kind() {
        PublishErrorKind::WrongLastSequence => match existing_sequence(&error) {
            Some(sequence) if sequence > 0 => PublishFailure::AlreadyStored(sequence),
            // A clustered stream refuses a conditional publish racing an
            // uncommitted one without naming the sequence (code 10164).
            None if api_source(&error).is_some_and(|api| {
                api.error_code() == jetstream::ErrorCode(WRONG_LAST_SEQUENCE_CONSTANT)
            }) =>
            {
                PublishFailure::InProcess
            }
            _ => PublishFailure::Other(BusError::backend_caused(
                BACKEND,
                format!("{what}: conditional publish refused without a usable sequence: {error}"),
                error,
            )),
        },
        // async-nats reports "no responders" as StreamNotFound.
        PublishErrorKind::StreamNotFound => PublishFailure::NoResponders,
        PublishErrorKind::TimedOut => PublishFailure::Other(timed_out(what, timeout)),
        PublishErrorKind::MaxAckPending => PublishFailure::Other(unavailable(format!(
            "{what}: too many publishes awaiting their acks"
        ))),
        PublishErrorKind::MaxPayloadExceeded => PublishFailure::Other(BusError::TooLarge {
            topic: topic.to_owned(),
            size: size as u64,
            limit: max_payload as u64,
        }),
        PublishErrorKind::BrokenPipe => PublishFailure::Other(unavailable(format!(
            "{what}: connection lost before the ack"
        ))),
        _ if api_source(&error).is_some_and(|api| {
            [DUPLICATE_IN_PROCESS, WRONG_LAST_SEQUENCE_CONSTANT].contains(&api.error_code().0)
        }) =>
        {
            PublishFailure::InProcess
        }
        _ => PublishFailure::Other(match api_source(&error).map(|api| refusal(what, api)) {
            Some((down, message)) => refused(down, message, error),
            None => BusError::backend_caused(BACKEND, format!("{what}: {error}"), error),
        }),
    }
}

/// JetStream's "duplicate message id is in process" (clustered streams only).
const DUPLICATE_IN_PROCESS: u64 = 10158;

/// JetStream's "wrong last sequence" without the sequence (clustered streams).
const WRONG_LAST_SEQUENCE_CONSTANT: u64 = 10164;

/// The JetStream API error behind a failed publish, if the server answered.
fn api_source(error: &PublishError) -> Option<&jetstream::Error> {
    std::error::Error::source(error)?.downcast_ref::<jetstream::Error>()
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

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(1);

    fn api(err_code: u64) -> jetstream::Error {
        serde_json::from_value(serde_json::json!({
            "code": 503,
            "err_code": err_code,
            "description": "refused for the test",
        }))
        .expect("a JetStream API error")
    }

    fn cause<E: std::error::Error + 'static>(error: &BusError) -> &E {
        error
            .source()
            .expect("a source")
            .downcast_ref::<E>()
            .expect("the client's error type")
    }

    #[test]
    fn an_api_refusal_keeps_the_servers_answer() {
        let error = api_error("creating", api(ErrorCode::STREAM_NOT_FOUND.0));
        assert!(
            matches!(error, BusError::BackendFailure { .. }),
            "{error:?}"
        );
        assert_eq!(
            cause::<jetstream::Error>(&error).error_code(),
            ErrorCode::STREAM_NOT_FOUND
        );

        let error = api_error("creating", api(ErrorCode::JETSTREAM_NOT_ENABLED.0));
        assert!(matches!(error, BusError::Unavailable { .. }), "{error:?}");
        assert_eq!(
            cause::<jetstream::Error>(&error).error_code(),
            ErrorCode::JETSTREAM_NOT_ENABLED
        );
    }

    #[test]
    fn a_failed_request_keeps_the_clients_error() {
        for kind in [RequestErrorKind::NoResponders, RequestErrorKind::Other] {
            let error = request_error("looking up", TIMEOUT, RequestError::new(kind));
            assert!(matches!(error, BusError::Unavailable { .. }), "{error:?}");
            assert_eq!(cause::<RequestError>(&error).kind(), kind);
        }
        let error = request_error(
            "looking up",
            TIMEOUT,
            RequestError::new(RequestErrorKind::TimedOut),
        );
        assert!(matches!(error, BusError::Timeout { .. }), "{error:?}");
    }

    #[test]
    fn a_failed_publish_keeps_the_clients_error() {
        let refused =
            PublishError::with_source(PublishErrorKind::Other, api(ErrorCode::STREAM_NOT_FOUND.0));
        let PublishFailure::Other(error) = publish_failure(refused, "publish", TIMEOUT, 1, 1, "t")
        else {
            panic!("an API refusal is mapped");
        };
        assert!(
            matches!(error, BusError::BackendFailure { .. }),
            "{error:?}"
        );
        let publish = cause::<PublishError>(&error);
        assert!(
            publish
                .source()
                .and_then(|source| source.downcast_ref::<jetstream::Error>())
                .is_some(),
            "the chain reaches the server's answer"
        );

        let plain = PublishError::new(PublishErrorKind::Other);
        let PublishFailure::Other(error) = publish_failure(plain, "publish", TIMEOUT, 1, 1, "t")
        else {
            panic!("a client failure is mapped");
        };
        assert_eq!(
            cause::<PublishError>(&error).kind(),
            PublishErrorKind::Other
        );
    }
}
