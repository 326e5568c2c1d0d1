//! [`ColdBus`]: a cold tier in front of any [`EventBus`] (C24).
//!
//! Publishes go to the inner bus. Reads below the inner bus's hot log
//! start (`fetch`, `fetch_with_headers`, `subscribe`, `offsets`,
//! `find_event_by_uid`) are answered from the tier with the same offsets,
//! values, `stored_at` and headers, gap-free; a range that should be cold
//! but is not there is [`BusError::Corrupt`] naming it.
//!
//! Archiving reads the inner bus through `fetch_with_headers` (so a forged
//! hot record fails there, C14) and drops the archived prefix from the hot
//! log with [`EventBus::delete_below`], never past what the tier holds.
//! Because a generic bus returns decoded values and no tag, each archived
//! record is stored with its value's JSON as `serde_json` writes it and,
//! when the bus has a control key, a tag made with that key after the hot
//! read verified the original: a cold object edited afterwards fails as
//! [`BusError::Integrity`]. The UID the tier keeps is the value's
//! `metadata.uid`, or the UID given to a publish through this `ColdBus`
//! when the same `ColdBus` archives that record; a UID another process
//! gave only as an argument is not visible through a generic read (see
//! the crate README for what that means for dedup below the hot start).
//!
//! The hot/cold boundary moves under readers: a read that measured the hot
//! start before a trim finds the hot page starting later than asked and
//! reads the tier again, so it never returns a short or gapped page.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use bus_core::auth::{RecordAuth, RecordParts};
use bus_core::backend::{Doorbell, FetchFeed, Plan};
use bus_core::{
    BatchRecord, BusError, Capabilities, EventBus, Headers, Manifest, PartitionOffsets, PublishAck,
    Selector, StartAt, StoredEvent, StoredRecord, SubscribeOptions, Subscription, TopicSpec,
};

mod consumers;
mod declared;
mod read;

use crate::{ColdRecord, ColdTier, DEFAULT_OBJECT_RECORDS};

/// Attempts of a read whose hot/cold boundary keeps moving under it.
const READ_ATTEMPTS: usize = 16;
/// Records per page when scanning the tier for a UID.
const SCAN_PAGE: usize = 4096;
/// How long a subscription's waker waits on the inner live tail before it
/// looks whether its subscription was dropped: the waker thread ends within
/// this after the drop (not before `drop` returns, as C17 asks of the
/// backends' own subscriptions).
const WAKER_POLL: Duration = Duration::from_millis(200);
/// Argument UIDs of publishes not archived yet, remembered at most.
const REMEMBERED_UIDS: usize = 65_536;

/// (topic, partition, offset).
type Place = (String, u32, u64);

/// How a [`ColdBus`] archives.
#[derive(Debug, Clone)]
pub struct ColdBusOptions {
    /// `Some(n)`: after each publish, once a partition holds more than
    /// `2n` hot records, archive all but the newest `n` and drop them from
    /// the hot log (a tiny hot retention; what the conformance suite's cold
    /// run uses). `None` (the default): archive only when asked.
    pub hot_records: Option<u64>,
    /// Records per cold object.
    pub object_records: usize,
    /// `Some(ms)`: `maintenance` expires cold objects whose newest record
    /// is older than this ([`ColdTier::expire`]). `None` (the default):
    /// cold history is kept until deleted by hand.
    pub cold_retention_ms: Option<u64>,
}

impl Default for ColdBusOptions {
    fn default() -> Self {
        Self {
            hot_records: None,
            object_records: DEFAULT_OBJECT_RECORDS,
            cold_retention_ms: None,
        }
    }
}

impl ColdBusOptions {
    /// Keep about `n` records hot per partition (see [`Self::hot_records`]).
    #[must_use]
    pub fn hot_records(mut self, n: u64) -> Self {
        self.hot_records = Some(n.max(1));
        self
    }

    /// Records per cold object (at least 1).
    #[must_use]
    pub fn object_records(mut self, n: usize) -> Self {
        self.object_records = n.max(1);
        self
    }

    /// Keep cold history for `ms` (see [`Self::cold_retention_ms`]).
    #[must_use]
    pub fn cold_retention_ms(mut self, ms: u64) -> Self {
        self.cold_retention_ms = Some(ms);
        self
    }
}

struct Shared<B> {
    inner: B,
    tier: Arc<ColdTier>,
    options: ColdBusOptions,
    /// Cold retention of the topics a provisioned manifest gave a tier.
    declared: RwLock<declared::Declared>,
    auth: RwLock<Option<RecordAuth>>,
    /// One automatic archive at a time; others skip (the next publish
    /// catches up).
    settling: Mutex<()>,
    /// A UID check in the tier and the publish after it, as one step.
    dedup: Mutex<()>,
    /// The UIDs given to publishes through this bus, until archived (a
    /// generic read does not return them); the oldest go past the cap.
    uids: Mutex<BTreeMap<Place, String>>,
}

/// Any [`EventBus`] with a cold tier: see the module docs.
///
/// ```
/// use std::sync::Arc;
/// use bus_cold::{ColdBus, ColdBusOptions, ColdLocation, ColdTier};
/// use bus_core::{EventBus, Manifest, TopicSpec, memory::MemoryBus};
///
/// let tier = Arc::new(ColdTier::open(&ColdLocation::Memory).unwrap());
/// let bus = ColdBus::new(MemoryBus::new(), tier, ColdBusOptions::default());
/// bus.provision(&Manifest::new([TopicSpec::new("audit", 1)])).unwrap();
/// for n in 0..10 {
///     bus.publish("audit", "k", &serde_json::json!({"n": n})).unwrap();
/// }
/// bus.archive_and_trim("audit", 0, 8).unwrap(); // 0..8 archived, dropped from the hot log
/// assert_eq!(bus.inner().offsets("audit", 0).unwrap().first, 8);
/// let all = bus.fetch("audit", 0, 0, 100).unwrap(); // 0..8 from the tier, then 8..10 hot
/// assert_eq!(all.iter().map(|e| e.offset).collect::<Vec<_>>(), (0..10).collect::<Vec<_>>());
/// ```
pub struct ColdBus<B> {
    shared: Arc<Shared<B>>,
}

impl<B> Clone for ColdBus<B> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<B> std::fmt::Debug for ColdBus<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColdBus")
            .field("tier", &self.shared.tier)
            .field("options", &self.shared.options)
            .finish_non_exhaustive()
    }
}

impl<B: EventBus + 'static> ColdBus<B> {
    /// `inner` with the cold tier `tier`.
    pub fn new(inner: B, tier: Arc<ColdTier>, options: ColdBusOptions) -> Self {
        Self {
            shared: Arc::new(Shared {
                inner,
                tier,
                options,
                declared: RwLock::default(),
                auth: RwLock::default(),
                settling: Mutex::default(),
                dedup: Mutex::default(),
                uids: Mutex::default(),
            }),
        }
    }

    /// The inner (hot) bus.
    pub fn inner(&self) -> &B {
        &self.shared.inner
    }

    /// The cold tier.
    pub fn tier(&self) -> &ColdTier {
        &self.shared.tier
    }

    /// `Some(retention)` when a provisioned manifest gave `topic` a tier
    /// (`Some(None)`: kept forever); `None` when none did.
    fn declared_retention(&self, topic: &str) -> Option<Option<u64>> {
        self.shared
            .declared
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(topic)
            .copied()
    }

    fn auth(&self) -> Option<RecordAuth> {
        self.shared
            .auth
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Archives the records of `topic`/`partition` below `end` that the
    /// tier does not hold yet (idempotent, crash-safe: see [`ColdTier`]).
    /// Returns the records newly archived.
    pub fn archive(&self, topic: &str, partition: u32, end: u64) -> Result<u64, BusError> {
        // Not while a publish with a UID is between its ack and remembering
        // the UID (which this archive would otherwise miss).
        let _no_publish = self
            .shared
            .dedup
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let auth = self.auth();
        let inner = &self.shared.inner;
        let archived = self.shared.tier.archive_with(
            topic,
            partition,
            end,
            self.shared.options.object_records,
            |from, max| {
                let page = inner.fetch_with_headers(topic, partition, from, max)?;
                let uids = self
                    .shared
                    .uids
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                page.into_iter()
                    .map(|record| {
                        let place = (topic.to_owned(), partition, record.event.offset);
                        let uid = uids.get(&place).cloned();
                        to_cold(topic, partition, record, uid, auth.as_ref())
                    })
                    .collect()
            },
        )?;
        // What the tier holds needs no remembering.
        let held = self.shared.tier.manifest(topic, partition)?.end();
        self.shared
            .uids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(t, p, offset), _| !(t == topic && *p == partition && *offset < held));
        Ok(archived)
    }

    fn remember_uid(&self, ack: &PublishAck, uid: &str) {
        let mut uids = self
            .shared
            .uids
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        uids.insert(
            (ack.topic.clone(), ack.partition, ack.offset),
            uid.to_owned(),
        );
        while uids.len() > REMEMBERED_UIDS {
            uids.pop_first();
        }
    }

    /// Archives every acked record of every partition of `topic`.
    pub fn archive_topic(&self, topic: &str) -> Result<u64, BusError> {
        let mut archived = 0;
        for partition in 0..self.shared.inner.partitions(topic)? {
            let head = self.shared.inner.offsets(topic, partition)?.next;
            archived += self.archive(topic, partition, head)?;
        }
        Ok(archived)
    }

    /// Archives below `end`, then drops from the hot log what the tier
    /// holds below `end` (never a record the tier lacks). Returns the hot
    /// records dropped. [`BusError::Unsupported`] from a backend that cannot
    /// drop a prefix on demand.
    pub fn archive_and_trim(&self, topic: &str, partition: u32, end: u64) -> Result<u64, BusError> {
        self.archive(topic, partition, end)?;
        let held = self.shared.tier.manifest(topic, partition)?.end();
        let cut = end.min(held);
        if cut == 0 {
            return Ok(0);
        }
        self.shared.inner.delete_below(topic, partition, cut)
    }

    /// The automatic archive of [`ColdBusOptions::hot_records`]. A failure
    /// does not fail the publish that was acked before it: it is logged,
    /// and the next publish tries again.
    fn settle(&self, topic: &str, partition: u32) {
        let Some(keep) = self.shared.options.hot_records else {
            return;
        };
        let Ok(_one) = self.shared.settling.try_lock() else {
            return;
        };
        let result = self
            .shared
            .inner
            .offsets(topic, partition)
            .and_then(|offsets| {
                if offsets.next.saturating_sub(offsets.first) <= keep.saturating_mul(2) {
                    return Ok(0);
                }
                self.archive_and_trim(topic, partition, offsets.next - keep)
            });
        if let Err(error) = result {
            tracing::warn!(%error, topic, partition, "cold tier: automatic archive failed");
        }
    }

    /// The ack of the first authentic cold record of `uid` under `key`, if
    /// the tier holds one: newest objects first, stopping below the
    /// topic's dedup window when `window_only` (C6 asks no more).
    fn cold_uid(
        &self,
        topic: &str,
        key: &str,
        uid: &str,
        window_only: bool,
    ) -> Result<Option<PublishAck>, BusError> {
        let partition = bus_core::partition_for(key, self.shared.inner.partitions(topic)?);
        let manifest = self.shared.tier.manifest(topic, partition)?;
        let horizon = match self.shared.inner.topic_spec(topic)? {
            Some(spec) if window_only => bus_core::now_ms().saturating_sub(spec.dedup_window_ms),
            _ => 0,
        };
        let auth = self.auth();
        let mut found = None;
        for range in manifest.ranges.iter().rev() {
            let mut from = range.from;
            let mut newest = 0;
            while from < range.end {
                let want = usize::try_from(range.end - from).unwrap_or(SCAN_PAGE);
                let page = self
                    .shared
                    .tier
                    .read(topic, partition, from, want.min(SCAN_PAGE))?;
                let Some(last) = page.last() else { break };
                from = last.offset + 1;
                for record in page {
                    newest = newest.max(record.stored_at);
                    if record.key == key
                        && record.uid.as_deref() == Some(uid)
                        && found.is_none()
                        && crate::to_record(topic, partition, record.clone(), auth.as_ref()).is_ok()
                    {
                        found = Some(record.offset);
                    }
                }
            }
            if newest < horizon {
                break;
            }
        }
        Ok(found.map(|offset| PublishAck {
            topic: topic.to_owned(),
            partition,
            offset,
        }))
    }

    /// Runs `publish` unless the tier already holds `uid` (C6 below the hot
    /// start), then settles the acked partition.
    fn publish_checked(
        &self,
        topic: &str,
        key: &str,
        uid: Option<&str>,
        publish: impl FnOnce(&B) -> Result<PublishAck, BusError>,
    ) -> Result<PublishAck, BusError> {
        let ack = match uid.filter(|uid| !uid.is_empty()) {
            Some(uid) => {
                let _one = self
                    .shared
                    .dedup
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if let Some(ack) = self.cold_uid(topic, key, uid, true)? {
                    return Ok(ack);
                }
                let ack = publish(&self.shared.inner)?;
                self.remember_uid(&ack, uid);
                ack
            }
            None => publish(&self.shared.inner)?,
        };
        self.settle(topic, ack.partition);
        Ok(ack)
    }
}

/// A hot record as the tier keeps it (see the module docs).
fn to_cold(
    topic: &str,
    partition: u32,
    record: StoredRecord,
    given_uid: Option<String>,
    auth: Option<&RecordAuth>,
) -> Result<ColdRecord, BusError> {
    let StoredRecord { event, headers } = record;
    let value = serde_json::to_vec(&event.value)?;
    let uid = bus_core::embedded_uid(&event.value)
        .filter(|uid| !uid.is_empty())
        .map(str::to_owned)
        .or(given_uid);
    let tag = auth.map(|auth| {
        auth.tag_with(
            RecordParts {
                topic,
                partition,
                key: &event.key,
                uid: uid.as_deref(),
                value: &value,
            },
            &headers,
        )
    });
    Ok(ColdRecord {
        offset: event.offset,
        stored_at: event.stored_at,
        key: event.key,
        uid,
        value,
        tag,
        headers,
    })
}

impl<B: EventBus + 'static> EventBus for ColdBus<B> {
    fn set_control_key(&self, key: [u8; 32]) -> Result<(), BusError> {
        self.shared.inner.set_control_key(key)?;
        *self
            .shared
            .auth
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(RecordAuth::new(&key));
        Ok(())
    }

    fn publish(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
    ) -> Result<PublishAck, BusError> {
        let uid = bus_core::embedded_uid(value);
        self.publish_checked(topic, key, uid, |inner| inner.publish(topic, key, value))
    }

    fn publish_idempotent(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: &str,
    ) -> Result<PublishAck, BusError> {
        if bus_core::embedded_uid(value).is_some_and(|uid| !uid.is_empty() && uid != event_uid) {
            // The inner bus names the mismatch (C6); nothing is stored.
            return self
                .shared
                .inner
                .publish_idempotent(topic, key, value, event_uid);
        }
        self.publish_checked(topic, key, Some(event_uid), |inner| {
            inner.publish_idempotent(topic, key, value, event_uid)
        })
    }

    fn publish_with_headers(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        let uid = event_uid.or_else(|| bus_core::embedded_uid(value));
        self.publish_checked(topic, key, uid, |inner| {
            inner.publish_with_headers(topic, key, value, event_uid, headers)
        })
    }

    fn publish_batch(
        &self,
        topic: &str,
        records: &[BatchRecord],
    ) -> Result<Vec<PublishAck>, BusError> {
        let in_tier = |record: &BatchRecord| -> Result<bool, BusError> {
            let uid = record
                .uid
                .as_deref()
                .or_else(|| bus_core::embedded_uid(&record.value))
                .filter(|uid| !uid.is_empty());
            match uid {
                Some(uid) => Ok(self.cold_uid(topic, &record.key, uid, true)?.is_some()),
                None => Ok(false),
            }
        };
        let mut any_cold = false;
        for record in records {
            any_cold |= in_tier(record)?;
        }
        let acks = if any_cold {
            // Some UIDs are only in the tier: one at a time, each checked.
            let mut acks = Vec::with_capacity(records.len());
            for record in records {
                acks.push(match &record.uid {
                    Some(uid) => self.publish_idempotent(topic, &record.key, &record.value, uid)?,
                    None => self.publish(topic, &record.key, &record.value)?,
                });
            }
            acks
        } else {
            self.shared.inner.publish_batch(topic, records)?
        };
        let mut partitions: Vec<u32> = acks.iter().map(|ack| ack.partition).collect();
        partitions.sort_unstable();
        partitions.dedup();
        for partition in partitions {
            self.settle(topic, partition);
        }
        Ok(acks)
    }

    fn find_event_by_uid(
        &self,
        topic: &str,
        key: &str,
        event_uid: &str,
    ) -> Result<Option<PublishAck>, BusError> {
        if let Some(ack) = self.shared.inner.find_event_by_uid(topic, key, event_uid)? {
            return Ok(Some(ack));
        }
        self.cold_uid(topic, key, event_uid, false)
    }

    fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        Ok(self
            .fetch_with_headers(topic, partition, offset, max)?
            .into_iter()
            .map(|record| record.event)
            .collect())
    }

    fn fetch_with_headers(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        self.read_through(topic, partition, offset, max)
    }

    fn partitions(&self, topic: &str) -> Result<u32, BusError> {
        self.shared.inner.partitions(topic)
    }

    fn topics(&self) -> Vec<String> {
        self.shared.inner.topics()
    }

    /// Archives every topic through its head first, so the inner bus's
    /// retention drops nothing the tier lacks, then runs the inner bus's,
    /// then cold retention: a topic's declared `cold.retention_ms`, else
    /// [`ColdBusOptions::cold_retention_ms`]. Counts the records either
    /// retention removed.
    fn maintenance(&self, now_ms: u64) -> Result<u64, BusError> {
        let topics = self.shared.inner.topics();
        for topic in &topics {
            self.archive_topic(topic)?;
        }
        let mut removed = self.shared.inner.maintenance(now_ms)?;
        for topic in &topics {
            let declared = self.declared_retention(topic);
            let Some(keep) = declared.unwrap_or(self.shared.options.cold_retention_ms) else {
                continue;
            };
            let cutoff = now_ms.saturating_sub(keep);
            for partition in 0..self.shared.inner.partitions(topic)? {
                removed += self.shared.tier.expire(topic, partition, cutoff)?;
            }
        }
        Ok(removed)
    }

    /// Cold sections must name this bus's tier (else nothing is
    /// provisioned); the inner bus gets the manifest without them.
    fn provision(&self, manifest: &Manifest) -> Result<(), BusError> {
        manifest.validate()?;
        let declared = declared::declared(manifest, self.shared.tier.location())?;
        self.shared.inner.provision(&manifest.without_cold())?;
        self.shared
            .declared
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(declared);
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        self.shared.inner.capabilities()
    }

    /// The inner bus's spec, with the cold section a provisioned manifest declared.
    fn topic_spec(&self, topic: &str) -> Result<Option<TopicSpec>, BusError> {
        let spec = self.shared.inner.topic_spec(topic)?;
        let declared = self.declared_retention(topic);
        Ok(spec.map(|mut spec| {
            if let Some(retention_ms) = declared {
                spec.cold = Some(bus_core::ColdSpec {
                    location: self.shared.tier.location().to_owned(),
                    retention_ms,
                });
            }
            spec
        }))
    }

    /// The hot range, its start lowered to the tier's first offset.
    fn offsets(&self, topic: &str, partition: u32) -> Result<PartitionOffsets, BusError> {
        let hot = self.shared.inner.offsets(topic, partition)?;
        let cold = self.shared.tier.manifest(topic, partition)?;
        Ok(PartitionOffsets {
            first: cold.start().map_or(hot.first, |start| start.min(hot.first)),
            next: hot.next,
        })
    }

    fn delete_below(&self, topic: &str, partition: u32, offset: u64) -> Result<u64, BusError> {
        self.archive_and_trim(topic, partition, offset)
    }

    /// History through [`EventBus::fetch_with_headers`] (the tier below the
    /// hot start), woken by a subscription to the inner bus's live tail.
    fn subscribe(
        &self,
        topic: &str,
        selector: Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> Result<Subscription, BusError> {
        options.validate()?;
        let plan = Plan::new(self, topic, &selector, start)?;
        let bell = Doorbell::new();
        let waker = self.shared.inner.subscribe(
            topic,
            Selector::Topic,
            StartAt::Now,
            SubscribeOptions::default(),
        )?;
        let weak = Arc::downgrade(&bell);
        std::thread::Builder::new()
            .name("bus-cold-waker".into())
            .spawn(move || read::wake(waker, &weak))?;
        Subscription::new(
            plan,
            options,
            Box::new(FetchFeed::new(self.clone(), topic)),
            bell,
        )
    }
}
