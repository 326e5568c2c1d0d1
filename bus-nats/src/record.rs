//! A record as a NATS message: the value is the payload; key, UID and tag
//! travel in headers (contract C14). Decoding verifies the tag when a
//! control key is set.

use async_nats::HeaderMap;
use std::str::FromStr;

use async_nats::header::{HeaderName, HeaderValue};
use bus_core::auth::{RecordAuth, RecordParts, from_hex, to_hex};
use bus_core::{BusError, Headers, StoredEvent, StoredRecord, is_reserved_header};
use bytes::Bytes;

use crate::naming::{
    KEY_HEADER, TAG_HEADER, UID_HEADER, decode_header_text, encode_header_text, uid_hash,
};

/// A message read back from a partition's stream.
pub(crate) struct RawMessage {
    pub(crate) sequence: u64,
    pub(crate) headers: Option<HeaderMap>,
    pub(crate) payload: Bytes,
    pub(crate) stored_at: u64,
}

fn header(value: String) -> Result<HeaderValue, BusError> {
    value
        .parse::<HeaderValue>()
        .map_err(|_| BusError::invalid("header", "cannot travel in a NATS header"))
}

/// What a UID record's publish is conditioned on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Guard {
    /// The UID's subject must be empty; `Nats-Msg-Id` adds the server's
    /// window dedup.
    Empty,
    /// The UID's subject must end at this sequence (a record found not to be
    /// authentic). No `Nats-Msg-Id`: a forged one would answer for the UID.
    After(u64),
}

/// The headers of a record the bus publishes. UID records are conditioned
/// on `guard`, so a UID is stored once for as long as its record is retained.
pub(crate) fn record_headers(
    auth: Option<&RecordAuth>,
    parts: RecordParts<'_>,
    carried: &Headers,
    guard: Guard,
) -> Result<HeaderMap, BusError> {
    let mut headers = HeaderMap::new();
    // The caller's headers (C25) as NATS headers of their own names; values
    // percent-encoded like the key, since NATS trims spaces from values.
    // Their names never collide with the bus's (`Bus-*`) or the server's
    // (`Nats-*`): `Headers` refuses both prefixes.
    for (name, value) in carried.iter() {
        let name = HeaderName::from_str(name).map_err(|_| {
            BusError::invalid("headers", format!("{name:?} cannot be a NATS header name"))
        })?;
        headers.insert(name, header(encode_header_text(value))?);
    }
    headers.insert(KEY_HEADER, header(encode_header_text(parts.key))?);
    if let Some(uid) = parts.uid {
        headers.insert(UID_HEADER, header(encode_header_text(uid))?);
        let last = match guard {
            Guard::Empty => {
                headers.insert("Nats-Msg-Id", header(uid_hash(uid))?);
                0
            }
            Guard::After(sequence) => sequence,
        };
        headers.insert(
            "Nats-Expected-Last-Subject-Sequence",
            header(last.to_string())?,
        );
    }
    if let Some(auth) = auth {
        headers.insert(TAG_HEADER, header(to_hex(&auth.tag_with(parts, carried)))?);
    }
    Ok(headers)
}

/// Byte size of the headers as sent, for max_payload errors.
pub(crate) fn headers_len(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(name, values)| {
            values
                .iter()
                .map(|value| AsRef::<str>::as_ref(name).len() + value.as_str().len() + 4)
                .sum::<usize>()
        })
        .sum::<usize>()
        + 12
}

/// The key, UID and caller headers a message carries, and whether its tag
/// verifies under `auth` (always `Ok` without a key).
fn parse(
    topic: &str,
    partition: u32,
    auth: Option<&RecordAuth>,
    message: &RawMessage,
) -> Result<(String, Option<String>, Headers), BusError> {
    let integrity = |reason: &str| BusError::Integrity {
        topic: topic.to_owned(),
        partition,
        offset: message.sequence.saturating_sub(1),
        reason: reason.to_owned(),
    };
    let headers = message.headers.as_ref();
    let text = |name: &str| -> Result<Option<String>, BusError> {
        match headers.and_then(|headers| headers.get(name)) {
            None => Ok(None),
            Some(value) => decode_header_text(value.as_str())
                .map(Some)
                .ok_or_else(|| integrity(&format!("header {name} is malformed"))),
        }
    };
    let key = text(KEY_HEADER)?.unwrap_or_default();
    let uid = text(UID_HEADER)?;
    // Every header but the bus's and the server's is the caller's (C25).
    let mut carried = Vec::new();
    for (name, values) in headers.into_iter().flat_map(HeaderMap::iter) {
        let name: &str = name.as_ref();
        if is_reserved_header(name) {
            continue;
        }
        // A name sent twice keeps its last value (the bus sends one).
        if let Some(value) = values.last() {
            let value = decode_header_text(value.as_str())
                .ok_or_else(|| integrity(&format!("header {name} is malformed")))?;
            carried.push((name.to_owned(), value));
        }
    }
    let carried = Headers::from_stored(carried);
    if let Some(auth) = auth {
        // A malformed hex tag is a tag that does not match.
        let tag = headers
            .and_then(|headers| headers.get(TAG_HEADER))
            .map(|tag| from_hex(tag.as_str()).unwrap_or_default());
        let parts = RecordParts {
            topic,
            partition,
            key: &key,
            uid: uid.as_deref(),
            value: &message.payload,
        };
        auth.check_with(parts, &carried, tag.as_deref())
            .map_err(|fault| integrity(fault.reason()))?;
    }
    Ok((key, uid, carried))
}

/// Whether `message` is a record of `topic`/`partition` with this `uid`,
/// authentic under `auth` when a key is set.
pub(crate) fn is_authentic(
    topic: &str,
    partition: u32,
    auth: Option<&RecordAuth>,
    uid: &str,
    message: &RawMessage,
) -> bool {
    matches!(parse(topic, partition, auth, message), Ok((_, Some(found), _)) if found == uid)
}

/// Decodes and verifies one message of `topic`/`partition`.
#[cfg_attr(not(feature = "fuzzing"), allow(dead_code))]
pub(crate) fn decode(
    topic: &str,
    partition: u32,
    auth: Option<&RecordAuth>,
    message: &RawMessage,
) -> Result<StoredEvent, BusError> {
    decode_record(topic, partition, auth, message).map(|record| record.event)
}

/// [`decode`] with the record's headers (C25).
pub(crate) fn decode_record(
    topic: &str,
    partition: u32,
    auth: Option<&RecordAuth>,
    message: &RawMessage,
) -> Result<StoredRecord, BusError> {
    let (key, _uid, headers) = parse(topic, partition, auth, message)?;
    let value = serde_json::from_slice(&message.payload).map_err(|_| BusError::Integrity {
        topic: topic.to_owned(),
        partition,
        offset: message.sequence.saturating_sub(1),
        reason: "value is not valid JSON".to_owned(),
    })?;
    Ok(StoredRecord {
        event: StoredEvent {
            partition,
            offset: message.sequence.saturating_sub(1),
            key,
            value,
            stored_at: message.stored_at,
        },
        headers,
    })
}

/// A direct get's answer as a [`RawMessage`].
pub(crate) fn from_stream_message(
    message: async_nats::jetstream::message::StreamMessage,
) -> RawMessage {
    RawMessage {
        sequence: message.sequence,
        headers: Some(message.headers),
        payload: message.payload,
        stored_at: epoch_ms(message.time),
    }
}

/// Epoch milliseconds of a server timestamp.
pub(crate) fn epoch_ms(time: async_nats::datetime::DateTime) -> u64 {
    u64::try_from(time.unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
}
