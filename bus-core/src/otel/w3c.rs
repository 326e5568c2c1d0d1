//! The W3C Trace Context header formats (`traceparent`, `tracestate`),
//! written and read here rather than through a propagator: the record's
//! headers are the carrier, the format is fixed by the W3C recommendation,
//! and the API crate has no W3C propagator of its own (the SDK's would pull
//! the SDK into every build with the feature).

use std::str::FromStr as _;

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

/// The header the W3C trace context's parent travels in.
pub const TRACEPARENT: &str = "traceparent";
/// The header vendor-specific trace state travels in.
pub const TRACESTATE: &str = "tracestate";

/// Why a `traceparent` value was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// `version-traceid-parentid-flags` of `span`, version 00, only the sampled
/// flag carried (as the W3C recommendation asks of version 00 writers).
pub fn traceparent(span: &SpanContext) -> String {
    let flags = span.trace_flags() & TraceFlags::SAMPLED;
    format!(
        "00-{:032x}-{:016x}-{:02x}",
        span.trace_id(),
        span.span_id(),
        flags
    )
}

/// The span context a `traceparent` (and `tracestate`, when there is one)
/// names, marked remote. A `tracestate` that does not parse is dropped
/// (the recommendation: the parent stays valid without it).
pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Result<SpanContext, Malformed> {
    if !traceparent.is_ascii() {
        return Err(Malformed("not ASCII"));
    }
    let bytes = traceparent.as_bytes();
    if bytes.len() < 55 {
        return Err(Malformed("shorter than the 55 characters of version 00"));
    }
    let version =
        hex_field(&traceparent[0..2]).ok_or(Malformed("version is not 2 lowercase hex digits"))?;
    if version == "ff" {
        return Err(Malformed("version ff is invalid"));
    }
    if bytes.len() > 55 && (version == "00" || bytes[55] != b'-') {
        return Err(Malformed("longer than version 00 allows"));
    }
    if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
        return Err(Malformed("fields are not separated by '-'"));
    }
    let trace_id = hex_field(&traceparent[3..35])
        .ok_or(Malformed("trace-id is not 32 lowercase hex digits"))?;
    let span_id = hex_field(&traceparent[36..52])
        .ok_or(Malformed("parent-id is not 16 lowercase hex digits"))?;
    let flags = hex_field(&traceparent[53..55])
        .ok_or(Malformed("trace-flags are not 2 lowercase hex digits"))?;
    let trace_id = TraceId::from_hex(trace_id).map_err(|_| Malformed("trace-id is not hex"))?;
    let span_id = SpanId::from_hex(span_id).map_err(|_| Malformed("parent-id is not hex"))?;
    let flags = u8::from_str_radix(flags, 16).map_err(|_| Malformed("trace-flags are not hex"))?;
    if trace_id == TraceId::INVALID {
        return Err(Malformed("trace-id is all zeros"));
    }
    if span_id == SpanId::INVALID {
        return Err(Malformed("parent-id is all zeros"));
    }
    let state = tracestate
        .and_then(|state| TraceState::from_str(state).ok())
        .unwrap_or_default();
    Ok(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        state,
    ))
}

/// `field` when it is all lowercase hex digits (the recommendation refuses
/// upper case) and not empty.
fn hex_field(field: &str) -> Option<&str> {
    (!field.is_empty()
        && field
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then_some(field)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_written_traceparent_reads_back() {
        let span = parse(GOOD, Some("congo=t61rcWkgMzE")).unwrap();
        assert!(span.is_valid() && span.is_remote() && span.is_sampled());
        assert_eq!(span.trace_state().get("congo"), Some("t61rcWkgMzE"));
        assert_eq!(traceparent(&span), GOOD);
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
            "0é-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(parse(bad, None).is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_version_00_prefix() {
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        assert!(parse(later, None).unwrap().is_valid());
    }

    #[test]
    fn a_bad_tracestate_is_dropped_and_the_parent_kept() {
        let span = parse(GOOD, Some("not a state ,,, =")).unwrap();
        assert!(span.is_valid());
        assert_eq!(span.trace_state().header(), "");
    }
}
