//! Publishing (contracts C3, C4, C6, C12, C14): validate, sign, produce onto
//! the bus-chosen partition, take the offset from the delivery report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bus_core::auth::{RecordAuth, to_hex};
use bus_core::backend::{BatchItem, prepare_record_with};
use bus_core::{BusError, Headers, PublishAck};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::BaseRecord;

use crate::client::{Delivery, Late, Reply, Ticket, remaining};
use crate::errors::{map_error, timed_out};
use crate::locate::{self, Delivered};
use crate::reader::{TAG_HEADER, UID_HEADER};
use crate::registry::Entry;
use crate::{Core, KafkaBus, dedup};
use bus_core::backend::sync::lock;

/// A checked, signed record ready to produce.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    pub key: String,
    pub uid: Option<String>,
    pub value: Vec<u8>,
    pub partition: u32,
    pub tag: Option<String>,
    /// The caller's headers (C25), produced as Kafka record headers.
    pub headers: Headers,
}

/// [`prepare`] of each record of a batch, in order; the first error
/// refuses the whole batch (nothing is produced).
pub(crate) fn prepare_all(
    auth: Option<&RecordAuth>,
    entry: &Entry,
    records: &[BatchItem<'_>],
) -> Result<Vec<Prepared>, BusError> {
    records
        .iter()
        .map(|r| prepare(auth, entry, r.key, r.value, r.uid, r.headers))
        .collect()
}

/// Validates one record of `entry`'s topic and signs it when a key is set.
pub(crate) fn prepare(
    auth: Option<&RecordAuth>,
    entry: &Entry,
    key: &str,
    value: &serde_json::Value,
    uid: Option<&str>,
    headers: &Headers,
) -> Result<Prepared, BusError> {
    let record = prepare_record_with(&entry.spec, key, value, uid, headers, auth)?;
    Ok(Prepared {
        key: record.key.to_owned(),
        uid: record.uid.map(str::to_owned),
        value: record.value,
        partition: record.partition,
        tag: record.tag.map(|tag| to_hex(tag.as_slice())),
        headers: record.headers,
    })
}

/// Produces `records` in order (librdkafka batches them) and waits for every
/// delivery report until `deadline`; one offset or error per record (a
/// record reported stored without an offset is found by reading it back,
/// see [`crate::locate`]). A record's report also goes to its slot in
/// `lates`, if any.
pub(crate) fn produce(
    core: &Core,
    topic: &str,
    records: &[Prepared],
    lates: &[Option<Arc<Late>>],
    deadline: Instant,
) -> Vec<Result<u64, BusError>> {
    let start = locate::Start::now(core, topic, records);
    let delivered = deliver(core, records.len(), lates, deadline, |index, ticket| {
        to_record(topic, &records[index], ticket)
    });
    let out = locate::resolve(core, topic, records, delivered, &start, deadline);
    stored(topic, records, &out);
    out
}

/// Counts the records of `records` whose delivery succeeded (metrics).
pub(crate) fn stored(topic: &str, records: &[Prepared], outcomes: &[Result<u64, BusError>]) {
    let (count, bytes) = outcomes
        .iter()
        .zip(records)
        .filter(|(outcome, _)| outcome.is_ok())
        .fold((0, 0), |(n, bytes), (_, record)| {
            (n + 1, bytes + record.value.len() as u64)
        });
    bus_core::backend::metrics::stored("kafka", topic, count, bytes);
}

/// The librdkafka record of `record`, carrying `ticket`.
pub(crate) fn to_record<'a>(
    topic: &'a str,
    record: &'a Prepared,
    ticket: Box<Ticket>,
) -> BaseRecord<'a, str, [u8], Box<Ticket>> {
    let mut headers = OwnedHeaders::new_with_capacity(2 + record.headers.len());
    for (name, value) in record.headers.iter() {
        headers = headers.insert(Header {
            key: name,
            value: Some(value),
        });
    }
    if let Some(uid) = &record.uid {
        headers = headers.insert(Header {
            key: UID_HEADER,
            value: Some(uid.as_str()),
        });
    }
    if let Some(tag) = &record.tag {
        headers = headers.insert(Header {
            key: TAG_HEADER,
            value: Some(tag.as_str()),
        });
    }
    let base = BaseRecord::with_opaque_to(topic, ticket)
        .partition(i32::try_from(record.partition).unwrap_or(i32::MAX))
        .key(record.key.as_str())
        .payload(record.value.as_slice());
    // No header block at all when there is nothing to carry: readers
    // then skip header parsing.
    if record.uid.is_none() && record.tag.is_none() && record.headers.is_empty() {
        base
    } else {
        base.headers(headers)
    }
}

/// Enqueues `count` records made by `make` strictly in order (retrying the
/// same record while librdkafka's queue is full, so none overtakes another)
/// and collects their delivery reports (copied to `lates[i]` when set; a
/// record never enqueued gets its error there). `Ok(None)` is a record
/// stored whose report had no offset.
pub(crate) fn deliver<'a>(
    core: &Core,
    count: usize,
    lates: &[Option<Arc<Late>>],
    deadline: Instant,
    make: impl Fn(usize, Box<Ticket>) -> BaseRecord<'a, str, [u8], Box<Ticket>>,
) -> Vec<Delivered> {
    // Only UID records are tracked past their call: they go through the
    // producer that keeps trying through a failover.
    let kind = if lates.is_empty() {
        Delivery::Plain
    } else {
        Delivery::Uid
    };
    let producer = core.producer(kind);
    let (reply, replies) = std::sync::mpsc::channel();
    let mut out: Vec<Option<Delivered>> = Vec::new();
    out.resize_with(count, || None);
    let mut outstanding = 0usize;
    for (index, slot) in out.iter_mut().enumerate() {
        let late = lates.get(index).cloned().flatten();
        let ticket = Box::new(Ticket {
            index,
            reply: Reply::Thread(reply.clone()),
            late: late.clone(),
        });
        let mut record = make(index, ticket);
        loop {
            match producer.send(record) {
                Ok(()) => {
                    outstanding += 1;
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if Instant::now() < deadline =>
                {
                    record = back;
                    std::thread::park_timeout(Duration::from_millis(1));
                }
                Err((error, _)) => {
                    if let Some(late) = &late {
                        late.set(Err(error.clone()));
                    }
                    core.heal_producer(kind, &producer);
                    *slot = Some(Err(map_error(&core.options, "publish", error)));
                    break;
                }
            }
        }
    }
    drop(reply);
    while outstanding > 0 {
        let Ok((index, outcome)) = replies.recv_timeout(remaining(deadline)) else {
            break;
        };
        outstanding -= 1;
        out[index] = Some(match outcome {
            Ok(offset) => Ok(u64::try_from(offset).ok()),
            Err(error) => {
                core.heal_producer(kind, &producer);
                Err(map_error(&core.options, "publish", error))
            }
        });
    }
    if out.iter().any(Option::is_none) {
        // No report by the deadline: a producer stuck after a broker
        // restart is replaced (see Core::heal_stalled).
        core.heal_stalled(kind, &producer);
    }
    out.into_iter()
        .map(|outcome| outcome.unwrap_or_else(|| Err(timed_out(&core.options, "publish"))))
        .collect()
}

impl KafkaBus {
    /// One publish: a UID goes through the partition's dedup index.
    pub(crate) fn publish_one(
        &self,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        let entry = self.entry(topic)?;
        let record = prepare(self.core.auth().as_ref(), &entry, key, value, uid, headers)?;
        let partition = record.partition;
        let ack = |offset| PublishAck {
            topic: topic.to_owned(),
            partition,
            offset,
        };
        let deadline = self.deadline();
        let offsets = if record.uid.is_none() {
            produce(&self.core, &entry.kafka_topic, &[record], &[], deadline)
        } else {
            publish_deduplicated(&self.core, &entry, vec![record], deadline)?
        };
        offsets
            .into_iter()
            .next()
            .ok_or_else(|| BusError::backend("kafka", "no delivery"))?
            .map(ack)
    }

    /// A batch: validated as a whole first (a bad record stores nothing),
    /// then produced together.
    pub(crate) fn publish_many(
        &self,
        topic: &str,
        records: &[BatchItem<'_>],
    ) -> Result<Vec<PublishAck>, BusError> {
        let entry = self.entry(topic)?;
        let prepared = prepare_all(self.core.auth().as_ref(), &entry, records)?;
        if prepared.is_empty() {
            return Ok(Vec::new());
        }
        let partitions: Vec<u32> = prepared.iter().map(|record| record.partition).collect();
        let deadline = self.deadline();
        let offsets = if prepared.iter().all(|record| record.uid.is_none()) {
            produce(&self.core, &entry.kafka_topic, &prepared, &[], deadline)
        } else {
            publish_deduplicated(&self.core, &entry, prepared, deadline)?
        };
        partitions
            .into_iter()
            .zip(offsets)
            .map(|(partition, offset)| {
                offset.map(|offset| PublishAck {
                    topic: topic.to_owned(),
                    partition,
                    offset,
                })
            })
            .collect()
    }
}

/// Produces `records` (some with UIDs) holding the dedup locks of their
/// partitions: UIDs already stored, or repeated earlier in the batch, get
/// the stored offset and are not produced again.
fn publish_deduplicated(
    core: &Core,
    entry: &Entry,
    records: Vec<Prepared>,
    deadline: Instant,
) -> Result<Vec<Result<u64, BusError>>, BusError> {
    let mut partitions: Vec<u32> = records
        .iter()
        .filter(|record| record.uid.is_some())
        .map(|record| record.partition)
        .collect();
    partitions.sort_unstable();
    partitions.dedup();
    let states: Vec<Arc<dedup::PartitionState>> = partitions
        .iter()
        .map(|&partition| {
            let mut map = lock(&core.partitions);
            Arc::clone(map.entry((entry.spec.name.clone(), partition)).or_default())
        })
        .collect();
    // Locks are taken in partition order, so batches cannot deadlock; each
    // wait ends at the deadline (contract C10).
    let mut guards = Vec::with_capacity(states.len());
    for state in &states {
        guards.push(state.lock_until(&core.options, deadline)?);
    }
    let slot_of = |partition: u32| partitions.binary_search(&partition).ok();
    let auth = core.auth();
    let catch_up = |guard: &mut dedup::IndexGuard<'_>, partition: u32| {
        let checker = dedup::Checker {
            topic: &entry.spec.name,
            partition,
            auth: auth.as_ref(),
        };
        guard.settle();
        guard.catch_up(
            core,
            &entry.kafka_topic,
            i32::try_from(partition).unwrap_or(i32::MAX),
            entry.spec.dedup_window_ms,
            deadline,
            checker,
        )
    };
    for (&partition, guard) in partitions.iter().zip(guards.iter_mut()) {
        catch_up(guard, partition)?;
    }
    // Which records are new, and which repeat (a stored or an earlier UID).
    let mut out: Vec<Option<Result<u64, BusError>>> = Vec::new();
    out.resize_with(records.len(), || None);
    let mut first_in_batch: std::collections::HashMap<(u32, &str), usize> = Default::default();
    let mut repeats: Vec<(usize, usize)> = Vec::new();
    let mut to_send = Vec::new();
    let mut sent_index = Vec::new();
    for (i, record) in records.iter().enumerate() {
        if let (Some(uid), Some(slot)) = (record.uid.as_deref(), slot_of(record.partition)) {
            if let Some(offset) = guards[slot].get(uid) {
                out[i] = Some(Ok(offset));
                continue;
            }
            // An earlier call's record of this UID, still being delivered:
            // its offset is this call's answer (or it failed, and the UID
            // is produced again).
            if let Some(late) = guards[slot].in_flight(uid) {
                match late.wait_until(deadline) {
                    Some(Ok(offset)) => {
                        guards[slot].settle();
                        out[i] = Some(match u64::try_from(offset) {
                            Ok(offset) => Ok(offset),
                            // Stored, reported without an offset
                            // (crate::locate): the index finds its UID.
                            Err(_) => {
                                catch_up(&mut guards[slot], record.partition).and_then(|()| {
                                    guards[slot].get(uid).ok_or_else(|| {
                                        timed_out(&core.options, "publish (finding a stored UID)")
                                    })
                                })
                            }
                        });
                        continue;
                    }
                    Some(Err(_)) => guards[slot].settle(),
                    None => {
                        out[i] = Some(Err(timed_out(&core.options, "publish")));
                        continue;
                    }
                }
            }
            if let Some(&first) = first_in_batch.get(&(record.partition, uid)) {
                repeats.push((i, first));
                continue;
            }
            first_in_batch.insert((record.partition, uid), i);
        }
        to_send.push(record.clone());
        sent_index.push(i);
    }
    let lates: Vec<Option<Arc<Late>>> = to_send
        .iter()
        .map(|record| record.uid.as_ref().map(|_| Arc::default()))
        .collect();
    let results = produce(core, &entry.kafka_topic, &to_send, &lates, deadline);
    for ((i, result), late) in sent_index.into_iter().zip(results).zip(lates) {
        if let (Some(uid), Some(slot)) = (records[i].uid.as_deref(), slot_of(records[i].partition))
        {
            match (&result, late) {
                (Ok(offset), _) => guards[slot].record(uid, *offset),
                // No report by the deadline: librdkafka still has it.
                (Err(_), Some(late)) if late.peek().is_none() => guards[slot].track(uid, late),
                _ => {}
            }
        }
        out[i] = Some(result);
    }
    for (i, first) in repeats {
        out[i] = Some(match &out[first] {
            Some(Ok(offset)) => Ok(*offset),
            _ => Err(BusError::backend(
                "kafka",
                "the first record with this UID in the batch failed".to_owned(),
            )),
        });
    }
    Ok(out
        .into_iter()
        .map(|result| result.unwrap_or_else(|| Err(BusError::backend("kafka", "no delivery"))))
        .collect())
}
