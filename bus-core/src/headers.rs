//! Record headers (contract C25): a small map of names to text values that
//! travels beside a record's value, in each backend's native place, and is
//! covered by the record's tag.
//!
//! Why text values and not bytes: every place a backend keeps headers takes
//! text without an encoding convention of its own (NATS headers are lines of
//! text, a PostgreSQL `jsonb` column holds strings), and what the issue
//! names as the first users (W3C `traceparent`/`tracestate`, CloudEvents
//! attributes in binary mode) are text. Bytes would need base64 on NATS and
//! PostgreSQL and a marker saying so; a caller with bytes can still encode
//! them itself.
//!
//! Why a sorted map: the tag covers the headers in one canonical order, so
//! the same headers sign the same however the caller built them, and a
//! backend that hands them back in another order (Kafka keeps the order, a
//! `jsonb` object does not) still verifies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::BusError;

/// Most headers one record carries.
pub const MAX_HEADERS: usize = 16;
/// Longest header name, in bytes.
pub const MAX_HEADER_NAME_BYTES: usize = 64;
/// Longest header value, in bytes.
pub const MAX_HEADER_VALUE_BYTES: usize = 1024;
/// Most bytes of names and values together. NATS keeps headers within the
/// room each stream reserves beside the value (8 KiB, fixed when the stream
/// was created), which also holds the bus's key, UID and tag headers; 2 KiB
/// of caller headers, percent-encoded where needed, fits beside them.
pub const MAX_HEADERS_BYTES: usize = 2048;

/// Name prefixes the bus and the brokers keep for themselves, compared
/// without regard to ASCII case: the bus's own key, UID and tag headers
/// (`Bus-Key`, `Bus-Uid`, `Bus-Tag` on NATS, `bus-uid`, `bus-tag` on
/// Kafka) and the JetStream control headers (`Nats-Msg-Id`,
/// `Nats-Expected-*`), which the server would act on.
pub const RESERVED_HEADER_PREFIXES: [&str; 2] = ["bus-", "nats-"];

/// The headers of one record: names of 1 to [`MAX_HEADER_NAME_BYTES`]
/// ASCII characters `[A-Za-z0-9-_.]`, values of printable UTF-8 text (no
/// control characters) up to [`MAX_HEADER_VALUE_BYTES`], at most
/// [`MAX_HEADERS`] of them and [`MAX_HEADERS_BYTES`] in all (C25).
///
/// Names are case-sensitive, but two names that differ only in ASCII case
/// are refused: NATS and HTTP-minded tools treat them as one.
///
/// ```
/// use bus_core::Headers;
///
/// let mut headers = Headers::new();
/// headers.insert("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
/// assert!(headers.insert("bus-uid", "x").is_err(), "reserved for the bus");
/// assert_eq!(headers.get("traceparent").map(str::len), Some(55));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Headers(BTreeMap<String, String>);

impl Headers {
    /// No headers (a `const fn`, so a backend can keep a static empty map).
    pub const fn new() -> Self {
        Self(BTreeMap::new())
    }

    /// Headers from `pairs`, each checked as [`Headers::insert`] checks it.
    ///
    /// # Errors
    /// `InvalidArgument` for the first pair that breaks a limit.
    pub fn try_from_pairs<N, V>(pairs: impl IntoIterator<Item = (N, V)>) -> Result<Self, BusError>
    where
        N: Into<String>,
        V: Into<String>,
    {
        let mut headers = Self::new();
        for (name, value) in pairs {
            headers.insert(name, value)?;
        }
        Ok(headers)
    }

    /// Headers as a backend read them back, unchecked: a record stored by
    /// another producer is delivered as it is (its tag, where the bus signs,
    /// says whether to trust it).
    pub fn from_stored<N, V>(pairs: impl IntoIterator<Item = (N, V)>) -> Self
    where
        N: Into<String>,
        V: Into<String>,
    {
        Self(
            pairs
                .into_iter()
                .map(|(name, value)| (name.into(), value.into()))
                .collect(),
        )
    }

    /// Sets `name` to `value` (replacing an earlier value of that name).
    ///
    /// # Errors
    /// `InvalidArgument` (field `headers`) naming the limit broken: an
    /// empty, over-long or non-ASCII name, a reserved name, a value over
    /// the limit or with a control character, too many headers or too many
    /// bytes in all. Nothing changes then.
    pub fn insert(
        &mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<&mut Self, BusError> {
        let (name, value) = (name.into(), value.into());
        check_name(&name)?;
        check_value(&name, &value)?;
        if let Some(other) = self
            .0
            .keys()
            .find(|other| **other != name && other.eq_ignore_ascii_case(&name))
        {
            return Err(invalid(format!(
                "{name:?} differs from {other:?} only in case; brokers may treat them as one name"
            )));
        }
        let replaced = self.0.get(&name).map_or(0, |old| name.len() + old.len());
        let total = self.bytes() - replaced + name.len() + value.len();
        if replaced == 0 && self.0.len() >= MAX_HEADERS {
            return Err(invalid(format!(
                "more than {MAX_HEADERS} headers; carry the rest in the value"
            )));
        }
        if total > MAX_HEADERS_BYTES {
            return Err(invalid(format!(
                "{total} bytes of names and values; use at most {MAX_HEADERS_BYTES}"
            )));
        }
        self.0.insert(name, value);
        Ok(self)
    }

    /// Checks every limit [`Headers::insert`] checks, for headers that did
    /// not come through it (deserialized, or [`Headers::from_stored`]).
    ///
    /// # Errors
    /// As [`Headers::insert`].
    pub fn validate(&self) -> Result<(), BusError> {
        let mut checked = Self::new();
        for (name, value) in &self.0 {
            checked.insert(name.as_str(), value.as_str())?;
        }
        Ok(())
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Every header, in name order (the order the tag covers them in).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
    }

    /// How many headers there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes of names and values together.
    pub fn bytes(&self) -> usize {
        self.0
            .iter()
            .map(|(name, value)| name.len() + value.len())
            .sum()
    }
}

impl<'a> IntoIterator for &'a Headers {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

fn invalid(reason: String) -> BusError {
    BusError::invalid("headers", reason)
}

/// Whether the bus or a broker keeps `name` for itself.
pub fn is_reserved_header(name: &str) -> bool {
    RESERVED_HEADER_PREFIXES.iter().any(|prefix| {
        name.get(..prefix.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
    })
}

fn check_name(name: &str) -> Result<(), BusError> {
    if name.is_empty() {
        return Err(invalid("a header name is empty".to_owned()));
    }
    if name.len() > MAX_HEADER_NAME_BYTES {
        return Err(invalid(format!(
            "header name of {} bytes; use at most {MAX_HEADER_NAME_BYTES}",
            name.len()
        )));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(invalid(format!(
            "header name {name:?} contains {bad:?}; use ASCII letters, digits, '-', '_' and '.'"
        )));
    }
    if is_reserved_header(name) {
        return Err(invalid(format!(
            "header name {name:?} is reserved: names starting with {RESERVED_HEADER_PREFIXES:?} \
             (any case) belong to the bus and the brokers"
        )));
    }
    Ok(())
}

fn check_value(name: &str, value: &str) -> Result<(), BusError> {
    if value.len() > MAX_HEADER_VALUE_BYTES {
        return Err(invalid(format!(
            "value of header {name:?} is {} bytes; use at most {MAX_HEADER_VALUE_BYTES}",
            value.len()
        )));
    }
    if let Some(bad) = value.chars().find(|c| c.is_control()) {
        return Err(invalid(format!(
            "value of header {name:?} contains the control character {bad:?}; use printable text"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn refused(headers: &mut Headers, name: &str, value: &str) -> String {
        match headers.insert(name, value) {
            Err(BusError::InvalidArgument { field, reason }) => {
                assert_eq!(field, "headers");
                reason
            }
            other => panic!("{name:?}={value:?} accepted: {other:?}"),
        }
    }

    #[test]
    fn names_are_checked() {
        let mut headers = Headers::new();
        assert!(refused(&mut headers, "", "v").contains("empty"));
        assert!(refused(&mut headers, "a b", "v").contains("' '"));
        assert!(refused(&mut headers, "ñame", "v").contains("ASCII"));
        assert!(refused(&mut headers, &"n".repeat(65), "v").contains("65 bytes"));
        for reserved in [
            "bus-uid",
            "Bus-Tag",
            "BUS-KEY",
            "Nats-Msg-Id",
            "nats-expected-x",
        ] {
            assert!(refused(&mut headers, reserved, "v").contains("reserved"));
        }
        headers.insert("n".repeat(64), "v").unwrap();
        headers.insert("busy", "v").unwrap();
        headers.insert("Trace-Id", "v").unwrap();
        assert!(refused(&mut headers, "trace-id", "v").contains("case"));
        assert_eq!(headers.len(), 3, "a refused header changes nothing");
    }

    #[test]
    fn values_and_totals_are_checked() {
        let mut headers = Headers::new();
        assert!(refused(&mut headers, "a", "x\ny").contains("control"));
        assert!(refused(&mut headers, "a", &"v".repeat(1025)).contains("1025 bytes"));
        headers.insert("a", "ünïcode text ok").unwrap();
        headers.insert("a", "").unwrap();
        assert_eq!(headers.get("a"), Some(""), "insert replaces");
        for i in 1..MAX_HEADERS {
            headers.insert(format!("h{i}"), "v").unwrap();
        }
        assert!(refused(&mut headers, "one-more", "v").contains("more than 16"));
        headers
            .insert("h1", "replacing is fine at the limit")
            .unwrap();
        let mut big = Headers::new();
        big.insert("a", "v".repeat(1000)).unwrap();
        big.insert("b", "v".repeat(1000)).unwrap();
        assert!(refused(&mut big, "c", &"v".repeat(100)).contains("use at most 2048"));
    }

    #[test]
    fn validate_catches_what_bypassed_insert() {
        let stored = Headers::from_stored([("bus-uid", "x")]);
        assert!(stored.validate().is_err());
        let decoded: Headers = serde_json::from_str(r#"{"a":"1","b":"2"}"#).unwrap();
        decoded.validate().unwrap();
        assert_eq!(decoded.iter().collect::<Vec<_>>(), [("a", "1"), ("b", "2")]);
    }
}
