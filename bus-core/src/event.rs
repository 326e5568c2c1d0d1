//! The acknowledgement and stored-record types, with the reference serde shapes.

use serde::{Deserialize, Serialize};

/// Acknowledgment for a published event.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PublishAck {
    /// Topic the event landed on.
    pub topic: String,
    /// Partition index (derived from the partition key).
    pub partition: u32,
    /// Partition-local offset of the stored record: starts at 0 and grows by
    /// one per stored record on every backend.
    pub offset: u64,
}

/// An event as stored/replayed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredEvent {
    /// Partition index.
    pub partition: u32,
    /// Partition-local offset (see [`PublishAck::offset`]).
    pub offset: u64,
    /// Partition key.
    pub key: String,
    /// The event payload.
    pub value: serde_json::Value,
    /// Broker-assigned append timestamp (epoch ms).
    pub stored_at: u64,
}

/// The UID carried in a value's `metadata.uid`, when it is a string.
pub fn embedded_uid(value: &serde_json::Value) -> Option<&str> {
    value
        .get("metadata")
        .and_then(|metadata| metadata.get("uid"))
        .and_then(serde_json::Value::as_str)
}

/// The UID a publish stores under: the explicit one, checked against the
/// value's `metadata.uid` (a mismatch is an argument error), else the
/// embedded one.
pub fn resolve_uid<'a>(
    value: &'a serde_json::Value,
    explicit: Option<&'a str>,
) -> Result<Option<&'a str>, crate::BusError> {
    let embedded = embedded_uid(value);
    match (explicit, embedded) {
        (Some(given), Some(inner)) if given != inner => Err(crate::BusError::invalid(
            "event_uid",
            format!(
                "{given:?} differs from the value's metadata.uid {inner:?}; pass the same UID or drop one"
            ),
        )),
        (Some(""), _) => Err(crate::BusError::invalid("event_uid", "must not be empty")),
        (Some(given), _) => Ok(Some(given)),
        (None, inner) => Ok(inner.filter(|uid| !uid.is_empty())),
    }
}

/// Milliseconds since the Unix epoch, by the system clock.
pub fn now_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// A stored event with its headers (C25): what
/// [`EventBus::fetch_with_headers`](crate::EventBus::fetch_with_headers)
/// returns, and what subscriptions and consumers deliver beside the
/// [`StoredEvent`] (which keeps the reference's exact shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredRecord {
    /// The event, as [`EventBus::fetch`](crate::EventBus::fetch) returns it.
    #[serde(flatten)]
    pub event: StoredEvent,
    /// Its headers; empty for a record published without any.
    #[serde(default, skip_serializing_if = "crate::Headers::is_empty")]
    pub headers: crate::Headers,
}

impl From<StoredEvent> for StoredRecord {
    /// The event with no headers.
    fn from(event: StoredEvent) -> Self {
        Self {
            event,
            headers: crate::Headers::new(),
        }
    }
}
