//! Checks every backend applies to a publish or fetch before touching
//! storage, so bad input fails the same way everywhere (contracts C2, C5,
//! C12).

use serde_json::Value;

use crate::{BusError, validate_topic_name};

/// Longest accepted partition key, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Longest accepted event UID, in bytes.
pub const MAX_UID_BYTES: usize = 1024;
/// Deepest accepted nesting of arrays and objects in a value (`1` is 0
/// deep, `[1]` and `{"a": 1}` are 1). serde_json refuses to decode past 127,
/// so a deeper value could be stored but never read back; 100 also leaves
/// room for envelopes around it (a `StoredEvent` as JSON, the CLI's output).
pub const MAX_JSON_DEPTH: usize = 100;

/// A topic argument that no manifest could provision (empty, `.`, `..`,
/// characters outside `[A-Za-z0-9._-]`, over 200 bytes) is an
/// `InvalidArgument` on field `topic`; a valid name that is not provisioned
/// is the backend's `UnknownTopic`.
pub fn validate_topic(topic: &str) -> Result<(), BusError> {
    validate_topic_name(topic).map_err(|reason| BusError::invalid("topic", reason))
}

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

/// How deeply `value` nests arrays and objects, measured without recursion
/// (a pathological value must not overflow the stack here).
pub fn json_depth(value: &Value) -> usize {
    fn children(value: &Value) -> Box<dyn Iterator<Item = &Value> + '_> {
        match value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => Box::new(std::iter::empty()),
        }
    }
    let nests = |value: &Value| matches!(value, Value::Array(_) | Value::Object(_));
    if !nests(value) {
        return 0;
    }
    let mut deepest = 0;
    let mut pending = vec![(value, 1)];
    while let Some((container, depth)) = pending.pop() {
        deepest = deepest.max(depth);
        pending.extend(
            children(container)
                .filter(|child| nests(child))
                .map(|child| (child, depth + 1)),
        );
    }
    deepest
}

/// Whether `value` nests at most `limit` deep (`json_depth(value) <= limit`).
/// Recurses, but never deeper than `limit` + 1 calls; it allocates nothing,
/// so the check on every publish costs little beside the encoding (the
/// walk in [`json_depth`] boxes an iterator per container: it took a tenth
/// of an embedded batch publish).
fn within_depth(value: &Value, limit: usize) -> bool {
    match value {
        Value::Array(items) => limit > 0 && items.iter().all(|item| within_depth(item, limit - 1)),
        Value::Object(map) => limit > 0 && map.values().all(|item| within_depth(item, limit - 1)),
        _ => true,
    }
}

/// The JSON bytes of `value`, refused with [`BusError::TooDeep`] when it
/// nests deeper than [`MAX_JSON_DEPTH`] (checked first: encoding recurses)
/// and with [`BusError::TooLarge`] when the bytes exceed `max_record_bytes`.
pub fn encode_value(
    topic: &str,
    value: &Value,
    max_record_bytes: u64,
) -> Result<Vec<u8>, BusError> {
    if !within_depth(value, MAX_JSON_DEPTH) {
        return Err(BusError::TooDeep {
            topic: topic.to_owned(),
            depth: json_depth(value),
            limit: MAX_JSON_DEPTH,
        });
    }
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

    /// `depth` arrays around `1`.
    fn nested(depth: usize) -> Value {
        (0..depth).fold(serde_json::json!(1), |inner, _| Value::Array(vec![inner]))
    }

    /// Takes a nest apart level by level: the default drop recurses.
    fn dismantle(mut value: Value) {
        while let Value::Array(mut items) = value {
            value = items.pop().unwrap_or(Value::Null);
        }
    }

    #[test]
    fn depths() {
        assert_eq!(json_depth(&serde_json::json!(1)), 0);
        assert_eq!(json_depth(&serde_json::json!([])), 1);
        assert_eq!(json_depth(&serde_json::json!({})), 1);
        assert_eq!(
            json_depth(&serde_json::json!([1, {"a": [2, {"b": {}}]}, []])),
            5
        );
        let shapes = serde_json::json!([1, {"a": [2, {"b": {}}]}, [], {"c": [[[]]]}]);
        for limit in 0..8 {
            assert_eq!(within_depth(&shapes, limit), json_depth(&shapes) <= limit);
        }
        for depth in [MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 128] {
            let value = nested(depth);
            assert_eq!(json_depth(&value), depth);
            assert!(within_depth(&value, depth) && !within_depth(&value, depth - 1));
            let bytes = serde_json::to_vec(&value).unwrap();
            let decodes = serde_json::from_slice::<Value>(&bytes).is_ok();
            assert_eq!(decodes, depth < 128, "serde_json decodes up to 127");
        }
    }

    #[test]
    fn too_deep_values_are_refused_before_encoding() {
        let at_limit = nested(MAX_JSON_DEPTH);
        let bytes = encode_value("t", &at_limit, 1_000).unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap(), at_limit);
        for depth in [MAX_JSON_DEPTH + 1, 128, 200_000] {
            let value = nested(depth);
            let refused = encode_value("t", &value, u64::MAX);
            assert!(
                matches!(
                    &refused,
                    Err(BusError::TooDeep { topic, depth: d, limit: MAX_JSON_DEPTH })
                        if topic == "t" && *d == depth
                ),
                "{refused:?}"
            );
            let error = refused.unwrap_err();
            assert!(!error.is_transient());
            assert!(error.to_string().contains("\"t\""), "{error}");
            dismantle(value);
        }
    }

    #[test]
    fn topic_arguments() {
        validate_topic("audit.v1_x-2").unwrap();
        for bad in ["", ".", "..", "a/b", "a b", &"t".repeat(201)] {
            assert!(
                matches!(validate_topic(bad), Err(BusError::InvalidArgument { ref field, .. }) if field == "topic"),
                "{bad:?}"
            );
        }
        validate_topic(&"t".repeat(200)).unwrap();
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

/// A record written around the bus, as a foreign client (or an attacker
/// with write access to the storage) would: no signing, no checks. What the
/// suite's contract-C14 cases inject, and what a backend's injection hook
/// takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawRecord {
    /// Partition key.
    pub key: String,
    /// Event UID, if any.
    pub uid: Option<String>,
    /// Value bytes as they would be stored (should be JSON).
    pub value: Vec<u8>,
    /// Authentication tag, if any.
    pub tag: Option<Vec<u8>>,
    /// Headers as they would be stored (C25), unchecked.
    pub headers: crate::Headers,
}
