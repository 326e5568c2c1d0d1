//! Turning Kafka records back into bus records (contracts C5, C14): the
//! key, the value and the append time, checked against the control key.

use bus_core::auth::{RecordAuth, RecordParts, TagFault, from_hex};
use bus_core::{BusError, Headers, StoredEvent, StoredRecord};

use crate::reader::RawMessage;

/// The checked records of a read. A record that fails is never returned:
/// the authentic records before it are, and a fetch starting at it fails
/// with [`BusError::Integrity`] naming its offset.
pub(crate) fn authentic_prefix(
    decoded: Vec<Result<StoredRecord, BusError>>,
) -> Result<Vec<StoredRecord>, BusError> {
    let mut out = Vec::with_capacity(decoded.len());
    for event in decoded {
        match event {
            Ok(event) => out.push(event),
            Err(error) if out.is_empty() => return Err(error),
            Err(_) => break,
        }
    }
    Ok(out)
}

/// Whether `message` carries a valid tag under `auth` (no JSON parsing).
pub(crate) fn tag_verifies(
    topic: &str,
    partition: u32,
    message: &RawMessage<'_>,
    auth: &RecordAuth,
) -> bool {
    tag_check(
        topic,
        partition,
        message,
        auth,
        &carried(topic, partition, message),
    )
    .is_ok()
}

/// The caller's headers of `message` (C25): every Kafka header but the
/// bus's own. A value that is not UTF-8 (another producer's binary header)
/// is left out with a warning, never a failed read; under a control key
/// the tag then fails, as for any record the bus did not write.
fn carried(topic: &str, partition: u32, message: &RawMessage<'_>) -> Headers {
    let mut pairs = Vec::with_capacity(message.headers.len());
    for &(name, value) in &message.headers {
        match std::str::from_utf8(value) {
            Ok(value) => pairs.push((name, value)),
            Err(_) => tracing::warn!(
                topic,
                partition,
                offset = message.offset,
                header = name,
                "kafka: a header value is not UTF-8 text; the record is delivered without it"
            ),
        }
    }
    Headers::from_stored(pairs)
}

/// `message`'s tag checked under `auth`; a malformed hex tag does not match.
fn tag_check(
    topic: &str,
    partition: u32,
    message: &RawMessage<'_>,
    auth: &RecordAuth,
    headers: &Headers,
) -> Result<(), TagFault> {
    let Ok(key) = std::str::from_utf8(message.key) else {
        return Err(TagFault::Mismatch);
    };
    let parts = RecordParts {
        topic,
        partition,
        key,
        uid: message.uid,
        value: message.value.unwrap_or_default(),
    };
    let tag = message.tag.map(|tag| {
        std::str::from_utf8(tag)
            .ok()
            .and_then(from_hex)
            .unwrap_or_default()
    });
    auth.check_with(parts, headers, tag.as_deref())
}

/// Checks one record against the control key and decodes it.
pub(crate) fn decode_one(
    topic: &str,
    partition: u32,
    message: RawMessage<'_>,
    auth: Option<&RecordAuth>,
) -> Result<StoredRecord, BusError> {
    let integrity = |reason: &str| BusError::Integrity {
        topic: topic.to_owned(),
        partition,
        offset: message.offset,
        reason: reason.to_owned(),
    };
    let key = std::str::from_utf8(message.key).map_err(|_| integrity("key is not UTF-8"))?;
    let value = message.value.unwrap_or_default();
    let headers = carried(topic, partition, &message);
    if let Some(auth) = auth {
        tag_check(topic, partition, &message, auth, &headers)
            .map_err(|fault| integrity(fault.reason()))?;
    }
    let value = serde_json::from_slice(value).map_err(|_| integrity("value is not valid JSON"))?;
    Ok(StoredRecord {
        event: StoredEvent {
            partition,
            offset: message.offset,
            key: key.to_owned(),
            value,
            stored_at: message
                .timestamp
                .and_then(|ms| u64::try_from(ms).ok())
                .unwrap_or(0),
        },
        headers,
    })
}
