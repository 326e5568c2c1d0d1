//! The bus cold tier (contract rule C24, issue #30): a partition's sealed
//! history copied into immutable objects in object storage and read back
//! with the same offsets, values, `stored_at` and tags, gap-free.
//!
//! - [`mod@format`]: the object format (CRC-32C per frame, an index per object,
//!   each record's HMAC tag kept).
//! - `store`: the layout — segment objects and per-generation manifest
//!   objects, all written with `PutMode::Create`; an object counts only once
//!   a manifest lists it.
//! - [`ColdTier`]: the blocking facade every backend can call (its futures
//!   run on a [`ConnectorExecutor`], so it works from any thread, C9, with
//!   bounded waits, C10).
//!
//! ```
//! use bus_cold::{ColdLocation, ColdRecord, ColdTier};
//! let tier = ColdTier::open(&ColdLocation::Memory).unwrap();
//! let records: Vec<ColdRecord> = (0..3)
//!     .map(|offset| ColdRecord { offset, stored_at: 1_000 + offset, key: "k".into(),
//!         uid: None, value: b"{\"n\":1}".to_vec(), tag: None, headers: Default::default() })
//!     .collect();
//! tier.archive_records("orders", 0, &records).unwrap();
//! assert_eq!(tier.archive_records("orders", 0, &records).unwrap(), 0); // idempotent
//! let back = tier.read("orders", 0, 1, 10).unwrap();
//! assert_eq!(back, records[1..]);
//! ```

mod bus;
pub mod format;
mod location;
mod store;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bus_core::auth::{RecordAuth, RecordParts, TagFault};
use bus_core::backend::ConnectorExecutor;
use bus_core::{BusError, Compression, StoredEvent, StoredRecord};
use object_store::ObjectStore;
use object_store::path::Path as StorePath;

pub use bus::{ColdBus, ColdBusOptions};
pub use format::ColdRecord;
pub use location::{ColdLocation, S3Location, declared_locations};
use store::PartitionStore;
pub use store::{ArchivedRange, MANIFEST_FORMAT, Manifest};

/// Records per object when archiving: ~4096 small records make an object of
/// a few hundred KiB, few enough requests per second of history.
pub const DEFAULT_OBJECT_RECORDS: usize = 4096;

/// Manifests a read tries when the one it read lists a missing object.
const READ_ATTEMPTS: usize = 4;

/// Objects kept decoded-ready in memory by a reader (they never change).
const CACHED_OBJECTS: usize = 4;

/// An object's (topic, partition, first offset) and its bytes.
type CachedObject = ((String, u32, u64), Arc<Vec<u8>>);

/// A cold tier at one location.
pub struct ColdTier {
    location: String,
    store: Arc<dyn ObjectStore>,
    root: StorePath,
    executor: ConnectorExecutor,
    /// Recently read objects by (topic, partition, from).
    cache: Mutex<Vec<CachedObject>>,
    /// The last manifest read per (topic, partition). Archived ranges are
    /// immutable and only ever appended, so a read below its end needs no
    /// fresh listing; a read at or past it refreshes.
    manifests: Mutex<std::collections::HashMap<(String, u32), Arc<Manifest>>>,
    /// How new objects' frames are compressed.
    compression: Compression,
}

impl std::fmt::Debug for ColdTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColdTier")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

impl ColdTier {
    /// Opens the tier at `location` (nothing is read or written yet), with
    /// operations bounded by bus-core's default timeout.
    pub fn open(location: &ColdLocation) -> Result<Self, BusError> {
        Self::open_with_timeout(location, bus_core::backend::executor::DEFAULT_TIMEOUT)
    }

    /// Opens the tier at `location`; each store operation is bounded by `timeout`.
    pub fn open_with_timeout(location: &ColdLocation, timeout: Duration) -> Result<Self, BusError> {
        let (store, root) = location.open()?;
        Ok(Self {
            location: location.to_string(),
            store,
            root,
            executor: ConnectorExecutor::with_timeout("bus-cold", timeout)?,
            cache: Mutex::new(Vec::new()),
            manifests: Mutex::default(),
            compression: Compression::None,
        })
    }

    /// New objects compressed with `compression` (object format version 3;
    /// objects already written are read whatever they hold).
    #[must_use]
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// The location, as a manifest names it (no credentials).
    pub fn location(&self) -> &str {
        &self.location
    }

    fn partition(&self, topic: &str, partition: u32) -> Result<PartitionStore, BusError> {
        bus_core::backend::validate_topic(topic)?;
        Ok(PartitionStore {
            store: Arc::clone(&self.store),
            root: self.root.clone(),
            topic: topic.to_owned(),
            partition,
            compression: self.compression,
        })
    }

    fn run<T: Send + 'static, Fut>(&self, what: &str, work: Fut) -> Result<T, BusError>
    where
        Fut: Future<Output = Result<T, BusError>> + Send + 'static,
    {
        self.executor
            .run_bounded(what, self.executor.timeout(), move || work)?
    }

    /// The partition's current manifest.
    pub fn manifest(&self, topic: &str, partition: u32) -> Result<Manifest, BusError> {
        let part = self.partition(topic, partition)?;
        self.run("cold manifest", async move { part.manifest().await })
    }

    /// Checks that the location answers (the bucket exists, the endpoint is
    /// reachable, the credentials are accepted) by reading a manifest.
    pub fn check(&self) -> Result<(), BusError> {
        let part = self.partition("bus-cold-check", 0)?;
        self.run(
            "cold check",
            async move { part.manifest().await.map(|_| ()) },
        )
        .map_err(|error| match error {
            BusError::Unavailable { reason, source, .. } => BusError::Unavailable {
                backend: "cold".into(),
                reason: format!("cold tier {} does not answer: {reason}", self.location),
                source,
            },
            other => other,
        })
    }

    /// Archives `records` (consecutive offsets) as one object; records the
    /// tier already holds are skipped (C24: idempotent). Returns how many
    /// records were newly archived.
    pub fn archive_records(
        &self,
        topic: &str,
        partition: u32,
        records: &[ColdRecord],
    ) -> Result<u64, BusError> {
        self.archive_records_as(topic, partition, records, self.compression)
    }

    fn archive_records_as(
        &self,
        topic: &str,
        partition: u32,
        records: &[ColdRecord],
        compression: Compression,
    ) -> Result<u64, BusError> {
        let mut part = self.partition(topic, partition)?;
        part.compression = compression;
        let records = records.to_vec();
        self.run("cold archive", async move {
            // Another archiver may take a generation first: re-read and go on
            // from its end (a bounded number of times).
            for _ in 0..8 {
                let manifest = part.manifest().await?;
                let before = manifest.end();
                if manifest.ever_archived() && records.last().is_none_or(|r| r.offset < before) {
                    return Ok(0);
                }
                if let Some(next) = part.archive(&manifest, &records).await? {
                    return Ok(next.ranges.last().map_or(0, |r| r.end - r.from));
                }
                if records.is_empty() {
                    return Ok(0);
                }
            }
            Err(BusError::unavailable(
                "cold",
                "the manifest keeps changing under the archiver",
            ))
        })
    }

    /// Archives `[manifest end, end)` of a partition, reading the records
    /// with `read(from, max)` (the backend's raw read, tags included), in
    /// objects of up to `object_records`. Returns the records archived.
    pub fn archive_with(
        &self,
        topic: &str,
        partition: u32,
        end: u64,
        object_records: usize,
        read: impl FnMut(u64, usize) -> Result<Vec<ColdRecord>, BusError>,
    ) -> Result<u64, BusError> {
        let compression = self.compression;
        self.archive_with_compression(topic, partition, end, object_records, compression, read)
    }

    /// [`Self::archive_with`], new objects compressed with `compression`
    /// whatever the tier's own setting (the embedded log archives a topic
    /// as its spec compresses it).
    pub fn archive_with_compression(
        &self,
        topic: &str,
        partition: u32,
        end: u64,
        object_records: usize,
        compression: Compression,
        mut read: impl FnMut(u64, usize) -> Result<Vec<ColdRecord>, BusError>,
    ) -> Result<u64, BusError> {
        let mut archived = 0;
        let manifest = self.manifest(topic, partition)?;
        // A first archive starts wherever the hot log does (it may have
        // expired records before anything was archived).
        let mut first_archive = !manifest.ever_archived();
        let mut from = manifest.end();
        while from < end {
            let want = usize::try_from(end - from)
                .unwrap_or(usize::MAX)
                .min(object_records.max(1));
            let records = read(from, want)?;
            let Some(first) = records.first() else { break };
            if first_archive {
                from = first.offset;
                first_archive = false;
            }
            if first.offset != from {
                return Err(BusError::Corrupt {
                    location: format!("{topic}/{partition} (hot log, archiving)"),
                    offset: from,
                    reason: format!(
                        "the read from offset {from} began at {} (retention ran ahead of the archiver?)",
                        first.offset
                    ),
                });
            }
            let upto: Vec<_> = records.into_iter().take_while(|r| r.offset < end).collect();
            let count = upto.len() as u64;
            archived += self.archive_records_as(topic, partition, &upto, compression)?;
            from += count;
        }
        Ok(archived)
    }

    /// Cold retention of one partition: drops the oldest archived ranges
    /// whose newest record was stored before `cutoff_ms` (whole objects;
    /// the manifest first, then the objects). Reads below the new start
    /// begin at it, as after hot retention; what expired is never archived
    /// again. Returns the records expired.
    pub fn expire(&self, topic: &str, partition: u32, cutoff_ms: u64) -> Result<u64, BusError> {
        let part = self.partition(topic, partition)?;
        let expired = self.run("cold expire", async move {
            for _ in 0..8 {
                let manifest = part.manifest().await?;
                if let Some(expired) = part.expire(&manifest, cutoff_ms).await? {
                    return Ok(expired);
                }
            }
            Err(BusError::unavailable(
                "cold",
                "the manifest keeps changing under cold retention",
            ))
        })?;
        if expired > 0 {
            // Cached manifests and objects of the expired ranges go too.
            if let Ok(mut manifests) = self.manifests.lock() {
                manifests.remove(&(topic.to_owned(), partition));
            }
            if let Ok(mut cache) = self.cache.lock() {
                cache.retain(|((t, p, _), _)| !(t == topic && *p == partition));
            }
        }
        Ok(expired)
    }

    /// Up to `max` records from `from` on (from the first archived offset when
    /// below it), gap-free: a range the manifest lists whose object is
    /// missing or damaged is an error naming it, never skipped (C24).
    pub fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<ColdRecord>, BusError> {
        let part = self.partition(topic, partition)?;
        let key = (topic.to_owned(), partition);
        let cached = self
            .manifests
            .lock()
            .ok()
            .and_then(|m| m.get(&key).cloned())
            // Within a listed range: immutable. Below the first one, ranges
            // may have expired and others been added since: read afresh.
            .filter(|manifest| {
                manifest.start().is_some_and(|start| start <= from) && from < manifest.end()
            });
        if let Some(manifest) = cached {
            match self.read_listed(&part, &manifest, from, max) {
                Ok(records) => return Ok(records),
                // Cold retention may have expired a range since this
                // manifest was read (in another process): read it afresh,
                // and a damage that is real is named again below.
                Err(BusError::Corrupt { .. }) => {}
                Err(other) => return Err(other),
            }
        }
        let mut fresh = Arc::new(self.manifest(topic, partition)?);
        for _ in 0..READ_ATTEMPTS {
            if let Ok(mut manifests) = self.manifests.lock() {
                manifests.insert(key.clone(), Arc::clone(&fresh));
            }
            match self.read_listed(&part, &fresh, from, max) {
                // An object it lists is missing or damaged: if a newer
                // manifest says otherwise (cold retention expired it in the
                // meantime), read by that one; else the damage is real.
                Err(corrupt @ BusError::Corrupt { .. }) => {
                    let newer = self.manifest(topic, partition)?;
                    if newer.generation == fresh.generation {
                        return Err(corrupt);
                    }
                    fresh = Arc::new(newer);
                }
                other => return other,
            }
        }
        Err(BusError::unavailable(
            "cold",
            format!("{topic}/{partition}: the manifest kept changing under the read at {from}"),
        ))
    }

    /// [`Self::read`] of the ranges `manifest` lists.
    fn read_listed(
        &self,
        part: &PartitionStore,
        manifest: &Manifest,
        from: u64,
        max: usize,
    ) -> Result<Vec<ColdRecord>, BusError> {
        let mut out = Vec::new();
        let mut cursor = from.max(manifest.start().unwrap_or(from));
        for range in &manifest.ranges {
            if out.len() >= max {
                break;
            }
            if range.end <= cursor {
                continue;
            }
            let bytes = self.object(part, range)?;
            let records = part.decode(range, &bytes, cursor, max - out.len())?;
            cursor = records.last().map_or(range.end, |r| r.offset + 1);
            out.extend(records);
        }
        Ok(out)
    }

    /// [`Self::read`] as [`StoredEvent`]s; with `auth`, each record's tag is
    /// verified as the hot log would (C14: a forged record is `Integrity`).
    pub fn fetch(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        auth: Option<&RecordAuth>,
    ) -> Result<Vec<StoredEvent>, BusError> {
        self.read(topic, partition, from, max)?
            .into_iter()
            .map(|record| to_event(topic, partition, record, auth))
            .collect()
    }

    fn object(
        &self,
        part: &PartitionStore,
        range: &ArchivedRange,
    ) -> Result<Arc<Vec<u8>>, BusError> {
        let key = (part.topic.clone(), part.partition, range.from);
        if let Ok(cache) = self.cache.lock()
            && let Some((_, bytes)) = cache.iter().find(|(k, _)| *k == key)
        {
            return Ok(Arc::clone(bytes));
        }
        let (loader, wanted) = (part.clone(), range.clone());
        let bytes = Arc::new(self.run("cold read", async move { loader.load(&wanted).await })?);
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= CACHED_OBJECTS {
                cache.remove(0);
            }
            cache.push((key, Arc::clone(&bytes)));
        }
        Ok(bytes)
    }
}

/// A cold record as the bus returns it, its tag checked with `auth`.
pub fn to_event(
    topic: &str,
    partition: u32,
    record: ColdRecord,
    auth: Option<&RecordAuth>,
) -> Result<StoredEvent, BusError> {
    to_record(topic, partition, record, auth).map(|record| record.event)
}

/// A cold record with its headers (C25) as the bus returns it, its tag
/// (which covers the headers) checked with `auth`.
pub fn to_record(
    topic: &str,
    partition: u32,
    record: ColdRecord,
    auth: Option<&RecordAuth>,
) -> Result<StoredRecord, BusError> {
    if let Some(auth) = auth {
        let parts = RecordParts {
            topic,
            partition,
            key: &record.key,
            uid: record.uid.as_deref(),
            value: &record.value,
        };
        auth.check_with(
            parts,
            &record.headers,
            record.tag.as_ref().map(|t| t.as_slice()),
        )
        .map_err(|fault: TagFault| BusError::Integrity {
            topic: topic.to_owned(),
            partition,
            offset: record.offset,
            reason: format!("cold record: {}", fault.reason()),
        })?;
    }
    let value = serde_json::from_slice(&record.value).map_err(|e| BusError::Corrupt {
        location: format!("cold record {topic}/{partition}"),
        offset: record.offset,
        reason: format!("value is not JSON: {e}"),
    })?;
    Ok(StoredRecord {
        event: StoredEvent {
            partition,
            offset: record.offset,
            key: record.key,
            value,
            stored_at: record.stored_at,
        },
        headers: record.headers,
    })
}
