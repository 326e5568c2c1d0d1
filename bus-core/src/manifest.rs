//! The topic manifest: what a bus provisions before use (contract C1).

use serde::{Deserialize, Serialize};

use crate::BusError;
use crate::cold_spec::ColdSpec;

/// Largest partition count a topic may have.
pub const MAX_PARTITIONS: u32 = 1024;
/// Default `max_record_bytes`: 1 MiB.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 1024 * 1024;
/// Upper bound on `max_record_bytes`: 64 MiB.
pub const MAX_RECORD_BYTES_LIMIT: u64 = 64 * 1024 * 1024;
/// Default dedup window: two minutes (JetStream's default duplicate window).
pub const DEFAULT_DEDUP_WINDOW_MS: u64 = 120_000;

/// Topics to provision, in TOML or JSON. Unknown fields are rejected.
///
/// ```
/// let manifest = bus_core::Manifest::from_toml_str(r#"
///     [[topics]]
///     name = "audit"
///     partitions = 4
///     retention_ms = 604800000
/// "#).unwrap();
/// assert_eq!(manifest.topics[0].partitions, 4);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The topics, each named once.
    #[serde(default)]
    pub topics: Vec<TopicSpec>,
}

/// One topic of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicSpec {
    /// `[A-Za-z0-9._-]{1,200}`, never `.` or `..`.
    pub name: String,
    /// Number of partitions, `1..=1024`.
    pub partitions: u32,
    /// Records older than this are expired; `None` keeps them forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<u64>,
    /// How long a UID is remembered at least (backends may remember longer).
    #[serde(default = "default_dedup_window_ms")]
    pub dedup_window_ms: u64,
    /// Largest accepted value, in bytes of its JSON encoding.
    #[serde(default = "default_max_record_bytes")]
    pub max_record_bytes: u64,
    /// Copies kept by replicated backends (ignored by the embedded log).
    #[serde(default = "default_replication_factor")]
    pub replication_factor: u16,
    /// How the embedded log stores this topic's frames (see
    /// [`Compression`]). Only the embedded log honours it; the NATS, Kafka
    /// and PostgreSQL backends ignore it, as the embedded log ignores
    /// `replication_factor`.
    #[serde(default, skip_serializing_if = "Compression::is_none")]
    pub compression: Compression,
    /// Where history below the hot log is kept and for how long (C24;
    /// see [`ColdSpec`]). `None`: no cold tier is declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold: Option<ColdSpec>,
}

/// Frame compression of a topic, like Kafka's `compression.type`: in a
/// manifest `"none"` (the default), `"lz4"` or `"zstd"`.
///
/// It may change on an existing topic: it applies to what is written from
/// then on, and every frame says how it is stored, so records written
/// under another setting stay readable.
///
/// ```
/// let manifest = bus_core::Manifest::from_toml_str(r#"
///     [[topics]]
///     name = "audit"
///     partitions = 1
///     compression = "zstd"
/// "#).unwrap();
/// assert_eq!(manifest.topics[0].compression, bus_core::Compression::Zstd);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Records are stored as they are.
    #[default]
    None,
    /// LZ4 block compression: fast, a smaller gain.
    Lz4,
    /// Zstandard at its default level: a larger gain, slower.
    Zstd,
}

impl Compression {
    /// Whether records are stored uncompressed.
    pub fn is_none(&self) -> bool {
        *self == Self::None
    }

    /// The name used in manifests.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn default_dedup_window_ms() -> u64 {
    DEFAULT_DEDUP_WINDOW_MS
}
fn default_max_record_bytes() -> u64 {
    DEFAULT_MAX_RECORD_BYTES
}
fn default_replication_factor() -> u16 {
    1
}

impl TopicSpec {
    /// A topic with `partitions` partitions and every other property at its default.
    pub fn new(name: impl Into<String>, partitions: u32) -> Self {
        Self {
            name: name.into(),
            partitions,
            retention_ms: None,
            dedup_window_ms: DEFAULT_DEDUP_WINDOW_MS,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            replication_factor: 1,
            compression: Compression::None,
            cold: None,
        }
    }

    /// Declares the topic's cold tier (see [`ColdSpec`]).
    #[must_use]
    pub fn with_cold(mut self, cold: ColdSpec) -> Self {
        self.cold = Some(cold);
        self
    }

    /// Sets the frame compression (honoured by the embedded log only).
    #[must_use]
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// Sets the replication factor (broker backends; 3 on a three-node cluster).
    #[must_use]
    pub fn with_replication_factor(mut self, replication_factor: u16) -> Self {
        self.replication_factor = replication_factor;
        self
    }

    /// Sets the retention.
    #[must_use]
    pub fn with_retention_ms(mut self, retention_ms: u64) -> Self {
        self.retention_ms = Some(retention_ms);
        self
    }

    /// Sets the record-size limit.
    #[must_use]
    pub fn with_max_record_bytes(mut self, max_record_bytes: u64) -> Self {
        self.max_record_bytes = max_record_bytes;
        self
    }

    /// Sets the dedup window.
    #[must_use]
    pub fn with_dedup_window_ms(mut self, dedup_window_ms: u64) -> Self {
        self.dedup_window_ms = dedup_window_ms;
        self
    }

    /// Checks every field; `field` prefixes the names in errors.
    pub fn validate_as(&self, field: &str) -> Result<(), BusError> {
        validate_topic_name(&self.name)
            .map_err(|reason| BusError::invalid(format!("{field}.name"), reason))?;
        if self.partitions == 0 || self.partitions > MAX_PARTITIONS {
            return Err(BusError::invalid(
                format!("{field}.partitions"),
                format!(
                    "{} for topic {:?}; use 1..={MAX_PARTITIONS}",
                    self.partitions, self.name
                ),
            ));
        }
        if self.retention_ms == Some(0) {
            return Err(BusError::invalid(
                format!("{field}.retention_ms"),
                format!(
                    "0 for topic {:?}; omit it to keep records forever",
                    self.name
                ),
            ));
        }
        if self.dedup_window_ms == 0 {
            return Err(BusError::invalid(
                format!("{field}.dedup_window_ms"),
                format!("0 for topic {:?}; use at least 1", self.name),
            ));
        }
        if self.max_record_bytes == 0 || self.max_record_bytes > MAX_RECORD_BYTES_LIMIT {
            return Err(BusError::invalid(
                format!("{field}.max_record_bytes"),
                format!(
                    "{} for topic {:?}; use 1..={MAX_RECORD_BYTES_LIMIT}",
                    self.max_record_bytes, self.name
                ),
            ));
        }
        if self.replication_factor == 0 {
            return Err(BusError::invalid(
                format!("{field}.replication_factor"),
                format!("0 for topic {:?}; use at least 1", self.name),
            ));
        }
        if let Some(cold) = &self.cold {
            cold.validate_as(&format!("{field}.cold"), &self.name)?;
        }
        Ok(())
    }

    /// The first property in which `existing` differs from `self`, as a
    /// [`BusError::Conflict`] naming both values and the fix. `compression`
    /// is not compared: it may change on an existing topic; nor is the cold
    /// tier's retention, or a cold section one side lacks (a tier may be
    /// added; a manifest without one leaves an attached tier be). A cold
    /// location differing from the existing one is a conflict: the history
    /// already archived there would be cut off.
    pub fn conflict_with(&self, existing: &TopicSpec) -> Result<(), BusError> {
        let differs = |property: &str, have: String, want: String| {
            Err(BusError::Conflict {
                topic: self.name.clone(),
                property: property.to_owned(),
                existing: have,
                requested: want,
                fix: "change the manifest to match, or delete the topic and provision it again (its records would be lost)"
                    .to_owned(),
            })
        };
        let show = |retention: Option<u64>| {
            retention.map_or_else(|| "forever".to_owned(), |ms| format!("{ms} ms"))
        };
        if self.partitions != existing.partitions {
            return differs(
                "partitions",
                existing.partitions.to_string(),
                self.partitions.to_string(),
            );
        }
        if self.retention_ms != existing.retention_ms {
            return differs(
                "retention_ms",
                show(existing.retention_ms),
                show(self.retention_ms),
            );
        }
        if self.dedup_window_ms != existing.dedup_window_ms {
            return differs(
                "dedup_window_ms",
                existing.dedup_window_ms.to_string(),
                self.dedup_window_ms.to_string(),
            );
        }
        if self.max_record_bytes != existing.max_record_bytes {
            return differs(
                "max_record_bytes",
                existing.max_record_bytes.to_string(),
                self.max_record_bytes.to_string(),
            );
        }
        if self.replication_factor != existing.replication_factor {
            return differs(
                "replication_factor",
                existing.replication_factor.to_string(),
                self.replication_factor.to_string(),
            );
        }
        if let (Some(want), Some(have)) = (&self.cold, &existing.cold)
            && want.location != have.location
        {
            return differs(
                "cold.location",
                have.location.clone(),
                want.location.clone(),
            );
        }
        Ok(())
    }
}

impl Manifest {
    /// A manifest of the given topics (not yet validated).
    pub fn new(topics: impl IntoIterator<Item = TopicSpec>) -> Self {
        Self {
            topics: topics.into_iter().collect(),
        }
    }

    /// Parses TOML and validates.
    pub fn from_toml_str(text: &str) -> Result<Self, BusError> {
        let manifest: Self = toml::from_str(text).map_err(|error| {
            // toml's Display draws a multi-line excerpt; errors stay on one line.
            let at = error.span().map_or_else(String::new, |span| {
                let before = text.get(..span.start).unwrap_or(text);
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!(" at line {line}, column {column}")
            });
            let message = error.message().trim().replace('\n', "; ");
            BusError::invalid(
                "manifest",
                format!("not a valid TOML manifest{at}: {message}"),
            )
        })?;
        manifest.validate()?;
        Ok(manifest)
    }

    /// Parses JSON and validates.
    pub fn from_json_str(text: &str) -> Result<Self, BusError> {
        let manifest: Self = serde_json::from_str(text).map_err(|error| {
            BusError::invalid("manifest", format!("not a valid JSON manifest: {error}"))
        })?;
        manifest.validate()?;
        Ok(manifest)
    }

    /// Parses JSON when the text starts with `{`, TOML otherwise.
    pub fn parse(text: &str) -> Result<Self, BusError> {
        if text.trim_start().starts_with('{') {
            Self::from_json_str(text)
        } else {
            Self::from_toml_str(text)
        }
    }

    /// Checks every topic and that no name repeats.
    pub fn validate(&self) -> Result<(), BusError> {
        let mut seen = std::collections::HashSet::new();
        for (index, topic) in self.topics.iter().enumerate() {
            let field = format!("topics[{index}]");
            topic.validate_as(&field)?;
            if !seen.insert(topic.name.as_str()) {
                return Err(BusError::invalid(
                    format!("{field}.name"),
                    format!(
                        "topic {:?} is listed twice; list each topic once",
                        topic.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The topic named `name`, if listed.
    pub fn topic(&self, name: &str) -> Option<&TopicSpec> {
        self.topics.iter().find(|topic| topic.name == name)
    }

    /// For a bus that keeps no cold tier itself (`who`: "the NATS
    /// backend"): the first topic that declares one, as
    /// [`BusError::InvalidArgument`] on `topics[i].cold` saying how to keep
    /// it (C24: a declared tier is never ignored).
    pub fn refuse_cold(&self, who: &str) -> Result<(), BusError> {
        match self.topics.iter().position(|topic| topic.cold.is_some()) {
            None => Ok(()),
            Some(index) => Err(BusError::invalid(
                format!("topics[{index}].cold"),
                format!(
                    "topic {:?} declares a cold tier, which {who} does not keep itself; \
                     open the bus through bus::cold::ColdBus (bus::open does, with feature cold), \
                     or remove the section",
                    self.topics[index].name
                ),
            )),
        }
    }

    /// The manifest with every cold section removed: what a wrapper that
    /// keeps the tiers itself (`bus_cold::ColdBus`) hands the backend it wraps.
    #[must_use]
    pub fn without_cold(&self) -> Self {
        Self::new(self.topics.iter().cloned().map(|mut topic| {
            topic.cold = None;
            topic
        }))
    }
}

/// Why a name (a topic, a stream prefix) is not acceptable, and what
/// would be; callers turn it into [`BusError::InvalidArgument`] on their
/// own field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidName(pub String);

impl From<InvalidName> for String {
    fn from(error: InvalidName) -> Self {
        error.0
    }
}

/// Checks a topic name: `[A-Za-z0-9._-]{1,200}`, never `.` or `..` (names
/// become file names, stream names and Kafka topics). Returns why not.
pub fn validate_topic_name(name: &str) -> Result<(), InvalidName> {
    if name.is_empty() {
        return Err(InvalidName(
            "topic name is empty; use 1 to 200 of [A-Za-z0-9._-]".to_owned(),
        ));
    }
    if name.len() > 200 {
        return Err(InvalidName(format!(
            "topic name is {} bytes long; use at most 200 of [A-Za-z0-9._-]",
            name.len()
        )));
    }
    if name == "." || name == ".." {
        return Err(InvalidName(format!(
            "topic name {name:?} is reserved; pick another"
        )));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(InvalidName(format!(
            "topic name {name:?} contains {bad:?}; use only [A-Za-z0-9._-]"
        )));
    }
    Ok(())
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
    fn toml_and_json_agree() {
        let toml = Manifest::from_toml_str(
            "[[topics]]\nname = \"a\"\npartitions = 3\nretention_ms = 1000\n",
        )
        .unwrap();
        let json = Manifest::from_json_str(
            r#"{"topics":[{"name":"a","partitions":3,"retention_ms":1000}]}"#,
        )
        .unwrap();
        assert_eq!(toml, json);
        assert_eq!(toml.topics[0].max_record_bytes, DEFAULT_MAX_RECORD_BYTES);
        assert_eq!(toml.topics[0].dedup_window_ms, DEFAULT_DEDUP_WINDOW_MS);
    }

    #[test]
    fn toml_errors_are_one_line_with_their_position() {
        let error = Manifest::parse("[[topics]]\nname = \"a\"\npartitions = 1\npartitons = 2\n")
            .unwrap_err()
            .to_string();
        assert!(!error.contains('\n'), "{error}");
        assert!(error.contains("line 4"), "{error}");
    }

    #[test]
    fn unknown_fields_are_rejected_and_named() {
        let error = Manifest::parse("[[topics]]\nname = \"a\"\npartitions = 1\npartitons = 2\n")
            .unwrap_err();
        match error {
            BusError::InvalidArgument { reason, .. } => assert!(reason.contains("partitons")),
            other => panic!("{other:?}"),
        }
        assert!(Manifest::parse(r#"{"topics":[],"extra":1}"#).is_err());
    }

    #[test]
    fn bad_values_name_their_field() {
        let bad = |spec: TopicSpec| field_of(Manifest::new([spec]).validate().unwrap_err());
        assert_eq!(bad(TopicSpec::new("a", 0)), "topics[0].partitions");
        assert_eq!(bad(TopicSpec::new("a", 1025)), "topics[0].partitions");
        assert_eq!(bad(TopicSpec::new("", 1)), "topics[0].name");
        assert_eq!(bad(TopicSpec::new("..", 1)), "topics[0].name");
        assert_eq!(bad(TopicSpec::new("a/b", 1)), "topics[0].name");
        assert_eq!(bad(TopicSpec::new("x".repeat(201), 1)), "topics[0].name");
        assert_eq!(
            bad(TopicSpec::new("a", 1).with_max_record_bytes(0)),
            "topics[0].max_record_bytes"
        );
        assert_eq!(
            bad(TopicSpec::new("a", 1).with_retention_ms(0)),
            "topics[0].retention_ms"
        );
        let twice = Manifest::new([TopicSpec::new("a", 1), TopicSpec::new("a", 2)]);
        assert_eq!(field_of(twice.validate().unwrap_err()), "topics[1].name");
    }

    #[test]
    fn legal_names_pass() {
        for name in ["a", "A", "a.0", "a_0", "a-0", "...", &"z".repeat(200)] {
            validate_topic_name(name).unwrap();
        }
    }

    #[test]
    fn conflict_names_property_and_both_values() {
        let want = TopicSpec::new("t", 4);
        let have = TopicSpec::new("t", 2);
        match want.conflict_with(&have).unwrap_err() {
            BusError::Conflict {
                topic,
                property,
                existing,
                requested,
                ..
            } => {
                assert_eq!(
                    (
                        topic.as_str(),
                        property.as_str(),
                        existing.as_str(),
                        requested.as_str()
                    ),
                    ("t", "partitions", "2", "4")
                );
            }
            other => panic!("{other:?}"),
        }
        want.conflict_with(&want.clone()).unwrap();
    }

    #[test]
    fn compression_is_named_in_lowercase_and_omitted_when_none() {
        let manifest =
            Manifest::parse("[[topics]]\nname = \"a\"\npartitions = 1\ncompression = \"lz4\"\n")
                .unwrap();
        assert_eq!(manifest.topics[0].compression, Compression::Lz4);
        let json =
            Manifest::parse(r#"{"topics":[{"name":"a","partitions":1,"compression":"zstd"}]}"#)
                .unwrap();
        assert_eq!(json.topics[0].compression, Compression::Zstd);
        let plain = TopicSpec::new("a", 1);
        assert_eq!(plain.compression, Compression::None);
        let text = serde_json::to_string(&plain).unwrap();
        assert!(!text.contains("compression"), "{text}");
        let zstd =
            serde_json::to_string(&plain.clone().with_compression(Compression::Zstd)).unwrap();
        assert!(zstd.contains(r#""compression":"zstd""#), "{zstd}");
    }

    #[test]
    fn an_unknown_compression_is_an_argument_error() {
        for text in [
            "[[topics]]\nname = \"a\"\npartitions = 1\ncompression = \"gzip\"\n",
            r#"{"topics":[{"name":"a","partitions":1,"compression":"LZ4"}]}"#,
        ] {
            match Manifest::parse(text).unwrap_err() {
                BusError::InvalidArgument { field, reason } => {
                    assert_eq!(field, "manifest");
                    assert!(
                        reason.contains("compression") || reason.contains("variant"),
                        "{reason}"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn compression_may_change_without_conflict() {
        let have = TopicSpec::new("t", 2);
        let want = have.clone().with_compression(Compression::Zstd);
        want.conflict_with(&have).unwrap();
        have.conflict_with(&want).unwrap();
    }
}
