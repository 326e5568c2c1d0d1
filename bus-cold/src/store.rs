//! The object layout and its asynchronous operations (C24).
//!
//! Under the tier's prefix, per partition:
//!
//! ```text
//! TOPIC/PARTITION/objects/FROM-END.bcold        immutable segment objects (format.rs), 20-digit offsets
//! TOPIC/PARTITION/manifest/GENERATION.json      manifest objects, one per generation, never rewritten
//! ```
//!
//! Every object is written with `PutMode::Create` (S3 `If-None-Match: *`).
//! The current manifest is the one with the highest generation; it lists
//! every archived range, contiguous, oldest first. An archive writes its
//! segment object first and then the next generation's manifest: a crash in
//! between leaves an object no manifest lists, which no reader sees and the
//! next archive of the same range finds byte-identical and adopts (nothing
//! half-visible, nothing twice). Two archivers racing for one generation:
//! one create wins, the other re-reads and goes on from the winner's end.

use std::sync::Arc;

use bus_core::{BusError, Compression};
use futures::TryStreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use crate::format::{self, ColdRecord, Place};

/// The manifest format this crate writes and reads.
pub const MANIFEST_FORMAT: u32 = 1;
/// The format of a manifest that records an expired prefix (`expired_below`):
/// a reader that predates cold retention refuses it (as foreign) instead of
/// archiving below the expired end again.
pub const MANIFEST_FORMAT_EXPIRED: u32 = 2;

/// One archived range `[from, end)` and the object holding it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchivedRange {
    /// First offset.
    pub from: u64,
    /// Offset after the last record.
    pub end: u64,
    /// Object name under the partition's `objects/`.
    pub object: String,
    /// The object's size in bytes.
    pub bytes: u64,
    /// CRC-32C of the whole object: a truncated or edited object is
    /// `Corrupt` before it is even decoded.
    pub crc32c: u32,
    /// The newest `stored_at` in the range (epoch ms), what cold retention
    /// compares; absent in manifests written before it (never expired).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest_ms: Option<u64>,
}

/// What a partition's cold tier holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub format: u32,
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: u32,
    /// 0 before the first archive; one more per manifest written.
    pub generation: u64,
    /// Archived ranges, contiguous, oldest first.
    pub ranges: Vec<ArchivedRange>,
    /// Offsets below this were archived and have expired (cold retention):
    /// gone as retention makes records go, never archived again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub expired_below: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Manifest {
    /// The first archived offset still held, if any.
    pub fn start(&self) -> Option<u64> {
        self.ranges.first().map(|r| r.from)
    }
    /// The offset after the last archived record (0 when nothing ever was;
    /// where expiry stopped when every range has expired).
    pub fn end(&self) -> u64 {
        self.ranges.last().map_or(self.expired_below, |r| r.end)
    }
    /// Whether anything was ever archived (held or expired since).
    pub fn ever_archived(&self) -> bool {
        !self.ranges.is_empty() || self.expired_below > 0
    }
}

/// An object_store error as text: its own message (object_store never puts
/// credentials in one; the endpoint and bucket are not secret).
pub(crate) fn describe(error: &object_store::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A store failure: `Unavailable` (retryable, C13) naming what was done.
/// A missing bucket is a configuration error, not an outage: retrying
/// cannot help (the cold tier never creates a bucket).
fn unavailable(what: String, error: object_store::Error) -> BusError {
    // Classified on the store's own error, never on `what` (a path: a topic
    // may be named anything).
    let text = describe(&error);
    if let Some(code) = refused_credentials(&error, &text) {
        // Only the code: the response body may quote request headers.
        return BusError::invalid(
            "cold.credentials",
            format!(
                "{what}: the object store refused the credentials ({code}; check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or set them)"
            ),
        );
    }
    let reason = format!("{what}: {text}");
    if text.contains("NoSuchBucket") {
        return BusError::invalid(
            "cold.location",
            format!(
                "the bucket does not exist (create it first; the cold tier never does): {reason}"
            ),
        );
    }
    BusError::unavailable_caused("cold", reason, error)
}

/// Whether, and how, the store turned the request's credentials down (HTTP
/// 401 or 403, or S3's codes for a bad key or signature): a configuration
/// error, which retrying cannot mend.
fn refused_credentials(error: &object_store::Error, text: &str) -> Option<&'static str> {
    let code = [
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
        "AccessDenied",
        "ExpiredToken",
        "InvalidToken",
    ]
    .into_iter()
    // As the XML body states it: a path in the text may hold any word.
    .find(|code| text.contains(&format!("<Code>{code}</Code>")));
    match error {
        object_store::Error::PermissionDenied { .. } => Some(code.unwrap_or("HTTP 403")),
        object_store::Error::Unauthenticated { .. } => Some(code.unwrap_or("HTTP 401")),
        _ => code,
    }
}

/// One partition's objects in one store.
#[derive(Debug, Clone)]
pub(crate) struct PartitionStore {
    pub store: Arc<dyn ObjectStore>,
    pub root: StorePath,
    pub topic: String,
    pub partition: u32,
    /// How the objects this writes are compressed.
    pub compression: Compression,
}

fn object_name(from: u64, end: u64) -> String {
    format!("{from:020}-{end:020}.bcold")
}

impl PartitionStore {
    fn dir(&self, what: &str) -> StorePath {
        self.root
            .clone()
            .join(self.topic.as_str())
            .join(self.partition.to_string())
            .join(what)
    }
    fn object_path(&self, name: &str) -> StorePath {
        self.dir("objects").join(name)
    }
    fn place(&self, from: u64, end: u64) -> Place<'_> {
        Place {
            topic: &self.topic,
            partition: self.partition,
            from,
            end,
        }
    }
    fn corrupt(&self, from: u64, end: u64, reason: String) -> BusError {
        BusError::Corrupt {
            location: self.place(from, end).describe(),
            offset: from,
            reason,
        }
    }

    /// The current manifest (generation 0 and no range when none is written).
    pub async fn manifest(&self) -> Result<Manifest, BusError> {
        let dir = self.dir("manifest");
        let listed: Vec<_> = self
            .store
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| unavailable(format!("listing {dir}"), e))?;
        let mut newest: Option<(u64, StorePath)> = None;
        for meta in listed {
            let name = meta.location.filename().unwrap_or_default();
            let Some(generation) = name
                .strip_suffix(".json")
                .and_then(|g| g.parse::<u64>().ok())
            else {
                // Something else wrote under the tier's prefix: refuse to guess.
                return Err(BusError::Corrupt {
                    location: format!("cold manifest {dir}"),
                    offset: 0,
                    reason: format!(
                        "unexpected object {} among the manifests (written by something else?)",
                        meta.location
                    ),
                });
            };
            if newest.as_ref().is_none_or(|(g, _)| generation > *g) {
                newest = Some((generation, meta.location));
            }
        }
        let Some((generation, path)) = newest else {
            return Ok(Manifest {
                format: MANIFEST_FORMAT,
                topic: self.topic.clone(),
                partition: self.partition,
                ..Manifest::default()
            });
        };
        let bytes = self
            .store
            .get(&path)
            .await
            .map_err(|e| unavailable(format!("reading {path}"), e))?
            .bytes()
            .await
            .map_err(|e| unavailable(format!("reading {path}"), e))?;
        let bad = |reason: String| BusError::Corrupt {
            location: format!("cold manifest {path}"),
            offset: 0,
            reason,
        };
        let manifest: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a manifest: {e}")))?;
        if !(MANIFEST_FORMAT..=MANIFEST_FORMAT_EXPIRED).contains(&manifest.format)
            || manifest.topic != self.topic
            || manifest.partition != self.partition
            || manifest.generation != generation
        {
            return Err(bad(format!(
                "format {} of topic {:?} partition {} generation {} (foreign or misplaced manifest)",
                manifest.format, manifest.topic, manifest.partition, manifest.generation
            )));
        }
        let mut previous: Option<u64> = None;
        for range in &manifest.ranges {
            if range.from >= range.end
                || previous.is_some_and(|end| end != range.from)
                || range.object != object_name(range.from, range.end)
            {
                return Err(bad(format!(
                    "range [{}, {}) breaks the chain",
                    range.from, range.end
                )));
            }
            previous = Some(range.end);
        }
        Ok(manifest)
    }

    /// Archives `records` (consecutive offsets) past `manifest`'s end as one
    /// object and the next manifest. Records the manifest already covers are
    /// skipped; returns the new manifest, or `None` when there was nothing
    /// new or another archiver wrote that generation first.
    pub async fn archive(
        &self,
        manifest: &Manifest,
        records: &[ColdRecord],
    ) -> Result<Option<Manifest>, BusError> {
        let end_now = manifest.end();
        let fresh: Vec<ColdRecord> = records
            .iter()
            .filter(|r| !manifest.ever_archived() || r.offset >= end_now)
            .cloned()
            .collect();
        let Some(first) = fresh.first() else {
            return Ok(None);
        };
        if manifest.ever_archived() && first.offset != end_now {
            return Err(BusError::invalid(
                "records",
                format!(
                    "the cold tier of {}/{} ends at offset {end_now}; records from {} would leave a gap",
                    self.topic, self.partition, first.offset
                ),
            ));
        }
        let (from, end) = (first.offset, first.offset + fresh.len() as u64);
        let bytes = format::encode_compressed(self.place(from, end), &fresh, self.compression)?;
        let name = object_name(from, end);
        let path = self.object_path(&name);
        let mut crc = crc32c::crc32c(&bytes);
        let mut size = bytes.len() as u64;
        match self.create(&path, bytes).await {
            Ok(()) => {}
            Err(object_store::Error::AlreadyExists { .. }) => {
                // A crash between object and manifest left it: adopt it if it
                // holds exactly these records (whatever its codec or the
                // codec library's version made of them), else refuse.
                let existing = self.get(&path, from, end).await?;
                let same = format::decode(self.place(from, end), &existing, from, usize::MAX)
                    .is_ok_and(|records| records == fresh);
                if !same {
                    return Err(self.corrupt(
                        from,
                        end,
                        format!("{path} exists with other content (written by something else?); nothing archived"),
                    ));
                }
                crc = crc32c::crc32c(&existing);
                size = existing.len() as u64;
            }
            Err(e) => return Err(unavailable(format!("writing {path}"), e)),
        }
        let mut next = manifest.clone();
        next.format = manifest.format.max(MANIFEST_FORMAT);
        next.topic.clone_from(&self.topic);
        next.partition = self.partition;
        next.generation += 1;
        next.ranges.push(ArchivedRange {
            from,
            end,
            object: name,
            bytes: size,
            crc32c: crc,
            newest_ms: fresh.iter().map(|r| r.stored_at).max(),
        });
        self.write_manifest(next).await
    }

    /// Writes `next` as its generation's manifest: `None` when another
    /// writer took that generation first.
    async fn write_manifest(&self, next: Manifest) -> Result<Option<Manifest>, BusError> {
        let manifest_path = self
            .dir("manifest")
            .join(format!("{:020}.json", next.generation));
        let json = serde_json::to_vec_pretty(&next)?;
        match self.create(&manifest_path, json).await {
            Ok(()) => Ok(Some(next)),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(None),
            Err(e) => Err(unavailable(format!("writing {manifest_path}"), e)),
        }
    }

    /// Cold retention: the next manifest without the oldest ranges whose
    /// newest record is older than `cutoff_ms`, then their objects deleted.
    /// The manifest goes first, so a crash leaves unlisted objects (which
    /// no reader sees and no archive writes again: they lie below the end),
    /// never a listed range without its object. Returns the records
    /// expired, or `None` when another writer took the generation first.
    pub async fn expire(
        &self,
        manifest: &Manifest,
        cutoff_ms: u64,
    ) -> Result<Option<u64>, BusError> {
        let gone = manifest
            .ranges
            .iter()
            .take_while(|r| r.newest_ms.is_some_and(|newest| newest < cutoff_ms))
            .count();
        if gone == 0 {
            return Ok(Some(0));
        }
        let mut next = manifest.clone();
        next.generation += 1;
        let dropped: Vec<ArchivedRange> = next.ranges.drain(..gone).collect();
        next.expired_below = dropped.last().map_or(next.expired_below, |r| r.end);
        next.format = MANIFEST_FORMAT_EXPIRED;
        if self.write_manifest(next).await?.is_none() {
            return Ok(None);
        }
        for range in &dropped {
            let path = self.object_path(&range.object);
            if let Err(error) = self.store.delete(&path).await {
                // Unlisted now: harmless, only space until deleted by hand.
                tracing::warn!(%path, error = %describe(&error), "an expired cold object stays");
            }
        }
        Ok(Some(dropped.iter().map(|r| r.end - r.from).sum()))
    }

    async fn create(&self, path: &StorePath, bytes: Vec<u8>) -> Result<(), object_store::Error> {
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        self.store
            .put_opts(path, PutPayload::from(bytes), options)
            .await
            .map(|_| ())
    }

    async fn get(&self, path: &StorePath, from: u64, end: u64) -> Result<Vec<u8>, BusError> {
        let result = match self.store.get(path).await {
            Ok(result) => result.bytes().await,
            Err(e) => Err(e),
        };
        match result {
            Ok(bytes) => Ok(bytes.to_vec()),
            Err(object_store::Error::NotFound { .. }) => Err(self.corrupt(
                from,
                end,
                format!("object {path} is missing (the manifest lists it)"),
            )),
            Err(e) => Err(unavailable(format!("reading {path}"), e)),
        }
    }

    /// The bytes of `range`'s object, checked against the manifest's size and CRC.
    pub async fn load(&self, range: &ArchivedRange) -> Result<Vec<u8>, BusError> {
        let path = self.object_path(&range.object);
        let bytes = self.get(&path, range.from, range.end).await?;
        if bytes.len() as u64 != range.bytes {
            return Err(self.corrupt(
                range.from,
                range.end,
                format!(
                    "object is {} bytes, the manifest says {} (truncated or replaced)",
                    bytes.len(),
                    range.bytes
                ),
            ));
        }
        if crc32c::crc32c(&bytes) != range.crc32c {
            return Err(self.corrupt(
                range.from,
                range.end,
                "object checksum mismatch (edited?)".into(),
            ));
        }
        Ok(bytes)
    }

    /// Decodes up to `max` records from `from` out of `range`'s object bytes.
    pub fn decode(
        &self,
        range: &ArchivedRange,
        bytes: &[u8],
        from: u64,
        max: usize,
    ) -> Result<Vec<ColdRecord>, BusError> {
        format::decode(self.place(range.from, range.end), bytes, from, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(text: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: text.to_owned().into(),
        }
    }

    #[test]
    fn only_the_store_s_answer_says_credentials_were_refused() {
        // A topic may be named anything: a path is not an S3 error code.
        let outage = generic("error sending request for url (http://h/b/AccessDenied/0/manifest/)");
        assert_eq!(refused_credentials(&outage, &describe(&outage)), None);
        assert!(unavailable("listing AccessDenied/0".into(), outage).is_transient());
        let refused = generic(
            "403 Forbidden: <Error><Code>SignatureDoesNotMatch</Code><StringToSign>x</StringToSign></Error>",
        );
        assert_eq!(
            refused_credentials(&refused, &describe(&refused)),
            Some("SignatureDoesNotMatch")
        );
        let error = unavailable("listing t/0".into(), refused);
        assert!(!error.is_transient());
        // The response body (which may quote request headers) is not repeated.
        assert!(!error.to_string().contains("StringToSign"), "{error}");
    }
}
