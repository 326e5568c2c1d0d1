//! Entry points for the fuzz targets in `fuzz/` (cargo feature `fuzzing`):
//! the record codec (headers plus payload) and the secrets of parsed
//! options, which `Debug` must not depend on. Not a stable API.
#![doc(hidden)]

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue};
use bus_core::auth::{RecordAuth, RecordParts};
use bus_core::{BusError, StoredEvent};
use bytes::Bytes;
use secrecy::ExposeSecret;

use crate::NatsOptions;
use crate::record::{self, Guard, RawMessage};

/// A message as read back from a partition's stream: its headers (pairs
/// that could not travel in a NATS header are skipped, as the wire never
/// delivers them), payload, stream sequence and server time.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    /// Header name/value pairs, in order (repeats append).
    pub headers: Option<&'a [(String, String)]>,
    /// The payload.
    pub payload: &'a [u8],
    /// Stream sequence (offset + 1).
    pub sequence: u64,
    /// Server time, epoch ms.
    pub stored_at: u64,
}

fn raw(message: &Message<'_>) -> RawMessage {
    RawMessage {
        sequence: message.sequence,
        headers: message.headers.map(|pairs| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                if let (Ok(name), Ok(value)) =
                    (name.parse::<HeaderName>(), value.parse::<HeaderValue>())
                {
                    map.append(name, value);
                }
            }
            map
        }),
        payload: Bytes::copy_from_slice(message.payload),
        stored_at: message.stored_at,
    }
}

/// Decodes and verifies one message of `topic`/`partition` as fetch does.
pub fn decode(
    topic: &str,
    partition: u32,
    auth: Option<&RecordAuth>,
    message: &Message<'_>,
) -> Result<StoredEvent, BusError> {
    record::decode(topic, partition, auth, &raw(message))
}

/// Whether the message is an authentic record with this `uid`, as dedup
/// and find-by-UID decide.
pub fn is_authentic(
    topic: &str,
    partition: u32,
    auth: Option<&RecordAuth>,
    uid: &str,
    message: &Message<'_>,
) -> bool {
    record::is_authentic(topic, partition, auth, uid, &raw(message))
}

/// The headers publish sends for `parts`, conditioned on an empty UID
/// subject (`after` = `None`) or on its last sequence.
pub fn record_headers(
    auth: Option<&RecordAuth>,
    parts: RecordParts<'_>,
    after: Option<u64>,
) -> Result<Vec<(String, String)>, BusError> {
    let guard = after.map_or(Guard::Empty, Guard::After);
    let headers = record::record_headers(auth, parts, &bus_core::Headers::new(), guard)?;
    Ok(headers
        .iter()
        .flat_map(|(name, values)| {
            values
                .iter()
                .map(move |value| (name.to_string(), value.as_str().to_owned()))
        })
        .collect())
}

/// The password and token of parsed options.
pub fn secrets(options: &NatsOptions) -> (Option<&str>, Option<&str>) {
    (
        options.password.as_ref().map(ExposeSecret::expose_secret),
        options.token.as_ref().map(ExposeSecret::expose_secret),
    )
}
