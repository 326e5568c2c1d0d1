//! The raw read path beside the trait: records as stored, their frames'
//! checksums and (under a control key) their tags verified, the values
//! not parsed. For callers that forward or hash records, which would
//! otherwise pay for a `serde_json::Value` they never look into.

use bus_core::{BusError, Headers};

use crate::EmbeddedBus;

/// One stored record with its value as the bytes stored (the JSON text
/// the bus wrote at publish). Its frame's CRC-32C and, when the bus has a
/// control key, its tag were verified before it was returned; the value
/// was not parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredBytes {
    /// Partition index.
    pub partition: u32,
    /// Partition-local offset.
    pub offset: u64,
    /// Partition key.
    pub key: String,
    /// The value's JSON text as stored.
    pub value: Vec<u8>,
    /// Append time (epoch ms).
    pub stored_at: u64,
    /// The record's headers (C25).
    pub headers: Headers,
}

impl EmbeddedBus {
    /// Up to `max` records of `topic`/`partition` from `offset` on, as
    /// stored: the same records, order and errors as
    /// [`fetch_with_headers`](bus_core::EventBus::fetch_with_headers)
    /// (a record whose tag fails ends the page, or is the error when it is
    /// the first), without parsing the values.
    ///
    /// Reads the hot log only: with a cold tier attached, an offset below
    /// the hot log start is [`BusError::Unsupported`] (fetch it with
    /// `fetch`, which reads the tier).
    ///
    /// ```
    /// use bus_core::{EventBus, Manifest, TopicSpec};
    /// # let dir = tempfile::tempdir()?;
    /// let bus = bus_embedded::EmbeddedBus::open(dir.path())?;
    /// bus.provision(&Manifest::new([TopicSpec::new("audit", 1)]))?;
    /// bus.publish("audit", "k", &serde_json::json!({"n": 1}))?;
    /// let raw = bus.fetch_raw("audit", 0, 0, 100)?;
    /// assert_eq!(raw[0].value, br#"{"n":1}"#);
    /// # Ok::<(), bus_core::BusError>(())
    /// ```
    pub fn fetch_raw(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredBytes>, BusError> {
        let entry = self.inner.topic(topic)?;
        let spec = &entry.spec;
        bus_core::backend::check_partition(&spec.name, partition, spec.partitions)?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let part = self.inner.readable(&spec.name, partition)?;
        #[cfg(feature = "cold")]
        if offset < part.offsets().first && crate::cold::has_tier(&part)? {
            return Err(BusError::Unsupported {
                operation: format!(
                    "fetch_raw of {topic:?} partition {partition} at {offset} (below the hot \
                     log start {}, in the cold tier: fetch reads it)",
                    part.offsets().first
                ),
                backend: "embedded".to_owned(),
            });
        }
        part.fetch_as(
            offset,
            max,
            self.inner.auth().as_ref(),
            crate::partition::Partition::raw_record,
        )
    }
}
