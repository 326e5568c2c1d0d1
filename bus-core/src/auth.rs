//! Record authentication (contract C14): HMAC-SHA256 tags over a record's
//! topic, partition, key, UID and value bytes.

use hmac::{Hmac, KeyInit, Mac};
use secrecy::{ExposeSecret, SecretBox};
use sha2::Sha256;

use crate::Headers;

type HmacSha256 = Hmac<Sha256>;

/// Length of a record tag in bytes.
pub const TAG_LEN: usize = 32;

/// Domain-separation label for deriving the record key from the control key,
/// so the control key itself never signs records.
const RECORD_KEY_LABEL: &[u8] = b"bus/record-auth/v1";

/// The record-signing key derived from a control key. `Debug` never shows it.
pub struct RecordAuth {
    /// Zeroed when dropped.
    key: SecretBox<[u8; 32]>,
}

impl Clone for RecordAuth {
    fn clone(&self) -> Self {
        Self {
            key: SecretBox::new(Box::new(*self.key.expose_secret())),
        }
    }
}

impl std::fmt::Debug for RecordAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordAuth(<redacted>)")
    }
}

/// Domain-separation label of tags that also cover a record's place in its
/// log ([`RecordAuth::tag_at`]), so such a tag never verifies as a plain one.
const PLACED_LABEL: &[u8] = b"bus/record-at/v2";

/// Starts the headers section of a tag (C25). A tag without one ends
/// right after the length-prefixed value, so no record without headers
/// hashes the same bytes as one with them.
const HEADERS_LABEL: &[u8] = b"bus/headers/v1";

/// Where a record sits in its log, for a backend that knows it before it
/// writes the record's tag (PostgreSQL assigns the offset inside the
/// transaction that writes the tag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordPlace {
    /// The record's offset in its partition.
    pub offset: u64,
    /// The record's `stored_at` (epoch ms).
    pub stored_at: u64,
}

/// The parts of a record a tag covers.
#[derive(Debug, Clone, Copy)]
pub struct RecordParts<'a> {
    /// Topic name.
    pub topic: &'a str,
    /// Partition index.
    pub partition: u32,
    /// Partition key.
    pub key: &'a str,
    /// Event UID, if any.
    pub uid: Option<&'a str>,
    /// The value's JSON bytes as stored.
    pub value: &'a [u8],
}

impl RecordAuth {
    /// Derives the record key from `control_key`.
    pub fn new(control_key: &[u8; 32]) -> Self {
        let mut mac = mac_for(control_key);
        mac.update(RECORD_KEY_LABEL);
        Self {
            key: SecretBox::new(Box::new(mac.finalize().into_bytes().into())),
        }
    }

    /// The tag of `parts`.
    pub fn tag(&self, parts: RecordParts<'_>) -> [u8; TAG_LEN] {
        self.mac(parts).finalize().into_bytes().into()
    }

    /// Checks a record's tag, if it carries one: the one verdict every
    /// backend turns into [`crate::BusError::Integrity`].
    pub fn check(&self, parts: RecordParts<'_>, tag: Option<&[u8]>) -> Result<(), TagFault> {
        match tag {
            None => Err(TagFault::Missing),
            Some(tag) if self.verify(parts, tag) => Ok(()),
            Some(_) => Err(TagFault::Mismatch),
        }
    }

    /// Whether `tag` is the tag of `parts` (constant-time comparison; a tag
    /// of any other length than [`TAG_LEN`] fails).
    pub fn verify(&self, parts: RecordParts<'_>, tag: &[u8]) -> bool {
        self.mac(parts).verify_slice(tag).is_ok()
    }

    /// The tag of `parts` at `place`: also covers the offset and the
    /// stored-at time, so a record moved to another offset or re-timed
    /// fails. Never equal to [`Self::tag`] of the same parts.
    pub fn tag_at(&self, parts: RecordParts<'_>, place: RecordPlace) -> [u8; TAG_LEN] {
        self.mac_at(parts, place).finalize().into_bytes().into()
    }

    /// Whether `tag` is the [`Self::tag_at`] of `parts` at `place`
    /// (constant-time comparison).
    pub fn verify_at(&self, parts: RecordParts<'_>, place: RecordPlace, tag: &[u8]) -> bool {
        self.mac_at(parts, place).verify_slice(tag).is_ok()
    }

    /// The tag of `parts` with `headers` (C25). Without headers it is
    /// exactly [`Self::tag`] of `parts`, so every record stored before
    /// headers existed still verifies; with them, a length-prefixed headers
    /// section follows the value under its own label.
    pub fn tag_with(&self, parts: RecordParts<'_>, headers: &Headers) -> [u8; TAG_LEN] {
        let mut mac = self.mac(parts);
        Self::headers(&mut mac, headers);
        mac.finalize().into_bytes().into()
    }

    /// Whether `tag` is the [`Self::tag_with`] of `parts` and `headers`
    /// (constant-time comparison).
    pub fn verify_with(&self, parts: RecordParts<'_>, headers: &Headers, tag: &[u8]) -> bool {
        let mut mac = self.mac(parts);
        Self::headers(&mut mac, headers);
        mac.verify_slice(tag).is_ok()
    }

    /// [`Self::check`] of a record with headers.
    pub fn check_with(
        &self,
        parts: RecordParts<'_>,
        headers: &Headers,
        tag: Option<&[u8]>,
    ) -> Result<(), TagFault> {
        match tag {
            None => Err(TagFault::Missing),
            Some(tag) if self.verify_with(parts, headers, tag) => Ok(()),
            Some(_) => Err(TagFault::Mismatch),
        }
    }

    /// [`Self::tag_at`] with `headers`, equal to it without headers.
    pub fn tag_at_with(
        &self,
        parts: RecordParts<'_>,
        headers: &Headers,
        place: RecordPlace,
    ) -> [u8; TAG_LEN] {
        let mut mac = self.mac_at(parts, place);
        Self::headers(&mut mac, headers);
        mac.finalize().into_bytes().into()
    }

    /// Whether `tag` is the [`Self::tag_at_with`] of `parts`, `headers` at
    /// `place`.
    pub fn verify_at_with(
        &self,
        parts: RecordParts<'_>,
        headers: &Headers,
        place: RecordPlace,
        tag: &[u8],
    ) -> bool {
        let mut mac = self.mac_at(parts, place);
        Self::headers(&mut mac, headers);
        mac.verify_slice(tag).is_ok()
    }

    /// Nothing for no headers (the tag of a record without headers is the
    /// one it always had); else the label, the count and each name and
    /// value length-prefixed, in name order.
    fn headers(mac: &mut HmacSha256, headers: &Headers) {
        if headers.is_empty() {
            return;
        }
        mac.update(HEADERS_LABEL);
        mac.update(&(headers.len() as u64).to_be_bytes());
        for (name, value) in headers.iter() {
            mac.update(&(name.len() as u64).to_be_bytes());
            mac.update(name.as_bytes());
            mac.update(&(value.len() as u64).to_be_bytes());
            mac.update(value.as_bytes());
        }
    }

    fn mac_at(&self, parts: RecordParts<'_>, place: RecordPlace) -> HmacSha256 {
        let mut mac = mac_for(self.key.expose_secret());
        mac.update(PLACED_LABEL);
        Self::fields(&mut mac, parts);
        mac.update(&place.offset.to_be_bytes());
        mac.update(&place.stored_at.to_be_bytes());
        mac
    }

    fn mac(&self, parts: RecordParts<'_>) -> HmacSha256 {
        let mut mac = mac_for(self.key.expose_secret());
        Self::fields(&mut mac, parts);
        mac
    }

    fn fields(mac: &mut HmacSha256, parts: RecordParts<'_>) {
        // Length-prefix every variable field so no two different records
        // hash the same byte stream.
        let field = |mac: &mut HmacSha256, bytes: &[u8]| {
            mac.update(&(bytes.len() as u64).to_be_bytes());
            mac.update(bytes);
        };
        field(mac, parts.topic.as_bytes());
        mac.update(&parts.partition.to_be_bytes());
        field(mac, parts.key.as_bytes());
        match parts.uid {
            Some(uid) => {
                mac.update(&[1]);
                field(mac, uid.as_bytes());
            }
            None => mac.update(&[0]),
        }
        field(mac, parts.value);
    }
}

/// Why a record does not authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagFault {
    /// The record carries no tag.
    Missing,
    /// The tag is not the record's (other key, other content, malformed).
    Mismatch,
}

impl TagFault {
    /// The reason text for [`crate::BusError::Integrity`].
    pub fn reason(self) -> &'static str {
        match self {
            Self::Missing => "record carries no authentication tag",
            Self::Mismatch => "authentication tag does not match",
        }
    }
}

fn mac_for(key: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length; this cannot fail.
    match <HmacSha256 as KeyInit>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    }
}

/// Lower-case hex of `bytes` (for tags carried in headers).
pub fn to_hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// Parses lower- or upper-case hex; `None` when malformed.
pub fn from_hex(text: &str) -> Option<Vec<u8>> {
    hex::decode(text).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parts<'a>(value: &'a [u8]) -> RecordParts<'a> {
        RecordParts {
            topic: "t",
            partition: 1,
            key: "k",
            uid: Some("u"),
            value,
        }
    }

    #[test]
    fn tag_verifies_and_detects_every_change() {
        let auth = RecordAuth::new(&[7; 32]);
        let tag = auth.tag(parts(b"{}"));
        assert!(auth.verify(parts(b"{}"), &tag));
        assert!(!auth.verify(parts(b"{ }"), &tag));
        assert!(!auth.verify(
            RecordParts {
                partition: 2,
                ..parts(b"{}")
            },
            &tag
        ));
        assert!(!auth.verify(
            RecordParts {
                topic: "u",
                ..parts(b"{}")
            },
            &tag
        ));
        assert!(!auth.verify(
            RecordParts {
                key: "j",
                ..parts(b"{}")
            },
            &tag
        ));
        assert!(!auth.verify(
            RecordParts {
                uid: None,
                ..parts(b"{}")
            },
            &tag
        ));
        assert!(!auth.verify(parts(b"{}"), &tag[..31]));
        assert_eq!(auth.check(parts(b"{}"), Some(&tag)), Ok(()));
        assert_eq!(auth.check(parts(b"{}"), None), Err(TagFault::Missing));
        assert_eq!(
            auth.check(parts(b"{ }"), Some(&tag)),
            Err(TagFault::Mismatch)
        );
        let other = RecordAuth::new(&[8; 32]);
        assert!(!other.verify(parts(b"{}"), &tag));
    }

    #[test]
    fn fields_cannot_slide_into_each_other() {
        let auth = RecordAuth::new(&[1; 32]);
        let a = auth.tag(RecordParts {
            key: "ab",
            uid: Some("c"),
            ..parts(b"1")
        });
        let b = auth.tag(RecordParts {
            key: "a",
            uid: Some("bc"),
            ..parts(b"1")
        });
        assert_ne!(a, b);
    }

    #[test]
    fn placed_tags_cover_offset_and_time() {
        let auth = RecordAuth::new(&[3; 32]);
        let place = RecordPlace {
            offset: 5,
            stored_at: 1_000,
        };
        let tag = auth.tag_at(parts(b"{}"), place);
        assert!(auth.verify_at(parts(b"{}"), place, &tag));
        assert_ne!(tag, auth.tag(parts(b"{}")));
        assert!(!auth.verify(parts(b"{}"), &tag));
        for moved in [
            RecordPlace { offset: 6, ..place },
            RecordPlace {
                stored_at: 999,
                ..place
            },
        ] {
            assert!(!auth.verify_at(parts(b"{}"), moved, &tag));
        }
        assert!(!auth.verify_at(parts(b"{ }"), place, &tag));
    }

    #[test]
    fn headers_are_covered_and_no_headers_changes_nothing() {
        let auth = RecordAuth::new(&[5; 32]);
        let none = Headers::new();
        assert_eq!(auth.tag_with(parts(b"{}"), &none), auth.tag(parts(b"{}")));
        let place = RecordPlace {
            offset: 1,
            stored_at: 2,
        };
        assert_eq!(
            auth.tag_at_with(parts(b"{}"), &none, place),
            auth.tag_at(parts(b"{}"), place)
        );
        let headers = Headers::try_from_pairs([("a", "1"), ("b", "2")]).unwrap();
        let tag = auth.tag_with(parts(b"{}"), &headers);
        assert_ne!(tag, auth.tag(parts(b"{}")));
        assert!(auth.verify_with(parts(b"{}"), &headers, &tag));
        assert!(!auth.verify(parts(b"{}"), &tag), "dropping headers fails");
        for forged in [
            Headers::try_from_pairs([("a", "1"), ("b", "3")]).unwrap(),
            Headers::try_from_pairs([("a", "1")]).unwrap(),
            Headers::try_from_pairs([("a", "1"), ("b", "2"), ("c", "")]).unwrap(),
            Headers::try_from_pairs([("a", "12"), ("b", "")]).unwrap(),
        ] {
            assert!(!auth.verify_with(parts(b"{}"), &forged, &tag), "{forged:?}");
        }
        assert_eq!(auth.check_with(parts(b"{}"), &headers, Some(&tag)), Ok(()));
        let placed = auth.tag_at_with(parts(b"{}"), &headers, place);
        assert!(auth.verify_at_with(parts(b"{}"), &headers, place, &placed));
        assert!(!auth.verify_at(parts(b"{}"), place, &placed));
    }

    #[test]
    fn debug_redacts_key() {
        let auth = RecordAuth::new(&[0xAB; 32]);
        let shown = format!("{auth:?}");
        assert!(
            !shown.contains("171") && !shown.to_lowercase().contains("ab"),
            "{shown}"
        );
    }

    #[test]
    fn hex_round_trips() {
        let bytes = [0u8, 1, 0xfe, 0xff];
        assert_eq!(from_hex(&to_hex(&bytes)).as_deref(), Some(&bytes[..]));
        assert_eq!(from_hex("abc"), None);
        assert_eq!(from_hex("zz"), None);
    }

    #[test]
    fn hex_has_one_spelling_per_byte() {
        // Found by the `auth` fuzz target.
        let fuzzed = "DDDBDDDDDDDDDDDDDDDDDDDDDDDDDDDD+DDDDDDDDDDD";
        assert_eq!(from_hex(fuzzed), None);
        assert_eq!(from_hex("+f"), None);
        assert_eq!(from_hex("-0"), None);
        assert_eq!(from_hex("FfA0"), Some(vec![0xff, 0xa0]));
    }
}
