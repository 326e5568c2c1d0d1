//! Percent-encoding, the one implementation every backend uses: URL
//! parameters and credentials, and header values that must keep every
//! byte (NATS trims spaces from header values).

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// Everything but RFC 3986's unreserved characters `[A-Za-z0-9-_.~]`.
const RESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Percent-encodes everything but `[A-Za-z0-9-_.~]` (upper-case hex).
#[must_use]
pub fn percent_encode(text: &str) -> String {
    utf8_percent_encode(text, RESERVED).to_string()
}

/// Reverses [`percent_encode`] (and decodes any `%XX`); `None` when a `%`
/// is not followed by two hex digits or the bytes are not UTF-8, so that a
/// malformed value is an error, never a different value.
#[must_use]
pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let well_formed = bytes.iter().enumerate().all(|(i, &byte)| {
        byte != b'%'
            || bytes
                .get(i + 1..i + 3)
                .is_some_and(|pair| pair.iter().all(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return None;
    }
    percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_keeps_unreserved() {
        for text in ["", "plain-_.~", " lead and trail ", "ü/€?&=%+", "a%b"] {
            assert_eq!(percent_decode(&percent_encode(text)).as_deref(), Some(text));
        }
        assert_eq!(percent_encode("a b/é"), "a%20b%2F%C3%A9");
        assert_eq!(percent_decode("t%40k").as_deref(), Some("t@k"));
    }

    #[test]
    fn malformed_is_none() {
        for text in ["%", "%4", "%zz", "%+A", "ok%2", "%FF"] {
            assert_eq!(percent_decode(text), None, "{text}");
        }
    }
}
