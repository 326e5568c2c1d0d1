//! Entry points for the fuzz targets in `fuzz/` (cargo feature `fuzzing`):
//! the record decoder (key, headers and payload as librdkafka hands them
//! over) and the password of parsed options, which `Debug` must not depend
//! on. Not a stable API.
#![doc(hidden)]

use bus_core::auth::RecordAuth;
use bus_core::{BusError, StoredEvent};
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};
use secrecy::ExposeSecret;

use crate::KafkaOptions;
use crate::options::SaslMechanism;
use crate::{fetch, reader};

/// Header names the bus reads.
pub const UID_HEADER: &str = reader::UID_HEADER;
/// Header carrying the hex tag.
pub const TAG_HEADER: &str = reader::TAG_HEADER;

/// A header: its key and value (`None`: a null value).
pub type HeaderPair = (String, Option<Vec<u8>>);

/// A record as a consumer receives it.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    /// Offset in the partition.
    pub offset: u64,
    /// Record key bytes.
    pub key: Option<&'a [u8]>,
    /// Record value bytes (`None`: a tombstone).
    pub value: Option<&'a [u8]>,
    /// Headers in order; `None` when the record has no header block.
    pub headers: Option<&'a [HeaderPair]>,
    /// Record timestamp, epoch ms (`-1` is "not available" to librdkafka).
    pub timestamp: Option<i64>,
}

fn owned(topic: &str, partition: u32, message: &Message<'_>) -> OwnedMessage {
    let headers = message.headers.map(|pairs| {
        pairs
            .iter()
            .fold(OwnedHeaders::new(), |headers, (key, value)| {
                headers.insert(Header {
                    key,
                    value: value.as_deref(),
                })
            })
    });
    OwnedMessage::new(
        message.value.map(<[u8]>::to_vec),
        message.key.map(<[u8]>::to_vec),
        topic.to_owned(),
        message
            .timestamp
            .map_or(Timestamp::NotAvailable, Timestamp::CreateTime),
        i32::try_from(partition).unwrap_or(i32::MAX),
        i64::try_from(message.offset).unwrap_or(i64::MAX),
        headers,
    )
}

/// Reads the message the way fetch does (header extraction included) and
/// decodes it, verifying its tag under `auth`.
pub fn decode(
    topic: &str,
    partition: u32,
    auth: Option<&RecordAuth>,
    message: &Message<'_>,
) -> Result<StoredEvent, BusError> {
    let owned = owned(topic, partition, message);
    fetch::decode_one(topic, partition, reader::raw(&owned, message.offset), auth)
        .map(|record| record.event)
}

/// The UID dedup would index the message under (`None` when it has none,
/// or when its tag does not verify under `auth`).
pub fn indexed_uid(
    topic: &str,
    partition: u32,
    auth: Option<&RecordAuth>,
    message: &Message<'_>,
) -> Option<String> {
    let owned = owned(topic, partition, message);
    let raw = reader::raw(&owned, message.offset);
    let authentic = auth.is_none_or(|auth| fetch::tag_verifies(topic, partition, &raw, auth));
    raw.uid.filter(|_| authentic).map(str::to_owned)
}

/// The SASL settings of parsed options.
pub fn sasl(options: &KafkaOptions) -> Option<(SaslMechanism, &str, &str)> {
    options
        .sasl
        .as_ref()
        .map(|(mechanism, user, password)| (*mechanism, user.as_str(), password.expose_secret()))
}

/// `text` as error messages show it (the password replaced).
pub fn redact(options: &KafkaOptions, text: String) -> String {
    options.redact(text)
}

/// Builds the librdkafka configuration (must not panic on any options).
pub fn client_config(options: &KafkaOptions) -> Vec<(String, String)> {
    options
        .client_config()
        .config_map()
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}
