//! The one mapping from librdkafka's errors to [`BusError`], secrets
//! redacted: what the caller must fix (`InvalidArgument`), what a retry
//! may cure (`Unavailable`, `Timeout`), and the rest (`BackendFailure`).

use bus_core::BusError;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::KafkaOptions;

/// The one mapping from librdkafka errors to [`BusError`] (secrets redacted).
pub(crate) fn map_error(options: &KafkaOptions, what: &str, error: KafkaError) -> BusError {
    // librdkafka refused a setting (an unknown or malformed pass-through):
    // the caller's to fix.
    if matches!(error, KafkaError::ClientConfig(..)) {
        return BusError::invalid("kafka options", options.redact(format!("{what}: {error}")));
    }
    // An admin request's own failure (rust-rdkafka gives no code for it):
    // a transport failure while provisioning is an outage like any other.
    let code = match &error {
        KafkaError::AdminOp(code) => Some(*code),
        other => other.rdkafka_error_code(),
    };
    match code {
        Some(
            RDKafkaErrorCode::MessageTimedOut
            | RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::TimedOutQueue,
        ) => BusError::timeout(what, options.timeout),
        // Also what a cluster answers while a broker shuts down or starts:
        // partitions without a leader, metadata not loaded yet. Which bus
        // topics and partitions exist is the manifest's to say, so an
        // unknown topic or partition from the broker is an outage too.
        Some(
            RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::NetworkException
            | RDKafkaErrorCode::Resolve
            | RDKafkaErrorCode::LeaderNotAvailable
            | RDKafkaErrorCode::NotLeaderForPartition
            | RDKafkaErrorCode::BrokerNotAvailable
            | RDKafkaErrorCode::ReplicaNotAvailable
            | RDKafkaErrorCode::NotEnoughReplicas
            | RDKafkaErrorCode::NotEnoughReplicasAfterAppend
            | RDKafkaErrorCode::KafkaStorageError
            | RDKafkaErrorCode::FencedLeaderEpoch
            | RDKafkaErrorCode::UnknownLeaderEpoch
            | RDKafkaErrorCode::OffsetNotAvailable
            | RDKafkaErrorCode::NotCoordinator
            | RDKafkaErrorCode::CoordinatorNotAvailable
            | RDKafkaErrorCode::CoordinatorLoadInProgress
            | RDKafkaErrorCode::UnknownPartition
            | RDKafkaErrorCode::UnknownTopic
            | RDKafkaErrorCode::UnknownTopicOrPartition
            // The producer was fenced or failed; it is replaced, so a
            // retry goes through a fresh one.
            | RDKafkaErrorCode::Fatal,
        ) => BusError::unavailable_caused("kafka", options.redact(format!("{what}: {error}")), error),
        _ => {
            let message = options.redact(format!("{what}: {error}"));
            BusError::backend_caused("kafka", message, error)
        }
    }
}

/// A [`BusError::Timeout`] for `what` after the bus timeout.
pub(crate) fn timed_out(options: &KafkaOptions, what: &str) -> BusError {
    BusError::timeout(what, options.timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_admin_transport_failure_is_an_outage() {
        let options = KafkaOptions::new(["127.0.0.1:1".to_owned()]);
        let error = map_error(
            &options,
            "creating topics",
            KafkaError::AdminOp(RDKafkaErrorCode::BrokerTransportFailure),
        );
        assert!(matches!(error, BusError::Unavailable { .. }), "{error:?}");
        assert!(error.is_transient());
        let refused = map_error(
            &options,
            "creating topics",
            KafkaError::AdminOp(RDKafkaErrorCode::InvalidReplicationFactor),
        );
        assert!(
            matches!(refused, BusError::BackendFailure { .. }),
            "{refused:?}"
        );
    }
}
