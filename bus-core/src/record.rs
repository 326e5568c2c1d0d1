//! Checks every backend applies to a publish or fetch before touching
//! storage, so bad input fails the same way everywhere (contracts C2, C12).

use crate::BusError;

/// Longest accepted partition key, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Longest accepted event UID, in bytes.
pub const MAX_UID_BYTES: usize = 1024;

/// A key is at most [`MAX_KEY_BYTES`] and has no control characters (they
/// cannot travel in NATS or Kafka headers unchanged). Empty keys are fine.
pub fn validate_key(key: &str) -> Result<(), BusError> {
    validate_text("key", key, MAX_KEY_BYTES)
}

/// A UID is 1 to [`MAX_UID_BYTES`] bytes with no control characters.
pub fn validate_uid(uid: &str) -> Result<(), BusError> {
    if uid.is_empty() {
        return Err(BusError::invalid("event_uid", "must not be empty"));
    }
    validate_text("event_uid", uid, MAX_UID_BYTES)
}

fn validate_text(field: &str, text: &str, max: usize) -> Result<(), BusError> {
    if text.len() > max {
        return Err(BusError::invalid(
            field,
            format!("{} bytes long; use at most {max}", text.len()),
        ));
    }
    if let Some(bad) = text.chars().find(|c| c.is_control()) {
        return Err(BusError::invalid(
            field,
            format!("contains the control character {bad:?}; use printable text"),
        ));
    }
    Ok(())
}

/// `partition` is within `0..partitions` of `topic`.
pub fn check_partition(topic: &str, partition: u32, partitions: u32) -> Result<(), BusError> {
    if partition < partitions {
        Ok(())
    } else {
        Err(BusError::UnknownPartition {
            topic: topic.to_owned(),
            partition,
            partitions,
        })
    }
}

/// The JSON bytes of `value`, refused with [`BusError::TooLarge`] when they
/// exceed `max_record_bytes`.
pub fn encode_value(
    topic: &str,
    value: &serde_json::Value,
    max_record_bytes: u64,
) -> Result<Vec<u8>, BusError> {
    let bytes = serde_json::to_vec(value)?;
    let size = bytes.len() as u64;
    if size > max_record_bytes {
        return Err(BusError::TooLarge {
            topic: topic.to_owned(),
            size,
            limit: max_record_bytes,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn keys() {
        validate_key("").unwrap();
        validate_key("agent-1 üñí").unwrap();
        assert!(matches!(
            validate_key("a\0b"),
            Err(BusError::InvalidArgument { .. })
        ));
        assert!(matches!(
            validate_key("a\nb"),
            Err(BusError::InvalidArgument { .. })
        ));
        assert!(matches!(
            validate_key(&"k".repeat(MAX_KEY_BYTES + 1)),
            Err(BusError::InvalidArgument { .. })
        ));
        validate_key(&"k".repeat(MAX_KEY_BYTES)).unwrap();
    }

    #[test]
    fn uids() {
        assert!(validate_uid("").is_err());
        validate_uid("3f0c-ab").unwrap();
        assert!(validate_uid("a\rb").is_err());
    }

    #[test]
    fn sizes_and_partitions() {
        let value = serde_json::json!({"a": "x".repeat(100)});
        assert!(encode_value("t", &value, 1_000).is_ok());
        assert!(matches!(
            encode_value("t", &value, 50),
            Err(BusError::TooLarge { limit: 50, .. })
        ));
        check_partition("t", 3, 4).unwrap();
        assert!(matches!(
            check_partition("t", 4, 4),
            Err(BusError::UnknownPartition {
                partition: 4,
                partitions: 4,
                ..
            })
        ));
    }
}
