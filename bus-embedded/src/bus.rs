//! The bus: the directory lock, the topic registry, provisioning, and the
//! `EventBus` methods that route to partitions.

use bus_core::backend::sync::{read, write};
use std::collections::BTreeMap;
use std::fs::{OpenOptions, TryLockError};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use bus_core::auth::RecordAuth;
use bus_core::{
    BatchRecord, BatchRecordWithHeaders, BusError, Capabilities, DedupHorizon, EventBus, Headers,
    Manifest, PartitionOffsets, PublishAck, Selector, StartAt, StoredEvent, StoredRecord,
    SubscribeOptions, Subscription, backend::BatchItem, backend::check_partition,
    backend::uid_partition,
};

use crate::fsutil;
use crate::inner::Inner;
use crate::options::{Durability, Options};
use crate::topics::{self, Topic};
use crate::watch::Watches;

/// The embedded, durable event bus: a segmented, checksummed log per
/// partition under one data directory, which it locks for its lifetime.
///
/// ```
/// use bus_core::{EventBus, Manifest, TopicSpec};
/// let dir = tempfile::tempdir().unwrap();
/// let bus = bus_embedded::EmbeddedBus::open(dir.path()).unwrap();
/// bus.provision(&Manifest::new([TopicSpec::new("audit", 2)])).unwrap();
/// let ack = bus.publish("audit", "agent-1", &serde_json::json!({"n": 1})).unwrap();
/// assert_eq!(bus.fetch("audit", ack.partition, 0, 10).unwrap()[0].value["n"], 1);
/// ```
#[derive(Debug)]
pub struct EmbeddedBus {
    pub(crate) inner: Arc<Inner>,
    flusher: Option<Flusher>,
    /// False for the internal handles the async surface moves onto the
    /// blocking pool: dropping one closes nothing.
    primary: bool,
}

#[derive(Debug)]
struct Flusher {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl EmbeddedBus {
    /// Opens (creating if needed) the bus stored in `path` with default
    /// [`Options`]. Fails with [`BusError::Locked`] while another bus has it
    /// open, and with [`BusError::Corrupt`] when acknowledged data is damaged.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, BusError> {
        Self::open_with(path, Options::default())
    }

    /// Opens the bus stored in `path` for reading only (contract C16):
    /// beside a writer in this or another process, without its lock,
    /// writing nothing. It fetches, finds, subscribes and sees topics the
    /// writer provisions later; it shows a record once the writer has acked
    /// it (never bytes a crash could take back); `publish*`, `maintenance`
    /// and a `provision` that would create a topic fail with
    /// [`BusError::ReadOnly`]. Its subscriptions wake on inotify events, through
    /// one watcher (one thread, one inotify instance) per open, shared by
    /// all its subscriptions.
    ///
    /// ```
    /// use bus_core::{EventBus, Manifest, TopicSpec};
    /// use bus_embedded::EmbeddedBus;
    /// let dir = tempfile::tempdir().unwrap();
    /// let writer = EmbeddedBus::open(dir.path()).unwrap();
    /// writer.provision(&Manifest::new([TopicSpec::new("audit", 1)])).unwrap();
    /// let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
    /// writer.publish("audit", "k", &serde_json::json!({"n": 1})).unwrap();
    /// assert_eq!(reader.fetch("audit", 0, 0, 10).unwrap().len(), 1);
    /// assert!(reader.publish("audit", "k", &serde_json::json!({})).is_err());
    /// ```
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self, BusError> {
        Self::open_with(path, Options::default().read_only(true))
    }

    /// Opens the bus stored in `path` with `options`.
    pub fn open_with(path: impl AsRef<Path>, mut options: Options) -> Result<Self, BusError> {
        let root = path.as_ref().to_path_buf();
        options.notifier = Arc::default();
        options.open_files = Arc::default();
        if options.read_only {
            return Self::open_reader(root, options);
        }
        fsutil::create_dir(&root)?;
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(root.join("LOCK"))?;
        // A read-only open probes the lock for a moment (see
        // `fsutil::writer_absent`): a held lock is retried for as long as
        // that lasts before it means another writer.
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(50);
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(TryLockError::WouldBlock) => return Err(BusError::Locked { path: root }),
                Err(TryLockError::Error(error)) => return Err(error.into()),
            }
        }
        let topics_dir = root.join("topics");
        fsutil::create_dir(&topics_dir)?;
        fsutil::sync_dir(&root)?;
        let mut topics = BTreeMap::new();
        for spec in topics::list(&topics_dir)? {
            let name = spec.name.clone();
            topics.insert(name, Arc::new(topics::open(&topics_dir, spec, &options)?));
        }
        let inner = Arc::new(Inner {
            root,
            topics_dir,
            options,
            topics: RwLock::new(topics),
            auth: RwLock::new(None),
            watches: None,
            _lock: Some(lock),
        });
        let flusher = match inner.options.durability {
            Durability::Interval(ms) => Some(Flusher::start(Arc::clone(&inner), ms)?),
            Durability::Sync => None,
        };
        Ok(Self {
            inner,
            flusher,
            primary: true,
        })
    }

    fn open_reader(root: PathBuf, options: Options) -> Result<Self, BusError> {
        if !std::fs::metadata(&root)?.is_dir() {
            return Err(BusError::invalid(
                "path",
                format!("{} is not a directory", root.display()),
            ));
        }
        let watches = Some(Watches::new(Arc::clone(&options.notifier)));
        let inner = Arc::new(Inner {
            topics_dir: root.join("topics"),
            root,
            options,
            topics: RwLock::new(BTreeMap::new()),
            auth: RwLock::new(None),
            watches,
            _lock: None,
        });
        inner.discover()?;
        Ok(Self {
            inner,
            flusher: None,
            primary: true,
        })
    }

    /// Another handle on the same open bus, for work moved off the
    /// caller's thread; dropping it closes nothing.
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    pub(crate) fn handle(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            flusher: None,
            primary: false,
        }
    }
}

impl Flusher {
    fn start(inner: Arc<Inner>, ms: u64) -> Result<Self, BusError> {
        let (stop, stopped) = mpsc::channel::<()>();
        let period = Duration::from_millis(ms.max(1));
        let thread = std::thread::Builder::new()
            .name("bus-embedded-flush".to_owned())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(period) {
                    inner.flush_all();
                }
                inner.flush_all();
            })?;
        Ok(Self { stop, thread })
    }
}

impl Drop for EmbeddedBus {
    fn drop(&mut self) {
        if !self.primary {
            return;
        }
        // Its subscriptions end (their feeds hold the state only weakly).
        self.inner.options.notifier.close_all();
        if let Some(Flusher { stop, thread }) = self.flusher.take() {
            drop(stop);
            let _ = thread.join();
        }
        // A commit thread of the async surface may hold a partition past
        // the bus: stopped here, every partition closes with the bus's
        // state, before the directory lock (dropped last) is released.
        let topics: Vec<_> = read(&self.inner.topics).values().cloned().collect();
        for topic in topics {
            for partition in &topic.partitions {
                partition.stop_committer();
            }
        }
    }
}

impl EventBus for EmbeddedBus {
    fn set_control_key(&self, key: [u8; 32]) -> Result<(), BusError> {
        *write(&self.inner.auth) = Some(RecordAuth::new(&key));
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
        bus_core::backend::validate_uid(event_uid)?;
        self.publish_one(topic, key, value, Some(event_uid), &Headers::new())
    }

    /// Headers travel in the record's frame (C25, record flag bit 2).
    fn publish_with_headers(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        if let Some(uid) = event_uid {
            bus_core::backend::validate_uid(uid)?;
        }
        self.publish_one(topic, key, value, event_uid, headers)
    }

    fn fetch_with_headers(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        let topic = self.inner.topic(topic)?;
        check_partition(&topic.spec.name, partition, topic.spec.partitions)?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let auth = self.inner.auth();
        #[cfg(feature = "cold")]
        return crate::cold::fetch(
            &self.inner,
            &topic.spec.name,
            partition,
            offset,
            max,
            auth.as_ref(),
        );
        #[cfg(not(feature = "cold"))]
        self.inner
            .readable(&topic.spec.name, partition)?
            .fetch(offset, max, auth.as_ref())
    }
    fn find_event_by_uid(
        &self,
        topic_name: &str,
        key: &str,
        event_uid: &str,
    ) -> Result<Option<PublishAck>, BusError> {
        let topic = self.inner.topic(topic_name)?;
        let partition = uid_partition(&topic.spec, key, event_uid)?;
        let auth = self.inner.auth();
        Ok(self
            .inner
            .readable(topic_name, partition)?
            .find_uid(event_uid, auth.as_ref())?
            .map(|offset| PublishAck {
                topic: topic_name.to_owned(),
                partition,
                offset,
            }))
    }
    fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        let entry = self.inner.topic(topic)?;
        let spec = &entry.spec;
        check_partition(&spec.name, partition, spec.partitions)?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let part = self.inner.readable(&spec.name, partition)?;
        #[cfg(feature = "cold")]
        if offset < part.offsets().first {
            return Ok(self
                .fetch_with_headers(topic, partition, offset, max)?
                .into_iter()
                .map(|record| record.event)
                .collect());
        }
        // The events alone: no header map built per record.
        part.fetch_as(
            offset,
            max,
            self.inner.auth().as_ref(),
            crate::partition::Partition::event_only,
        )
    }
    /// With a cold tier attached (feature `cold`), `first` is the tier's
    /// first offset when it holds any (C24: the retained range includes
    /// cold history; `StartAt::Beginning` and durable consumers begin
    /// there); [`cold::hot_offsets`](crate::cold::hot_offsets) gives the hot log's own.
    fn offsets(&self, topic: &str, partition: u32) -> Result<PartitionOffsets, BusError> {
        let part = self.inner.readable(topic, partition)?;
        #[cfg(feature = "cold")]
        return crate::cold::offsets(&part, topic, partition);
        #[cfg(not(feature = "cold"))]
        Ok(part.offsets())
    }

    /// Drops the whole segments below `offset` (see the trait; a segment
    /// that also holds `offset` or later records stays).
    fn delete_below(&self, topic: &str, partition: u32, offset: u64) -> Result<u64, BusError> {
        self.inner.writable("delete_below")?;
        self.inner.readable(topic, partition)?.delete_below(offset)
    }

    fn partitions(&self, topic: &str) -> Result<u32, BusError> {
        Ok(self.inner.topic(topic)?.spec.partitions)
    }

    fn topics(&self) -> Vec<String> {
        if self.inner.options.read_only {
            // Topics a writer provisioned since; an unreadable one shows
            // up as an error on the calls that name it.
            let _ = self.inner.discover();
        }
        read(&self.inner.topics).keys().cloned().collect()
    }
    fn maintenance(&self, now_ms: u64) -> Result<u64, BusError> {
        self.inner.writable("maintenance")?;
        let topics: Vec<Arc<Topic>> = read(&self.inner.topics).values().cloned().collect();
        let mut expired = 0;
        for topic in topics {
            // Periodic maintenance also advances every partition's recovery
            // point, so a crash leaves less of the log unverified.
            for partition in &topic.partitions {
                partition.save_recovery_point()?;
            }
            // A tier the manifest declares is kept here (C24): archived
            // through the head before hot retention, expired after it.
            #[cfg(feature = "cold")]
            crate::cold::archive_for_retention(self, &topic.spec)?;
            if let Some(retention) = topic.spec.retention_ms {
                let cutoff = now_ms.saturating_sub(retention);
                for (id, partition) in (0u32..).zip(&topic.partitions) {
                    #[cfg(feature = "cold")]
                    {
                        expired += crate::cold::expire(partition, &topic.spec.name, id, cutoff)?;
                    }
                    #[cfg(not(feature = "cold"))]
                    {
                        let _ = id;
                        expired += partition.expire(cutoff)?;
                    }
                }
            }
            #[cfg(feature = "cold")]
            {
                expired += crate::cold::cold_retention(self, &topic.spec, now_ms)?;
            }
        }
        Ok(expired)
    }

    /// On a read-only open, succeeds only when every topic already exists
    /// as specified (nothing to write).
    fn provision(&self, manifest: &Manifest) -> Result<(), BusError> {
        manifest.validate()?;
        #[cfg(not(feature = "cold"))]
        manifest.refuse_cold("the embedded log built without its cold feature")?;
        if self.inner.options.read_only {
            self.inner.discover()?;
        }
        // Declared cold tiers answer before anything is created (C24).
        #[cfg(feature = "cold")]
        let declared = crate::cold::open_declared(self, manifest)?;
        let mut topics = write(&self.inner.topics);
        for spec in &manifest.topics {
            if let Some(existing) = topics.get(&spec.name) {
                spec.conflict_with(&existing.spec)?;
            }
        }
        for spec in &manifest.topics {
            if let Some(existing) = topics.get(&spec.name) {
                // Only the compression and the cold section can differ here
                // (checked above): like Kafka's compression.type they may
                // change, and a manifest without a cold section leaves the
                // topic's declared tier as it is.
                let mut spec = spec.clone();
                if spec.cold.is_none() {
                    spec.cold.clone_from(&existing.spec.cold);
                }
                if existing.spec != spec {
                    self.inner.writable("provision")?;
                    let changed = existing.respecified(&self.inner.topics_dir, &spec)?;
                    tracing::info!(
                        topic = %spec.name,
                        compression = %spec.compression,
                        cold = ?spec.cold,
                        "topic spec changed; frames written before stay as they are"
                    );
                    topics.insert(spec.name.clone(), Arc::new(changed));
                }
                continue;
            }
            self.inner.writable("provision")?;
            topics::create(&self.inner.topics_dir, spec)?;
            let opened = topics::open(&self.inner.topics_dir, spec.clone(), &self.inner.options)?;
            topics.insert(spec.name.clone(), Arc::new(opened));
        }
        drop(topics);
        #[cfg(feature = "cold")]
        crate::cold::attach_declared(self, declared)?;
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::minimal("embedded")
            .durable(true)
            .dedup_horizon(DedupHorizon::Retained)
            .maintenance_retention(true)
            .exclusive_open(true)
            .native_batch(true)
            .headers(true)
            .ack_durability(match self.inner.options.durability {
                Durability::Sync => bus_core::AckDurability::Disk,
                Durability::Interval(_) => bus_core::AckDurability::None,
            })
    }
    fn topic_spec(&self, topic: &str) -> Result<Option<bus_core::TopicSpec>, BusError> {
        if self.inner.options.read_only {
            // The writer may have changed the spec since this bus looked.
            self.inner.discover()?;
        }
        Ok(Some(self.inner.topic(topic)?.spec.clone()))
    }

    /// Validates the whole batch first (a bad record stores nothing), then
    /// writes one frame per partition the batch touches.
    fn publish_batch(
        &self,
        topic_name: &str,
        records: &[BatchRecord],
    ) -> Result<Vec<PublishAck>, BusError> {
        self.publish_items(topic_name, &BatchItem::all(records))
    }

    /// As `publish_batch`, headers in each record's frame (C25).
    fn publish_batch_with_headers(
        &self,
        topic_name: &str,
        records: &[BatchRecordWithHeaders],
    ) -> Result<Vec<PublishAck>, BusError> {
        self.publish_items(topic_name, &BatchItem::all(records))
    }
    fn subscribe(
        &self,
        topic: &str,
        selector: Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> Result<Subscription, BusError> {
        crate::subscribe::subscribe(self, &self.inner, topic, &selector, start, options)
    }
}
