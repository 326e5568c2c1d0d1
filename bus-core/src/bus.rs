//! The `EventBus` trait: the portability boundary every backend implements.

use crate::subscription::{Feed, Selector, StartAt, SubscribeOptions, Subscription};
use crate::{
    BatchRecord, BatchRecordWithHeaders, BusError, Capabilities, Headers, Manifest, PublishAck,
    StoredEvent, StoredRecord, partition_for,
};

/// Publish/consume abstraction. Synchronous by design: the harness calls it
/// from worker threads (never the hot path), and network backends manage
/// their own I/O runtime internally.
///
/// The required methods and the first four provided ones are exactly those of
/// the reference trait, so code written against it compiles unchanged; the
/// rest are provided methods with conservative defaults.
pub trait EventBus: Send + Sync {
    /// Configure the signer-derived key used for authenticated local controls.
    fn set_control_key(&self, _key: [u8; 32]) -> Result<(), BusError> {
        Ok(())
    }

    /// Publish `value` onto `topic`, partitioned by `key`. Returns the ack.
    fn publish(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
    ) -> Result<PublishAck, BusError>;

    /// Publish a stable event UID. Backends with native or local deduplication
    /// override this method; the default preserves compatibility while the UID
    /// remains embedded in the event payload for downstream deduplication.
    fn publish_idempotent(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        _event_uid: &str,
    ) -> Result<PublishAck, BusError> {
        self.publish(topic, key, value)
    }

    /// Locate an already committed event by stable UID during crash recovery.
    ///
    /// The default scans the key's partition from offset 0; every backend of
    /// this workspace overrides it with an indexed lookup.
    fn find_event_by_uid(
        &self,
        topic: &str,
        key: &str,
        event_uid: &str,
    ) -> Result<Option<PublishAck>, BusError> {
        let partition = partition_for(key, self.partitions(topic)?);
        let mut offset = 0u64;
        loop {
            let events = self.fetch(topic, partition, offset, 1_024)?;
            let Some(last) = events.last() else {
                return Ok(None);
            };
            if let Some(found) = events
                .iter()
                .find(|event| crate::embedded_uid(&event.value) == Some(event_uid))
            {
                return Ok(Some(PublishAck {
                    topic: topic.to_owned(),
                    partition,
                    offset: found.offset,
                }));
            }
            let next = last
                .offset
                .checked_add(1)
                .ok_or_else(|| BusError::backend("bus", "event lookup offset overflow"))?;
            if next <= offset {
                return Err(BusError::backend(
                    "bus",
                    "event lookup made no offset progress".to_owned(),
                ));
            }
            offset = next;
        }
    }

    /// Read up to `max` events from `topic`/`partition` starting at `offset`
    /// (ordered replay).
    fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError>;

    /// Number of partitions configured for `topic`.
    fn partitions(&self, topic: &str) -> Result<u32, BusError>;

    /// Topics currently provisioned.
    fn topics(&self) -> Vec<String>;

    /// Run backend maintenance such as hot-retention expiry. Managed brokers
    /// may return zero when retention is enforced natively.
    fn maintenance(&self, _now_ms: u64) -> Result<u64, BusError> {
        Ok(0)
    }

    /// Creates the manifest's missing topics and verifies the existing ones
    /// (contract C1). Running it twice is a no-op.
    fn provision(&self, _manifest: &Manifest) -> Result<(), BusError> {
        Err(BusError::Unsupported {
            operation: "provision".to_owned(),
            backend: self.capabilities().backend.to_owned(),
        })
    }

    /// What this backend promises.
    fn capabilities(&self) -> Capabilities {
        Capabilities::minimal("unknown")
    }

    /// The spec `topic` was provisioned with, where the backend keeps it
    /// (`None`: the backend does not report it). An unknown topic is
    /// [`BusError::UnknownTopic`].
    fn topic_spec(&self, topic: &str) -> Result<Option<crate::TopicSpec>, BusError> {
        self.partitions(topic)?;
        Ok(None)
    }

    /// The retained offset range of a partition.
    ///
    /// The default pages through the partition (cost grows with its length)
    /// and cannot see offsets of records that were all expired; backends
    /// override it with what they know.
    fn offsets(&self, topic: &str, partition: u32) -> Result<PartitionOffsets, BusError> {
        let Some(first) = self
            .fetch(topic, partition, 0, 1)?
            .first()
            .map(|e| e.offset)
        else {
            return Ok(PartitionOffsets { first: 0, next: 0 });
        };
        let mut next = first;
        loop {
            let page = self.fetch(topic, partition, next, 1_024)?;
            let Some(last) = page.last() else {
                return Ok(PartitionOffsets { first, next });
            };
            next = last.offset.saturating_add(1);
        }
    }

    /// Publishes `records` onto `topic` in order, returning one ack per
    /// record. The default publishes one at a time and stops at the first
    /// error; backends override it with a pipelined or single-write version.
    fn publish_batch(
        &self,
        topic: &str,
        records: &[BatchRecord],
    ) -> Result<Vec<PublishAck>, BusError> {
        records
            .iter()
            .map(|record| match &record.uid {
                Some(uid) => self.publish_idempotent(topic, &record.key, &record.value, uid),
                None => self.publish(topic, &record.key, &record.value),
            })
            .collect()
    }

    /// [`EventBus::publish_batch`] of records with headers (C25): each
    /// record's headers are checked against the limits of [`Headers`] as
    /// [`EventBus::publish_with_headers`] checks them, with the rest of
    /// the batch, before anything is stored (one bad header refuses the
    /// whole batch), then stored in the backend's native place and covered
    /// by the record's tag. The acks come in the records' order.
    ///
    /// The default takes a batch without headers as
    /// [`EventBus::publish_batch`] and refuses headers as
    /// [`BusError::Unsupported`] (after checking them): a backend that
    /// does not store headers never drops them silently.
    fn publish_batch_with_headers(
        &self,
        topic: &str,
        records: &[BatchRecordWithHeaders],
    ) -> Result<Vec<PublishAck>, BusError> {
        let plain = crate::batch::without_headers(records, self.capabilities().backend)?;
        self.publish_batch(topic, &plain)
    }

    /// Publishes `value` with `headers` (C25), under `event_uid` when given
    /// (as [`EventBus::publish_idempotent`]): the headers are checked
    /// against the limits of [`Headers`] (nothing is stored when they
    /// break one), stored in the backend's native place and covered by
    /// the record's tag.
    ///
    /// The default takes empty headers as a plain publish and refuses
    /// others as [`BusError::Unsupported`]: a backend that does not store
    /// headers never drops them silently.
    fn publish_with_headers(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        if !headers.is_empty() {
            headers.validate()?;
            return Err(BusError::Unsupported {
                operation: "publish_with_headers".to_owned(),
                backend: self.capabilities().backend.to_owned(),
            });
        }
        match event_uid {
            Some(uid) => self.publish_idempotent(topic, key, value, uid),
            None => self.publish(topic, key, value),
        }
    }

    /// [`EventBus::fetch`] with each record's headers (C25). The default
    /// fetches and gives every record empty headers, which is right for a
    /// backend whose [`EventBus::publish_with_headers`] refuses headers.
    fn fetch_with_headers(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        Ok(self
            .fetch(topic, partition, offset, max)?
            .into_iter()
            .map(StoredRecord::from)
            .collect())
    }

    /// Drops the retained records of `topic`/`partition` below `offset`
    /// (offsets are never reused, C4; the log start moves up to `offset`,
    /// never past the head) and returns how many were dropped. What a cold
    /// tier's archiver calls once those records are archived (C24), so hot
    /// retention never drops a record the tier does not hold.
    ///
    /// The default refuses ([`BusError::Unsupported`]): a backend that
    /// cannot drop a prefix of a partition on demand says so.
    fn delete_below(&self, topic: &str, partition: u32, offset: u64) -> Result<u64, BusError> {
        let _ = (topic, partition, offset);
        Err(BusError::Unsupported {
            operation: "delete_below".to_owned(),
            backend: self.capabilities().backend.to_owned(),
        })
    }

    /// A live subscription to `topic` (contract C17–C19): the records the
    /// `selector` picks, from `start` on, history then the live tail, each
    /// once and in partition order. See [`Subscription`].
    ///
    /// The default refuses; every backend of this workspace overrides it.
    fn subscribe(
        &self,
        topic: &str,
        selector: Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> Result<Subscription, BusError> {
        let _ = (topic, selector, start, options);
        Err(BusError::Unsupported {
            operation: "subscribe".to_owned(),
            backend: self.capabilities().backend.to_owned(),
        })
    }
}

/// A [`Feed`] that reads through a bus's own `fetch` and `offsets`: what a
/// backend with a cheap local fetch (memory, embedded) subscribes with.
#[derive(Debug)]
pub struct FetchFeed<B> {
    bus: B,
    topic: String,
}

impl<B> FetchFeed<B> {
    /// A feed of `topic` read through `bus` (an owned handle).
    pub fn new(bus: B, topic: impl Into<String>) -> Self {
        Self {
            bus,
            topic: topic.into(),
        }
    }
}

impl<B: EventBus + 'static> Feed for FetchFeed<B> {
    fn read(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        self.bus.fetch(&self.topic, partition, from, max)
    }

    fn read_records(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        self.bus
            .fetch_with_headers(&self.topic, partition, from, max)
    }

    fn read_records_below_head(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        self.read_records(partition, from, max)
    }

    fn head(&mut self, partition: u32) -> Result<u64, BusError> {
        Ok(self.bus.offsets(&self.topic, partition)?.next)
    }
}

/// Forwards every method, so a bus travels as `Box<T>`, `Arc<T>` or `&T`.
macro_rules! forward_event_bus {
    ($($impl_head:tt)*) => {
        $($impl_head)* {
            fn set_control_key(&self, key: [u8; 32]) -> Result<(), BusError> {
                (**self).set_control_key(key)
            }
            fn publish(&self, topic: &str, key: &str, value: &serde_json::Value) -> Result<PublishAck, BusError> {
                (**self).publish(topic, key, value)
            }
            fn publish_idempotent(&self, topic: &str, key: &str, value: &serde_json::Value, event_uid: &str) -> Result<PublishAck, BusError> {
                (**self).publish_idempotent(topic, key, value, event_uid)
            }
            fn find_event_by_uid(&self, topic: &str, key: &str, event_uid: &str) -> Result<Option<PublishAck>, BusError> {
                (**self).find_event_by_uid(topic, key, event_uid)
            }
            fn fetch(&self, topic: &str, partition: u32, offset: u64, max: usize) -> Result<Vec<StoredEvent>, BusError> {
                (**self).fetch(topic, partition, offset, max)
            }
            fn partitions(&self, topic: &str) -> Result<u32, BusError> {
                (**self).partitions(topic)
            }
            fn topics(&self) -> Vec<String> {
                (**self).topics()
            }
            fn maintenance(&self, now_ms: u64) -> Result<u64, BusError> {
                (**self).maintenance(now_ms)
            }
            fn provision(&self, manifest: &Manifest) -> Result<(), BusError> {
                (**self).provision(manifest)
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            fn topic_spec(&self, topic: &str) -> Result<Option<crate::TopicSpec>, BusError> {
                (**self).topic_spec(topic)
            }
            fn offsets(&self, topic: &str, partition: u32) -> Result<PartitionOffsets, BusError> {
                (**self).offsets(topic, partition)
            }
            fn publish_batch(&self, topic: &str, records: &[BatchRecord]) -> Result<Vec<PublishAck>, BusError> {
                (**self).publish_batch(topic, records)
            }
            fn publish_batch_with_headers(&self, topic: &str, records: &[BatchRecordWithHeaders]) -> Result<Vec<PublishAck>, BusError> {
                (**self).publish_batch_with_headers(topic, records)
            }
            fn subscribe(&self, topic: &str, selector: Selector, start: StartAt, options: SubscribeOptions) -> Result<Subscription, BusError> {
                (**self).subscribe(topic, selector, start, options)
            }
            fn publish_with_headers(&self, topic: &str, key: &str, value: &serde_json::Value, event_uid: Option<&str>, headers: &Headers) -> Result<PublishAck, BusError> {
                (**self).publish_with_headers(topic, key, value, event_uid, headers)
            }
            fn fetch_with_headers(&self, topic: &str, partition: u32, offset: u64, max: usize) -> Result<Vec<StoredRecord>, BusError> {
                (**self).fetch_with_headers(topic, partition, offset, max)
            }
            fn delete_below(&self, topic: &str, partition: u32, offset: u64) -> Result<u64, BusError> {
                (**self).delete_below(topic, partition, offset)
            }
        }
    };
}

forward_event_bus!(impl<T: EventBus + ?Sized> EventBus for Box<T>);
forward_event_bus!(impl<T: EventBus + ?Sized> EventBus for std::sync::Arc<T>);
forward_event_bus!(impl<T: EventBus + ?Sized> EventBus for &T);

/// The retained range of a partition: records `first..next` (empty when equal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartitionOffsets {
    /// Offset of the oldest retained record (the log start).
    pub first: u64,
    /// Offset the next stored record will get.
    pub next: u64,
}

impl PartitionOffsets {
    /// Records retained.
    pub fn retained(&self) -> u64 {
        self.next.saturating_sub(self.first)
    }
}

/// Conveniences over any [`EventBus`], by blanket impl.
pub trait EventBusExt: EventBus {
    /// Every retained record of a partition from `offset` on, fetched in
    /// pages of `page` records.
    fn fetch_all(
        &self,
        topic: &str,
        partition: u32,
        mut offset: u64,
        page: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        let mut out = Vec::new();
        loop {
            let events = self.fetch(topic, partition, offset, page.max(1))?;
            let Some(last) = events.last() else {
                return Ok(out);
            };
            offset = last.offset.saturating_add(1);
            out.extend(events);
        }
    }
}

impl<T: EventBus + ?Sized> EventBusExt for T {}
