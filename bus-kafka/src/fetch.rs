//! Turning Kafka records back into bus records (contracts C5, C14): the
//! key, the value and the append time, checked against the control key.

use bus_core::auth::{RecordAuth, RecordParts, TagFault, from_hex};
use bus_core::{BusError, StoredEvent};

use crate::reader::RawMessage;

/// The checked records of a read. A record that fails is never returned:
/// the authentic records before it are, and a fetch starting at it fails
/// with [`BusError::Integrity`] naming its offset.
pub(crate) fn authentic_prefix(
    decoded: Vec<Result<StoredEvent, BusError>>,
) -> Result<Vec<StoredEvent>, BusError> {
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
    tag_check(topic, partition, message, auth).is_ok()
}

/// `message`'s tag checked under `auth`; a malformed hex tag does not match.
fn tag_check(
    topic: &str,
    partition: u32,
    message: &RawMessage<'_>,
    auth: &RecordAuth,
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
    auth.check(parts, tag.as_deref())
}

/// Checks one record against the control key and decodes it.
pub(crate) fn decode_one(
    topic: &str,
    partition: u32,
    message: RawMessage<'_>,
    auth: Option<&RecordAuth>,
) -> Result<StoredEvent, BusError> {
    let integrity = |reason: &str| BusError::Integrity {
        topic: topic.to_owned(),
        partition,
        offset: message.offset,
        reason: reason.to_owned(),
    };
    let key = std::str::from_utf8(message.key).map_err(|_| integrity("key is not UTF-8"))?;
    let value = message.value.unwrap_or_default();
    if let Some(auth) = auth {
        tag_check(topic, partition, &message, auth).map_err(|fault| integrity(fault.reason()))?;
    }
    let value = serde_json::from_slice(value).map_err(|_| integrity("value is not valid JSON"))?;
    Ok(StoredEvent {
        partition,
        offset: message.offset,
        key: key.to_owned(),
        value,
        stored_at: message
            .timestamp
            .and_then(|ms| u64::try_from(ms).ok())
            .unwrap_or(0),
    })
}
