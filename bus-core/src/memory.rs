//! The in-memory backend: everything the contract asks except durability.
//! It is the reference the suite is proven on, and what users put in their
//! own unit tests.
//!
//! Like every backend built by hand, a `MemoryBus::new()` opens no spans;
//! wrap it in [`Traced`](crate::Traced) for the span schema.

use crate::sync::read;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::auth::{RecordAuth, RecordParts};
use crate::subscription::{Doorbell, Plan};
use crate::{
    BatchRecord, BatchRecordWithHeaders, BusError, Capabilities, DedupHorizon, EventBus, Headers,
    Manifest, PartitionOffsets, PublishAck, Selector, StartAt, StoredEvent, StoredRecord,
    SubscribeOptions, Subscription, TopicSpec, backend::BatchItem, backend::DoorbellRegistry,
    backend::FetchFeed, backend::PreparedRecord, backend::RawRecord, backend::check_partition,
    backend::prepare_record_with, backend::uid_partition, backend::validate_topic, now_ms,
};

/// An in-process bus. Handles made by [`MemoryBus::handle`] share one store,
/// which is how tests model a second process attaching to the same bus.
///
/// ```
/// use bus_core::memory::MemoryBus;
/// use bus_core::{EventBus, Manifest, TopicSpec};
///
/// let bus = MemoryBus::new();
/// bus.provision(&Manifest::new([TopicSpec::new("audit", 2)])).unwrap();
/// let ack = bus.publish("audit", "agent-1", &serde_json::json!({"n": 1})).unwrap();
/// assert_eq!(ack.offset, 0);
/// ```
#[derive(Debug)]
pub struct MemoryBus {
    store: Arc<Store>,
    /// Shared with this handle's subscriptions, so they verify with the
    /// key set later too.
    auth: Arc<RwLock<Option<RecordAuth>>>,
    /// The doorbells of the subscriptions made through this handle, closed
    /// when it drops so they end (C17); `None` in a subscription's feed.
    owned: Option<Mutex<Vec<std::sync::Weak<Doorbell>>>>,
}

impl Default for MemoryBus {
    fn default() -> Self {
        Self {
            store: Arc::default(),
            auth: Arc::default(),
            owned: Some(Mutex::default()),
        }
    }
}

impl Drop for MemoryBus {
    fn drop(&mut self) {
        let Some(owned) = self.owned.take() else {
            return;
        };
        let bells = owned
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for bell in bells.iter().filter_map(std::sync::Weak::upgrade) {
            bell.close();
        }
    }
}

#[derive(Debug, Default)]
struct Store {
    topics: RwLock<BTreeMap<String, Arc<Topic>>>,
    /// Rung after every append, for live subscriptions.
    bells: DoorbellRegistry,
    /// Durable consumers' cursors (C20), shared by every handle.
    cursors: Arc<crate::consumer::MemoryCursorStore>,
}

#[derive(Debug)]
struct Topic {
    spec: TopicSpec,
    /// Read-locked by fetches (live subscriptions among them), so readers
    /// do not queue behind each other, only behind an append.
    partitions: Vec<RwLock<Partition>>,
}

#[derive(Debug, Default)]
struct Partition {
    /// Shared, so a read copies pointers out under the lock and decodes
    /// after it: readers (live subscriptions among them) hold the lock the
    /// publisher needs only for that copy.
    records: VecDeque<Arc<Record>>,
    next_offset: u64,
    uids: HashMap<String, u64>,
}

#[derive(Debug, Clone)]
struct Record {
    offset: u64,
    key: String,
    uid: Option<String>,
    value: Vec<u8>,
    stored_at: u64,
    tag: Option<Vec<u8>>,
    /// Covered by `tag` (C25); empty for most records.
    headers: Headers,
    /// `value` decoded by the first read, shared by the later ones: with
    /// 256 subscribers a record is parsed once, not 256 times. `None`:
    /// not JSON (a raw injected record), an integrity error for every read.
    decoded: OnceLock<Option<serde_json::Value>>,
}

impl MemoryBus {
    /// An empty bus with its own store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new handle on the same store, with no control key set.
    pub fn handle(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            auth: Arc::default(),
            owned: Some(Mutex::default()),
        }
    }

    /// The cursor store of durable consumers, shared by every handle on
    /// this store (`consumer::memory`).
    pub(crate) fn cursor_store(&self) -> Arc<crate::consumer::MemoryCursorStore> {
        Arc::clone(&self.store.cursors)
    }

    /// A handle with this one's control key that closes nothing when
    /// dropped: what a consumer writes dead letters through.
    pub(crate) fn internal_handle(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            auth: Arc::clone(&self.auth),
            owned: None,
        }
    }

    /// Appends `raw` to a partition without signing or checking it.
    pub fn inject_raw(&self, topic: &str, partition: u32, raw: RawRecord) -> Result<u64, BusError> {
        let topic = self.store.topic(topic)?;
        let mut log = topic.partition_mut(partition)?;
        let offset = log.next_offset;
        log.push(
            Record {
                offset,
                key: raw.key,
                uid: raw.uid,
                value: raw.value,
                stored_at: now_ms(),
                tag: raw.tag,
                headers: raw.headers,
                decoded: OnceLock::new(),
            },
            false,
        );
        drop(log);
        self.store.bells.ring(&topic.spec.name);
        Ok(offset)
    }

    fn auth(&self) -> Option<RecordAuth> {
        match self.auth.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn publish_one(
        &self,
        topic_name: &str,
        key: &str,
        value: &serde_json::Value,
        uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        let topic = self.store.topic(topic_name)?;
        let auth = self.auth();
        let PreparedRecord {
            partition,
            uid,
            value: bytes,
            headers,
            tag,
            ..
        } = prepare_record_with(&topic.spec, key, value, uid, headers, auth.as_ref())?;
        let mut log = topic.partition_mut(partition)?;
        let ack = |offset| PublishAck {
            topic: topic_name.to_owned(),
            partition,
            offset,
        };
        if let Some(offset) =
            uid.and_then(|uid| log.authentic_uid(topic_name, partition, uid, auth.as_ref()))
        {
            crate::metrics::dedup_hits("memory", topic_name, 1);
            return Ok(ack(offset));
        }
        crate::metrics::stored("memory", topic_name, 1, bytes.len() as u64);
        let tag = tag.map(|tag| tag.to_vec());
        let offset = log.next_offset;
        log.push(
            Record {
                offset,
                key: key.to_owned(),
                uid: uid.map(str::to_owned),
                value: bytes,
                stored_at: now_ms(),
                tag,
                headers,
                decoded: OnceLock::new(),
            },
            true,
        );
        drop(log);
        self.store.bells.ring(topic_name);
        Ok(ack(offset))
    }
}

impl MemoryBus {
    /// A batch, with or without headers: validated whole first so a bad
    /// record stores nothing.
    fn publish_items(
        &self,
        topic: &str,
        records: &[BatchItem<'_>],
    ) -> Result<Vec<PublishAck>, BusError> {
        let spec = self.store.topic(topic)?.spec.clone();
        for record in records {
            prepare_record_with(
                &spec,
                record.key,
                record.value,
                record.uid,
                record.headers,
                None,
            )?;
        }
        records
            .iter()
            .map(|record| {
                self.publish_one(topic, record.key, record.value, record.uid, record.headers)
            })
            .collect()
    }
}

impl Store {
    fn topic(&self, name: &str) -> Result<Arc<Topic>, BusError> {
        validate_topic(name)?;
        read(&self.topics)
            .get(name)
            .cloned()
            .ok_or_else(|| BusError::UnknownTopic(name.to_owned()))
    }
}

impl Topic {
    fn slot(&self, partition: u32) -> Result<&RwLock<Partition>, BusError> {
        check_partition(&self.spec.name, partition, self.spec.partitions)?;
        self.partitions
            .get(partition as usize)
            .ok_or_else(|| BusError::invalid("partition", "out of range"))
    }

    /// The partition, for a read.
    fn partition(&self, partition: u32) -> Result<RwLockReadGuard<'_, Partition>, BusError> {
        Ok(read(self.slot(partition)?))
    }

    /// The partition, for an append or an expiry.
    fn partition_mut(&self, partition: u32) -> Result<RwLockWriteGuard<'_, Partition>, BusError> {
        Ok(crate::sync::write(self.slot(partition)?))
    }
}

impl Partition {
    /// The offset stored under `uid`, unless a control key is set and that
    /// record's tag does not verify: a forged record never answers for a UID.
    fn authentic_uid(
        &self,
        topic: &str,
        partition: u32,
        uid: &str,
        auth: Option<&RecordAuth>,
    ) -> Option<u64> {
        let offset = *self.uids.get(uid)?;
        let Some(auth) = auth else {
            return Some(offset);
        };
        let index = usize::try_from(offset.checked_sub(self.first_offset())?).ok()?;
        let record = self.records.get(index)?;
        let parts = RecordParts {
            topic,
            partition,
            key: &record.key,
            uid: record.uid.as_deref(),
            value: &record.value,
        };
        auth.check_with(parts, &record.headers, record.tag.as_deref())
            .is_ok()
            .then_some(offset)
    }

    /// Appends `record`. A bus publish reaches here only when its UID is
    /// unknown or held by a forgery, so it takes the UID over; a foreign
    /// append never displaces an existing entry.
    fn push(&mut self, record: Record, take_uid: bool) {
        if let Some(uid) = &record.uid {
            if take_uid {
                self.uids.insert(uid.clone(), record.offset);
            } else {
                self.uids.entry(uid.clone()).or_insert(record.offset);
            }
        }
        self.next_offset = record.offset + 1;
        self.records.push_back(Arc::new(record));
    }

    fn first_offset(&self) -> u64 {
        self.records
            .front()
            .map_or(self.next_offset, |record| record.offset)
    }
}

impl EventBus for MemoryBus {
    fn set_control_key(&self, key: [u8; 32]) -> Result<(), BusError> {
        let mut slot = self
            .auth
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *slot = Some(RecordAuth::new(&key));
        Ok(())
    }

    fn publish(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
    ) -> Result<PublishAck, BusError> {
        self.publish_one(topic, key, value, None, &Headers::new())
    }

    /// A malformed UID is refused before anything is written (contract C12).
    fn publish_idempotent(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: &str,
    ) -> Result<PublishAck, BusError> {
        crate::backend::validate_uid(event_uid)?;
        self.publish_one(topic, key, value, Some(event_uid), &Headers::new())
    }

    /// Headers live beside the record in memory, under its tag (C25).
    fn publish_with_headers(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        if let Some(uid) = event_uid {
            crate::backend::validate_uid(uid)?;
        }
        self.publish_one(topic, key, value, event_uid, headers)
    }
    fn find_event_by_uid(
        &self,
        topic_name: &str,
        key: &str,
        event_uid: &str,
    ) -> Result<Option<PublishAck>, BusError> {
        let topic = self.store.topic(topic_name)?;
        let partition = uid_partition(&topic.spec, key, event_uid)?;
        let log = topic.partition(partition)?;
        let auth = self.auth();
        Ok(log
            .authentic_uid(topic_name, partition, event_uid, auth.as_ref())
            .map(|offset| PublishAck {
                topic: topic_name.to_owned(),
                partition,
                offset,
            }))
    }
    fn fetch(
        &self,
        topic_name: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        Ok(self
            .fetch_with_headers(topic_name, partition, offset, max)?
            .into_iter()
            .map(|record| record.event)
            .collect())
    }

    fn fetch_with_headers(
        &self,
        topic_name: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        let topic = self.store.topic(topic_name)?;
        let records: Vec<Arc<Record>> = {
            let log = topic.partition(partition)?;
            let start = offset.max(log.first_offset());
            let skip = usize::try_from(start - log.first_offset()).unwrap_or(usize::MAX);
            log.records
                .range(skip.min(log.records.len())..)
                .take(max)
                .cloned()
                .collect()
        };
        let auth = self.auth();
        records
            .iter()
            .map(|record| {
                let integrity = |reason: &str| BusError::Integrity {
                    topic: topic_name.to_owned(),
                    partition,
                    offset: record.offset,
                    reason: reason.to_owned(),
                };
                if let Some(auth) = &auth {
                    let parts = RecordParts {
                        topic: topic_name,
                        partition,
                        key: &record.key,
                        uid: record.uid.as_deref(),
                        value: &record.value,
                    };
                    auth.check_with(parts, &record.headers, record.tag.as_deref())
                        .map_err(|fault| integrity(fault.reason()))?;
                }
                let value = record
                    .decoded
                    .get_or_init(|| serde_json::from_slice(&record.value).ok())
                    .clone()
                    .ok_or_else(|| integrity("value is not valid JSON"))?;
                Ok(StoredRecord {
                    event: StoredEvent {
                        partition,
                        offset: record.offset,
                        key: record.key.clone(),
                        value,
                        stored_at: record.stored_at,
                    },
                    headers: record.headers.clone(),
                })
            })
            .collect()
    }

    fn partitions(&self, topic: &str) -> Result<u32, BusError> {
        Ok(self.store.topic(topic)?.spec.partitions)
    }

    fn topics(&self) -> Vec<String> {
        read(&self.store.topics).keys().cloned().collect()
    }
    fn maintenance(&self, now_ms: u64) -> Result<u64, BusError> {
        let topics: Vec<Arc<Topic>> = read(&self.store.topics).values().cloned().collect();
        let mut expired = 0u64;
        for topic in topics {
            let Some(retention) = topic.spec.retention_ms else {
                continue;
            };
            let cutoff = now_ms.saturating_sub(retention);
            for partition in 0..topic.spec.partitions {
                let mut log = topic.partition_mut(partition)?;
                while log
                    .records
                    .front()
                    .is_some_and(|record| record.stored_at < cutoff)
                {
                    if let Some(record) = log.records.pop_front() {
                        if let Some(uid) = &record.uid {
                            log.uids.remove(uid);
                        }
                        expired += 1;
                    }
                }
            }
        }
        Ok(expired)
    }
    fn delete_below(&self, topic: &str, partition: u32, offset: u64) -> Result<u64, BusError> {
        let topic = self.store.topic(topic)?;
        let mut log = topic.partition_mut(partition)?;
        let mut dropped = 0;
        while log
            .records
            .front()
            .is_some_and(|record| record.offset < offset)
        {
            if let Some(record) = log.records.pop_front() {
                if let Some(uid) = &record.uid {
                    log.uids.remove(uid);
                }
                dropped += 1;
            }
        }
        Ok(dropped)
    }
    fn provision(&self, manifest: &Manifest) -> Result<(), BusError> {
        manifest.validate()?;
        manifest.refuse_cold("the memory backend")?;
        let mut topics = self
            .store
            .topics
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for spec in &manifest.topics {
            if let Some(existing) = topics.get(&spec.name) {
                spec.conflict_with(&existing.spec)?;
            }
        }
        for spec in &manifest.topics {
            topics.entry(spec.name.clone()).or_insert_with(|| {
                Arc::new(Topic {
                    spec: spec.clone(),
                    partitions: (0..spec.partitions).map(|_| RwLock::default()).collect(),
                })
            });
        }
        Ok(())
    }
    fn offsets(&self, topic: &str, partition: u32) -> Result<PartitionOffsets, BusError> {
        let topic = self.store.topic(topic)?;
        let log = topic.partition(partition)?;
        Ok(PartitionOffsets {
            first: log.first_offset(),
            next: log.next_offset,
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::minimal("memory")
            .ack_durability(crate::AckDurability::None)
            .headers(true)
            .dedup_horizon(DedupHorizon::Retained)
            .maintenance_retention(true)
    }
    fn topic_spec(&self, topic: &str) -> Result<Option<crate::TopicSpec>, BusError> {
        Ok(Some(self.store.topic(topic)?.spec.clone()))
    }
    fn publish_batch(
        &self,
        topic: &str,
        records: &[BatchRecord],
    ) -> Result<Vec<PublishAck>, BusError> {
        self.publish_items(topic, &BatchItem::all(records))
    }
    /// Headers beside each record, under its tag (C25).
    fn publish_batch_with_headers(
        &self,
        topic: &str,
        records: &[BatchRecordWithHeaders],
    ) -> Result<Vec<PublishAck>, BusError> {
        self.publish_items(topic, &BatchItem::all(records))
    }
    fn subscribe(
        &self,
        topic: &str,
        selector: Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> Result<Subscription, BusError> {
        let plan = Plan::new(self, topic, &selector, start)?;
        // Registered after the plan's positions were read: the first receive
        // reads before it waits, so a record appended in between is not missed.
        let bell = self.store.bells.register(topic);
        if let Some(owned) = &self.owned {
            let mut owned = owned
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            owned.retain(|bell| bell.strong_count() > 0);
            owned.push(Arc::downgrade(&bell));
        }
        let feed = MemoryBus {
            store: Arc::clone(&self.store),
            auth: Arc::clone(&self.auth),
            owned: None,
        };
        Subscription::new(plan, options, Box::new(FetchFeed::new(feed, topic)), bell)
    }
}
