//! Publishing on the embedded bus: records checked, framed and routed to
//! their partitions (one record, or a batch grouped by partition), and the
//! ack of a one-record publish. The `EventBus` methods in `bus` and the
//! async surface call these; the partition's group commit stores them.

use std::collections::BTreeMap;
use std::sync::Arc;

use bus_core::auth::RecordAuth;
use bus_core::backend::{BatchItem, prepare_record_with};
use bus_core::{BusError, Headers, PublishAck};

use crate::bus::EmbeddedBus;
use crate::log::frame::{NewRecord, encode_headers};
use crate::topics::Topic;

/// A batch's records by partition: their positions in the batch and the
/// framed records, in batch order.
pub(crate) type BatchGroups = BTreeMap<u32, (Vec<usize>, Vec<NewRecord>)>;

impl EmbeddedBus {
    /// Appends a record as given, unsigned and unchecked (test hook for C14).
    pub(crate) fn append_raw(
        &self,
        topic: &str,
        partition: u32,
        record: NewRecord,
    ) -> Result<u64, BusError> {
        self.inner.writable("append")?;
        let topic = self.inner.topic(topic)?;
        let offsets = topic.partition(partition)?.append_foreign(vec![record])?;
        offsets
            .first()
            .copied()
            .ok_or_else(|| BusError::backend("embedded", "raw append stored nothing"))
    }

    /// A batch's records checked and framed, grouped by partition with
    /// their positions in the batch (a bad record fails the whole batch).
    pub(crate) fn group_batch(
        &self,
        topic: &Topic,
        records: &[BatchItem<'_>],
        auth: Option<&RecordAuth>,
    ) -> Result<BatchGroups, BusError> {
        let mut groups = BatchGroups::new();
        for (i, record) in records.iter().enumerate() {
            let (partition, new) = self.record(
                topic,
                record.key,
                record.value,
                record.uid,
                record.headers,
                auth,
            )?;
            let group = groups.entry(partition).or_default();
            group.0.push(i);
            group.1.push(new);
        }
        Ok(groups)
    }

    /// A batch, with or without headers: validated whole first (a bad
    /// record stores nothing), then one frame per partition it touches.
    pub(crate) fn publish_items(
        &self,
        topic_name: &str,
        records: &[BatchItem<'_>],
    ) -> Result<Vec<PublishAck>, BusError> {
        self.inner.writable("publish_batch")?;
        let topic = self.inner.topic(topic_name)?;
        let auth = self.inner.auth();
        let groups = self.group_batch(&topic, records, auth.as_ref())?;
        let mut acks: Vec<Option<PublishAck>> = vec![None; records.len()];
        for (partition, (positions, batch)) in groups {
            let offsets = topic.partition(partition)?.append(batch, auth.clone())?;
            for (i, offset) in positions.into_iter().zip(offsets) {
                acks[i] = Some(PublishAck {
                    topic: topic_name.to_owned(),
                    partition,
                    offset,
                });
            }
        }
        acks.into_iter()
            .map(|ack| ack.ok_or_else(|| BusError::backend("embedded", "batch record not acked")))
            .collect()
    }

    pub(crate) fn record(
        &self,
        topic: &Topic,
        key: &str,
        value: &serde_json::Value,
        uid: Option<&str>,
        headers: &Headers,
        auth: Option<&RecordAuth>,
    ) -> Result<(u32, NewRecord), BusError> {
        let record = prepare_record_with(&topic.spec, key, value, uid, headers, auth)?;
        let encoded = encode_headers(&record.headers)
            .map_err(|reason| BusError::invalid("headers", reason))?;
        let (partition, uid, bytes) = (record.partition, record.uid, record.value);
        let tag = record.tag.map(|tag| tag.to_vec());
        Ok((
            partition,
            NewRecord {
                key: key.to_owned(),
                uid: uid.map(str::to_owned),
                tag,
                headers: encoded,
                value: bytes,
            },
        ))
    }

    /// The checks and preparation of a one-record publish (sync or async):
    /// the bus is writable, the topic exists, the record is valid; its
    /// partition picked and its tag computed.
    pub(crate) fn one_record(
        &self,
        topic_name: &str,
        key: &str,
        value: &serde_json::Value,
        uid: Option<&str>,
        headers: &Headers,
    ) -> Result<OneRecord, BusError> {
        self.inner.writable(if uid.is_some() {
            "publish_idempotent"
        } else {
            "publish"
        })?;
        let topic = self.inner.topic(topic_name)?;
        let auth = self.inner.auth();
        let (partition, record) = self.record(&topic, key, value, uid, headers, auth.as_ref())?;
        Ok(OneRecord {
            topic,
            partition,
            record,
            auth,
        })
    }

    pub(crate) fn publish_one(
        &self,
        topic_name: &str,
        key: &str,
        value: &serde_json::Value,
        uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        let one = self.one_record(topic_name, key, value, uid, headers)?;
        let offsets = one
            .topic
            .partition(one.partition)?
            .append(vec![one.record], one.auth)?;
        one_ack(topic_name, one.partition, &offsets)
    }
}

/// A checked record of a one-record publish and where it goes.
pub(crate) struct OneRecord {
    pub topic: Arc<Topic>,
    pub partition: u32,
    pub record: NewRecord,
    pub auth: Option<RecordAuth>,
}

/// The ack of a one-record publish that stored `offsets`.
pub(crate) fn one_ack(
    topic: &str,
    partition: u32,
    offsets: &[u64],
) -> Result<PublishAck, BusError> {
    let offset = offsets
        .first()
        .copied()
        .ok_or_else(|| BusError::backend("embedded", "publish stored nothing"))?;
    Ok(PublishAck {
        topic: topic.to_owned(),
        partition,
        offset,
    })
}
