//! The one record-preparation step every backend runs before it stores
//! anything: check the key and UID, encode the value within the topic's
//! limits, place the key on its partition and sign the record. A batch
//! prepares every record before it stores one, so a bad record stores
//! nothing (contracts C3, C5, C6, C12, C14).

use serde_json::Value;

use crate::auth::{RecordAuth, RecordParts, TAG_LEN};
use crate::{
    BusError, Headers, TopicSpec, backend::encode_value, backend::validate_key,
    backend::validate_uid, partition_for, resolve_uid,
};

/// A record checked, encoded, placed and signed; nothing stored yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedRecord<'a> {
    /// The partition `partition_for(key, partitions)` places it on.
    pub partition: u32,
    /// The partition key, checked.
    pub key: &'a str,
    /// The UID (given, or the value's `metadata.uid`), checked.
    pub uid: Option<&'a str>,
    /// The value's JSON bytes, within the topic's depth and size limits.
    pub value: Vec<u8>,
    /// The record's headers, checked (C25); empty for most records.
    pub headers: Headers,
    /// The record's authentication tag, when a control key is set: over
    /// the headers too, when there are any.
    pub tag: Option<[u8; TAG_LEN]>,
}

/// Prepares one record for `spec`'s topic (see the module docs).
///
/// # Errors
/// `InvalidArgument` for a bad key or UID (or a `metadata.uid` that differs
/// from `uid`), `TooDeep` / `TooLarge` for a value over the topic's limits.
pub fn prepare_record<'a>(
    spec: &TopicSpec,
    key: &'a str,
    value: &'a Value,
    uid: Option<&'a str>,
    auth: Option<&RecordAuth>,
) -> Result<PreparedRecord<'a>, BusError> {
    prepare_record_with(spec, key, value, uid, &Headers::new(), auth)
}

/// [`prepare_record`] of a record with `headers` (C25): they are checked
/// against every limit and covered by the tag.
///
/// # Errors
/// As [`prepare_record`], and `InvalidArgument` (field `headers`) for
/// headers over a limit.
pub fn prepare_record_with<'a>(
    spec: &TopicSpec,
    key: &'a str,
    value: &'a Value,
    uid: Option<&'a str>,
    headers: &Headers,
    auth: Option<&RecordAuth>,
) -> Result<PreparedRecord<'a>, BusError> {
    headers.validate()?;
    validate_key(key)?;
    let uid = resolve_uid(value, uid)?;
    if let Some(uid) = uid {
        validate_uid(uid)?;
    }
    let value = encode_value(&spec.name, value, spec.max_record_bytes)?;
    let partition = partition_for(key, spec.partitions);
    let tag = auth.map(|auth| {
        auth.tag_with(
            RecordParts {
                topic: &spec.name,
                partition,
                key,
                uid,
                value: &value,
            },
            headers,
        )
    });
    Ok(PreparedRecord {
        partition,
        key,
        uid,
        value,
        headers: headers.clone(),
        tag,
    })
}

/// The partition a UID lookup (`find_event_by_uid`) reads: the key's, after
/// the key and UID are checked as a publish would check them.
///
/// # Errors
/// `InvalidArgument` for a bad key or UID.
pub fn uid_partition(spec: &TopicSpec, key: &str, uid: &str) -> Result<u32, BusError> {
    validate_key(key)?;
    validate_uid(uid)?;
    Ok(partition_for(key, spec.partitions))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    #[test]
    fn places_checks_and_signs() {
        let spec = TopicSpec::new("audit", 4);
        let value = json!({"metadata": {"uid": "u-1"}, "n": 1});
        let auth = RecordAuth::new(&[7; 32]);
        let record = prepare_record(&spec, "agent", &value, None, Some(&auth)).unwrap();
        assert_eq!(record.partition, partition_for("agent", 4));
        assert_eq!(
            record.uid,
            Some("u-1"),
            "the value's metadata.uid is the UID"
        );
        assert_eq!(record.value, serde_json::to_vec(&value).unwrap());
        let expected = auth.tag(RecordParts {
            topic: "audit",
            partition: record.partition,
            key: "agent",
            uid: Some("u-1"),
            value: &record.value,
        });
        assert_eq!(record.tag, Some(expected));
        let unsigned = prepare_record(&spec, "agent", &value, None, None).unwrap();
        assert_eq!(unsigned.tag, None);
    }

    #[test]
    fn refuses_what_a_publish_refuses() {
        let spec = TopicSpec::new("audit", 4);
        let value = json!({"metadata": {"uid": "u-1"}});
        let long_key = "k".repeat(crate::record::MAX_KEY_BYTES + 1);
        assert!(matches!(
            prepare_record(&spec, &long_key, &json!(1), None, None),
            Err(BusError::InvalidArgument { .. })
        ));
        assert!(matches!(
            prepare_record(&spec, "k", &value, Some("u-2"), None),
            Err(BusError::InvalidArgument { .. })
        ));
        let mut small = TopicSpec::new("small", 1);
        small.max_record_bytes = 8;
        assert!(matches!(
            prepare_record(&small, "k", &json!("a long string"), None, None),
            Err(BusError::TooLarge { .. })
        ));
        assert!(matches!(
            uid_partition(&spec, "k", ""),
            Err(BusError::InvalidArgument { .. })
        ));
        assert_eq!(
            uid_partition(&spec, "k", "u").unwrap(),
            partition_for("k", 4)
        );
    }
}
