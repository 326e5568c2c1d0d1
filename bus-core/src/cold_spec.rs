//! A topic's cold tier as its manifest declares it (contract C24): where
//! history below the hot log is kept, and for how long.

use serde::{Deserialize, Serialize};

use crate::BusError;

/// The `[topics.cold]` section of a manifest.
///
/// ```
/// let manifest = bus_core::Manifest::from_toml_str(r#"
///     [[topics]]
///     name = "audit"
///     partitions = 1
///     retention_ms = 604800000          # a week hot
///     [topics.cold]
///     location = "s3://bus-audit/prod?endpoint=http://127.0.0.1:8333"
///     retention_ms = 94608000000        # three years cold
/// "#).unwrap();
/// let cold = manifest.topics[0].cold.as_ref().unwrap();
/// assert_eq!(cold.retention_ms, Some(94_608_000_000));
/// ```
///
/// Which backend honours it: the embedded log built with its `cold`
/// feature archives, reads and expires through it itself; the broker
/// backends keep it through `bus_cold::ColdBus` (the facade's `open` wraps
/// them when `bus` is built with feature `cold`). A backend that cannot
/// keep it refuses the manifest ([`Manifest::refuse_cold`](crate::Manifest::refuse_cold)):
/// a declared tier is never silently ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColdSpec {
    /// `file:///DIR`, `s3://BUCKET/PREFIX?endpoint=URL&region=R` or
    /// `memory:` (see `bus_cold::ColdLocation::parse`). Never credentials:
    /// S3 keys come from the environment.
    pub location: String,
    /// Cold objects whose newest record was stored longer ago than this are
    /// deleted by `maintenance`; `None` keeps cold history forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<u64>,
}

impl ColdSpec {
    /// A tier at `location`, kept forever.
    pub fn new(location: impl Into<String>) -> Self {
        Self {
            location: location.into(),
            retention_ms: None,
        }
    }

    /// Sets how long cold history is kept.
    #[must_use]
    pub fn with_retention_ms(mut self, retention_ms: u64) -> Self {
        self.retention_ms = Some(retention_ms);
        self
    }

    /// Checks the section (`field` is `topics[i].cold`). The location's
    /// full syntax is checked where it is opened; here only what needs no
    /// cold tier crate: present, and free of credentials (which would
    /// otherwise sit in a manifest file and in error messages).
    pub fn validate_as(&self, field: &str, topic: &str) -> Result<(), BusError> {
        let location = self.location.trim();
        if location.is_empty() {
            return Err(BusError::invalid(
                format!("{field}.location"),
                format!("empty for topic {topic:?}; use file:///DIR or s3://BUCKET/PREFIX"),
            ));
        }
        let (before_query, query) = location.split_once('?').unwrap_or((location, ""));
        let authority = before_query
            .split_once("://")
            .map_or("", |(_, rest)| rest.split('/').next().unwrap_or(""));
        let query = query.to_ascii_lowercase();
        if authority.contains('@') || query.contains("secret") || query.contains("password") {
            // The location itself is not repeated: it holds the secret.
            return Err(BusError::invalid(
                format!("{field}.location"),
                format!(
                    "carries credentials for topic {topic:?}; remove them and set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                ),
            ));
        }
        if self.retention_ms == Some(0) {
            return Err(BusError::invalid(
                format!("{field}.retention_ms"),
                format!("0 for topic {topic:?}; omit it to keep cold history forever"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn field_of(error: BusError) -> String {
        match error {
            BusError::InvalidArgument { field, .. } => field,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn a_plain_location_passes() {
        ColdSpec::new("s3://bucket/prefix?endpoint=http://127.0.0.1:8333&region=eu")
            .with_retention_ms(1)
            .validate_as("topics[0].cold", "audit")
            .unwrap();
        ColdSpec::new("file:///var/lib/bus-cold")
            .validate_as("topics[0].cold", "audit")
            .unwrap();
    }

    #[test]
    fn empty_location_and_zero_retention_name_their_field() {
        let empty = ColdSpec::new(" ").validate_as("topics[2].cold", "audit");
        assert_eq!(field_of(empty.unwrap_err()), "topics[2].cold.location");
        let zero = ColdSpec::new("memory:")
            .with_retention_ms(0)
            .validate_as("topics[0].cold", "audit");
        assert_eq!(field_of(zero.unwrap_err()), "topics[0].cold.retention_ms");
    }

    fn topic(location: &str) -> crate::TopicSpec {
        crate::TopicSpec::new("audit", 1).with_cold(ColdSpec::new(location))
    }

    #[test]
    fn a_manifest_declares_where_and_how_long() {
        let manifest = crate::Manifest::from_toml_str(
            r#"
            [[topics]]
            name = "audit"
            partitions = 1
            [topics.cold]
            location = "file:///var/lib/cold"
            retention_ms = 1000

            [[topics]]
            name = "plain"
            partitions = 1
        "#,
        )
        .unwrap();
        assert_eq!(
            manifest.topics[0].cold,
            Some(ColdSpec::new("file:///var/lib/cold").with_retention_ms(1000))
        );
        assert_eq!(manifest.topics[1].cold, None);
        // Written back, a topic without a tier says nothing of one.
        let json = serde_json::to_string(&manifest.topics[1]).unwrap();
        assert!(!json.contains("cold"), "{json}");
        let toml = toml::to_string(&manifest).unwrap();
        assert_eq!(
            crate::Manifest::from_toml_str(&toml).unwrap(),
            manifest,
            "{toml}"
        );
        let unknown = crate::Manifest::from_toml_str(
            "[[topics]]\nname = \"a\"\npartitions = 1\n[topics.cold]\nlocation = \"memory:\"\nbucket = \"b\"\n",
        );
        assert!(
            matches!(unknown, Err(BusError::InvalidArgument { .. })),
            "{unknown:?}"
        );
        let bad = crate::Manifest::new([topic("")]).validate().unwrap_err();
        assert_eq!(field_of(bad), "topics[0].cold.location");
    }

    #[test]
    fn only_a_changed_location_conflicts() {
        let have = topic("file:///a");
        let moved = topic("file:///b").conflict_with(&have).unwrap_err();
        match moved {
            BusError::Conflict {
                property,
                existing,
                requested,
                ..
            } => {
                assert_eq!(property, "cold.location");
                assert_eq!(
                    (existing.as_str(), requested.as_str()),
                    ("file:///a", "file:///b")
                );
            }
            other => panic!("expected Conflict, got {other:?}"),
        }
        let longer = crate::TopicSpec::new("audit", 1)
            .with_cold(ColdSpec::new("file:///a").with_retention_ms(5));
        longer.conflict_with(&have).unwrap();
        crate::TopicSpec::new("audit", 1)
            .conflict_with(&have)
            .unwrap();
        have.conflict_with(&crate::TopicSpec::new("audit", 1))
            .unwrap();
    }

    #[test]
    fn a_bus_without_a_tier_refuses_a_declared_one() {
        let manifest = crate::Manifest::new([crate::TopicSpec::new("plain", 1), topic("memory:")]);
        let error = manifest.refuse_cold("the memory backend").unwrap_err();
        let shown = error.to_string();
        assert!(
            shown.contains("the memory backend") && shown.contains("ColdBus"),
            "{shown}"
        );
        assert_eq!(field_of(error), "topics[1].cold");
        let stripped = manifest.without_cold();
        stripped.refuse_cold("the memory backend").unwrap();
        assert_eq!(stripped.topics.len(), 2);
        assert_eq!(stripped.topics[1].name, "audit");
    }

    #[test]
    fn credentials_are_refused_without_being_repeated() {
        for location in [
            "s3://AKIAEXAMPLE:hunter2@bucket/prefix",
            "s3://bucket/prefix?endpoint=http://h:1&Secret_Access_Key=hunter2",
            "s3://bucket?password=hunter2",
        ] {
            let error = ColdSpec::new(location)
                .validate_as("topics[0].cold", "audit")
                .unwrap_err();
            let shown = error.to_string();
            assert!(!shown.contains("hunter2"), "secret shown: {shown}");
            assert_eq!(field_of(error), "topics[0].cold.location");
        }
    }
}
