//! How topics, partitions and UIDs map to JetStream stream names, subjects
//! and headers. Public so foreign clients (and the test harness) can write
//! into a partition the way the bus does.
//!
//! Stream names may not contain `.`, `*`, `>`, whitespace or path
//! separators, while topic names may contain `.`; the mapping escapes
//! (`_` → `__`, `.` → `_d`) so that it is injective, and replaces names
//! whose escape would be long by a hash (`_h` + 40 hex digits, a prefix the
//! escape never produces), keeping stream names well within NATS limits.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bus_core::InvalidName;
use sha2::{Digest, Sha256};

use bus_core::auth::to_hex;

/// Header carrying the record's partition key (percent-encoded).
pub const KEY_HEADER: &str = "Bus-Key";
/// Header carrying the record's event UID (percent-encoded).
pub const UID_HEADER: &str = "Bus-Uid";
/// Header carrying the record's authentication tag (lower-case hex).
pub const TAG_HEADER: &str = "Bus-Tag";

/// Stream metadata key holding the topic name.
pub const META_TOPIC: &str = "bus.topic";
/// Stream metadata key holding the partition index.
pub const META_PARTITION: &str = "bus.partition";
/// Stream metadata key holding the topic's whole `TopicSpec` as JSON.
pub const META_SPEC: &str = "bus.spec";

/// Longest escaped topic kept readable in stream names; longer ones are hashed.
const MAX_ESCAPED: usize = 64;

/// Whether `prefix` can start stream names: 1 to 32 of `[A-Za-z0-9-]` (no
/// `_`, so `{prefix}_` marks where the topic part starts).
pub fn validate_prefix(prefix: &str) -> Result<(), InvalidName> {
    if prefix.is_empty() || prefix.len() > 32 {
        return Err(InvalidName(format!(
            "{} bytes long; use 1 to 32 of [A-Za-z0-9-]",
            prefix.len()
        )));
    }
    if let Some(bad) = prefix
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
    {
        return Err(InvalidName(format!(
            "contains {bad:?}; use only [A-Za-z0-9-]"
        )));
    }
    Ok(())
}

/// The topic's token in stream names and subjects: its escape, or its hash
/// when the escape is long. Valid as a stream-name part and a subject token.
pub fn topic_token(topic: &str) -> String {
    let mut escaped = String::with_capacity(topic.len() + 4);
    for c in topic.chars() {
        match c {
            '_' => escaped.push_str("__"),
            '.' => escaped.push_str("_d"),
            other => escaped.push(other),
        }
    }
    if escaped.len() <= MAX_ESCAPED {
        escaped
    } else {
        let digest = Sha256::digest(topic.as_bytes());
        format!("_h{}", &to_hex(&digest)[..40])
    }
}

/// The stream of one partition: `{prefix}_{token}_{partition}`.
pub fn stream_name(prefix: &str, topic: &str, partition: u32) -> String {
    format!("{prefix}_{}_{partition}", topic_token(topic))
}

/// The subject filter covering every record of a partition's stream.
pub fn stream_subjects(stream: &str) -> String {
    format!("{stream}.>")
}

/// Stream metadata key naming how the stream's UID subjects are spelled
/// ([`UidSubjects`]); streams created before it existed have none.
pub const META_UID_SUBJECTS: &str = "bus.uid-subjects";

/// How a stream spells its UID subjects, fixed when the stream is created
/// and recorded in its metadata ([`META_UID_SUBJECTS`]).
///
/// The server keeps state for every subject a stream holds, and the subject's
/// length counts several times over: one subject per UID cost a
/// nats-server 2.15.1 ~504 bytes of resident memory per UID with a 64-digit
/// token and ~334 with a 32-digit one (`nats_uid_memory` in bus-bench).
/// Two UIDs whose tokens collide share a subject, which a lookup walks like
/// one holding forgeries (only a record carrying the UID answers for it), so
/// a shorter token costs correctness nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UidSubjects {
    /// `{stream}.u.{64 hex digits of SHA-256}`, published with a
    /// `Nats-Msg-Id`: streams created before the metadata key existed.
    Sha256Hex,
    /// `{stream}.u.{16 base64url characters of SHA-256's first 96 bits}`, no
    /// `Nats-Msg-Id` (the subject's condition already deduplicates; the
    /// server's duplicate-window map cost ~240 bytes more per UID for the
    /// window, and ~60 stayed resident after it).
    Sha256Short,
}

impl UidSubjects {
    /// The spelling of streams created now.
    pub const CURRENT: Self = Self::Sha256Short;

    /// The value recorded under [`META_UID_SUBJECTS`] (none for
    /// [`UidSubjects::Sha256Hex`], which predates the key).
    pub fn recorded_as(self) -> Option<&'static str> {
        match self {
            Self::Sha256Hex => None,
            Self::Sha256Short => Some("sha256-96-base64url"),
        }
    }

    /// The spelling a stream's metadata value names; `None` for a value this
    /// version does not know (a stream it must not write to).
    pub fn from_recorded(value: Option<&str>) -> Option<Self> {
        match value {
            None => Some(Self::Sha256Hex),
            Some("sha256-96-base64url") => Some(Self::Sha256Short),
            Some(_) => None,
        }
    }

    /// The UID's subject token.
    pub fn token(self, uid: &str) -> String {
        match self {
            Self::Sha256Hex => uid_hash(uid),
            Self::Sha256Short => {
                let digest = Sha256::digest(uid.as_bytes());
                URL_SAFE_NO_PAD.encode(&digest[..12])
            }
        }
    }

    /// Whether a record's first publish also carries a `Nats-Msg-Id`.
    pub fn with_msg_id(self) -> bool {
        self == Self::Sha256Hex
    }
}

/// The subject a record is published on in a stream created by this
/// version ([`UidSubjects::CURRENT`]): see [`record_subject_as`].
pub fn record_subject(stream: &str, uid: Option<&str>) -> String {
    record_subject_as(stream, uid, UidSubjects::CURRENT)
}

/// The subject a record is published on in a stream that spells UID
/// subjects `spelling`: one subject per UID token (so the server's
/// per-subject index answers dedup and find-by-UID), and one shared subject
/// for records without UID.
pub fn record_subject_as(stream: &str, uid: Option<&str>, spelling: UidSubjects) -> String {
    match uid {
        Some(uid) => format!("{stream}.u.{}", spelling.token(uid)),
        None => format!("{stream}.r"),
    }
}

/// The JetStream KV bucket holding a bus's durable-consumer cursors
/// (C20): `{prefix}_consumers`, so its stream is `KV_{prefix}_consumers`,
/// which no topic stream (`{prefix}_{token}_{partition}`) can be.
pub fn consumer_bucket(prefix: &str) -> String {
    format!("{prefix}_consumers")
}

/// A consumer's key in [`consumer_bucket`]: `{topic token}.{name token}`
/// (consumer names follow the topic-name rule, so they escape alike and
/// hold no `.`; the keys of one topic share the `{topic token}.` prefix).
pub fn consumer_key(topic: &str, name: &str) -> String {
    format!("{}.{}", topic_token(topic), topic_token(name))
}

/// The core-NATS subject a live owner of a consumer answers on (C23):
/// `{prefix}.consumer-owner.{topic token}.{name token}.{owner id}`.
pub fn owner_subject(prefix: &str, topic: &str, name: &str, owner: u64) -> String {
    format!(
        "{prefix}.consumer-owner.{}.{}.{owner}",
        topic_token(topic),
        topic_token(name)
    )
}

/// Hex of SHA-256 of the UID: a subject token whatever the UID holds.
pub fn uid_hash(uid: &str) -> String {
    to_hex(&Sha256::digest(uid.as_bytes()))
}

/// Percent-encodes everything but `[A-Za-z0-9-_.~]`, so header values keep
/// leading/trailing spaces (NATS trims them) and any unicode exactly.
pub fn encode_header_text(text: &str) -> String {
    bus_core::backend::percent_encode(text)
}

/// Reverses [`encode_header_text`]; `None` when malformed.
pub fn decode_header_text(text: &str) -> Option<String> {
    bus_core::backend::percent_decode(text)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn look_alike_topics_get_distinct_streams() {
        let names = ["a", "a.0", "a_0", "A", "a..0", "a-0", "a_d0", "a__0", "_h"];
        let mut streams: Vec<String> = names.iter().map(|n| stream_name("p", n, 0)).collect();
        streams.extend(names.iter().map(|n| stream_name("p", n, 10)));
        let unique: std::collections::HashSet<_> = streams.iter().collect();
        assert_eq!(unique.len(), streams.len(), "{streams:?}");
        for stream in &streams {
            assert!(!stream.contains(['.', '*', '>', ' ']), "{stream}");
        }
    }

    #[test]
    fn long_names_are_hashed_and_short() {
        let long = "x.".repeat(100);
        let stream = stream_name("bus", &long, 1023);
        assert!(stream.len() < 64, "{stream}");
        assert_ne!(stream, stream_name("bus", &"x.".repeat(99), 1023));
    }

    #[test]
    fn header_text_round_trips() {
        for text in ["", " lead and trail ", "ünï-🔑", "a:b%c", "quote\"\\"] {
            let encoded = encode_header_text(text);
            assert!(!encoded.contains([' ', '\r', '\n', ':']));
            assert_eq!(decode_header_text(&encoded).as_deref(), Some(text));
        }
        assert_eq!(decode_header_text("%zz"), None);
        assert_eq!(decode_header_text("%4"), None);
        assert_eq!(decode_header_text("%+A"), None, "a sign is not a hex digit");
    }

    #[test]
    fn uid_subject_spellings() {
        let short = record_subject_as("s", Some("order-1"), UidSubjects::Sha256Short);
        let token = short.strip_prefix("s.u.").expect("under .u.");
        assert_eq!(token.len(), 16);
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert_ne!(
            short,
            record_subject_as("s", Some("order-2"), UidSubjects::Sha256Short)
        );
        assert_eq!(record_subject("s", Some("order-1")), short, "CURRENT");
        assert_eq!(
            record_subject_as("s", Some("order-1"), UidSubjects::Sha256Hex),
            format!("s.u.{}", uid_hash("order-1"))
        );
        assert_eq!(
            record_subject_as("s", None, UidSubjects::Sha256Short),
            "s.r"
        );
        for spelling in [UidSubjects::Sha256Hex, UidSubjects::Sha256Short] {
            assert_eq!(
                UidSubjects::from_recorded(spelling.recorded_as()),
                Some(spelling)
            );
        }
        assert_eq!(UidSubjects::from_recorded(Some("from-the-future")), None);
        assert!(UidSubjects::Sha256Hex.with_msg_id());
        assert!(!UidSubjects::Sha256Short.with_msg_id());
    }

    #[test]
    fn prefixes() {
        validate_prefix("bus-1").unwrap();
        assert!(validate_prefix("").is_err());
        assert!(validate_prefix("a_b").is_err());
        assert!(validate_prefix("a.b").is_err());
    }
}
