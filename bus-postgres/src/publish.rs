//! Publishing (contracts C4, C6, C8, C12, C14) with group commit.
//!
//! Each partition has a queue. The publisher that finds it idle starts a
//! flush task; every publisher arriving while a round commits waits for the
//! next round, so concurrent publishers of a partition share one transaction
//! and one commit (one WAL flush), and throughput grows with concurrency.
//!
//! A round is, in the usual case, one statement in one round trip (see
//! `Sql::append`): advance the partition's counter row (its row lock orders
//! the partition's writers across processes), insert the round's records at
//! the offsets it covered, `NOTIFY` the topic's channel (delivered by the
//! server only after the commit). Records with UIDs are looked up first;
//! when one is stored already, or another writer stores one meanwhile (the
//! claim index refuses the statement, which rolls back whole), the round
//! runs as a transaction that locks the counter row, decides each UID, then
//! inserts. Offsets come from the counter row inside the inserting
//! transaction, so a rolled-back round leaves no hole.
//!
//! With a control key, each record's tag covers its offset and `stored_at`
//! too, so the tags are made where the offsets are known: the one-statement
//! round is sent for the counter value the queue saw last and writes
//! nothing when the counter is elsewhere (another process wrote); the
//! locked transaction reads the counter first.
//!
//! Rows written around the bus never stop the log: a slot at or past the
//! counter that a foreign row occupies is left to it (it stays in the log
//! and reads as `Integrity`) and the round stores past it; a claim on a UID
//! held by a row that is not an authentic record of that UID is released.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};

use bus_core::auth::{RecordAuth, RecordParts, RecordPlace};
use bus_core::{BusError, Headers, backend::prepare_record_with, now_ms};
use tokio::sync::oneshot;
use tokio_postgres::error::SqlState;

use crate::errors::{pg, pool};
use crate::queue::{Prepared, Queue, Request};
use crate::shared::{Shared, Topic};

/// Checks and encodes one record; nothing is sent yet, so a batch with a bad
/// record stores nothing. Its tag is made when its offset is known.
pub(crate) fn prepare(
    topic: &Topic,
    key: &str,
    value: &serde_json::Value,
    uid: Option<&str>,
    headers: &Headers,
) -> Result<Prepared, BusError> {
    let record = prepare_record_with(&topic.spec, key, value, uid, headers, None)?;
    Ok(Prepared {
        partition: record.partition,
        key: record.key.to_owned(),
        uid: record.uid.map(str::to_owned),
        value: record.value,
        headers: record.headers,
    })
}

/// Stores `records` (all of one partition, in order) and returns their
/// offsets: a record whose UID is already stored gets that record's offset.
pub(crate) async fn append(
    shared: Arc<Shared>,
    topic: Arc<Topic>,
    partition: u32,
    records: Vec<Prepared>,
) -> Result<Vec<u64>, BusError> {
    let queue = shared.queue(topic.id, partition);
    let (reply, answer) = oneshot::channel();
    let lead = {
        let mut state = queue.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.pending.push(Request { records, reply });
        !std::mem::replace(&mut state.flushing, true)
    };
    if lead {
        // A task of its own: a publisher whose wait times out must not
        // cancel the round it leads for the others.
        tokio::spawn(flush(shared, topic, partition, queue));
    }
    answer
        .await
        .map_err(|_| BusError::backend("postgres", "the publish round was dropped"))?
}

async fn flush(shared: Arc<Shared>, topic: Arc<Topic>, partition: u32, queue: Arc<Queue>) {
    loop {
        let round = {
            let mut state = queue.state.lock().unwrap_or_else(PoisonError::into_inner);
            if state.pending.is_empty() {
                state.flushing = false;
                return;
            }
            std::mem::take(&mut state.pending)
        };
        let outcome = tokio::time::timeout(
            shared.options.timeout,
            commit_round(&shared, &topic, partition, &round, &queue),
        )
        .await
        .unwrap_or_else(|_| {
            Err(BusError::timeout(
                format!("publish to {:?} partition {partition}", topic.spec.name),
                shared.options.timeout,
            ))
        });
        match outcome {
            Ok(offsets) => {
                let mut offsets = offsets.into_iter();
                for request in round {
                    let mine = offsets.by_ref().take(request.records.len()).collect();
                    let _ = request.reply.send(Ok(mine));
                }
                shared.listener.ring_local(&topic.spec.name);
            }
            Err(error) => {
                queue
                    .state
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .next = None;
                tracing::warn!(
                    "bus-postgres: publish round to {:?} partition {partition} failed: {error}",
                    topic.spec.name
                );
                for request in round {
                    let _ = request.reply.send(Err(same_error(&error)));
                }
            }
        }
    }
}

/// One error for each publisher of a failed round, of the same kind.
fn same_error(error: &BusError) -> BusError {
    match error {
        BusError::Timeout {
            operation,
            after_ms,
        } => BusError::Timeout {
            operation: operation.clone(),
            after_ms: *after_ms,
        },
        BusError::Unavailable {
            backend, reason, ..
        } => BusError::unavailable(backend, reason.clone()),
        other => BusError::backend("postgres", other.to_string()),
    }
}

fn sql_offset(offset: u64) -> Result<i64, BusError> {
    i64::try_from(offset).map_err(|_| BusError::backend("postgres", "offset overflow"))
}

fn offset_of(value: i64) -> Result<u64, BusError> {
    u64::try_from(value)
        .map_err(|_| BusError::backend("postgres", format!("negative offset {value}")))
}

/// Where each record of a round goes: the offset of a stored record of its
/// UID, or the index of a record the round stores.
enum Slot {
    Known(u64),
    New(usize),
}

/// The records of `round` to store (a UID twice in the round is stored
/// once; a UID in `known` not at all), and each record's slot.
fn plan<'a>(
    records: &[&'a Prepared],
    known: &HashMap<&str, u64>,
) -> (Vec<&'a Prepared>, Vec<Slot>) {
    let mut fresh: HashMap<&str, usize> = HashMap::new();
    let mut new = Vec::new();
    let mut slots = Vec::with_capacity(records.len());
    for record in records {
        let uid = record.uid.as_deref();
        if let Some(offset) = uid.and_then(|uid| known.get(uid)) {
            slots.push(Slot::Known(*offset));
        } else if let Some(index) = uid.and_then(|uid| fresh.get(uid)) {
            slots.push(Slot::New(*index));
        } else {
            if let Some(uid) = record.uid.as_deref() {
                fresh.insert(uid, new.len());
            }
            slots.push(Slot::New(new.len()));
            new.push(*record);
        }
    }
    (new, slots)
}

/// The tags of `new` stored at `offsets` at `stored_at` (none without a key).
fn tags(
    auth: Option<&RecordAuth>,
    topic: &Topic,
    partition: u32,
    new: &[&Prepared],
    offsets: &[u64],
    stored_at: u64,
) -> Vec<Option<Vec<u8>>> {
    new.iter()
        .zip(offsets)
        .map(|(record, offset)| {
            auth.map(|auth| {
                let parts = RecordParts {
                    topic: &topic.spec.name,
                    partition,
                    key: &record.key,
                    uid: record.uid.as_deref(),
                    value: &record.value,
                };
                let place = RecordPlace {
                    offset: *offset,
                    stored_at,
                };
                crate::fetch::placed_tag_with(auth, parts, &record.headers, place)
            })
        })
        .collect()
}

fn remember_next(queue: &Queue, next: Option<u64>) {
    queue
        .state
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .next = next;
}

/// Every record of `round` in one statement when none of its UIDs is stored
/// yet (the usual case: one round trip, or two with UIDs) and, with a key,
/// the counter is where the queue saw it last; else, or when another writer
/// stored one of the UIDs or a foreign row holds one of the slots meanwhile,
/// [`commit_locked`]. Their offsets in order.
async fn commit_round(
    shared: &Shared,
    topic: &Topic,
    partition: u32,
    round: &[Request],
    queue: &Queue,
) -> Result<Vec<u64>, BusError> {
    let sql = &shared.sql;
    let auth = shared.auth();
    let expected = queue
        .state
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .next;
    if auth.is_some() && expected.is_none() {
        return commit_locked(shared, topic, partition, round, queue).await;
    }
    let part = i32::try_from(partition).map_err(|_| BusError::backend("postgres", "partition"))?;
    let client = shared.pool.get().await.map_err(pool)?;
    let records: Vec<&Prepared> = round.iter().flat_map(|r| &r.records).collect();
    let uids: Vec<&str> = records.iter().filter_map(|r| r.uid.as_deref()).collect();
    if !uids.is_empty() {
        let claims = client
            .prepare_cached(&sql.claims)
            .await
            .map_err(|e| pg("publish: prepare", &e))?;
        let stored = client
            .query(&claims, &[&topic.id, &part, &uids])
            .await
            .map_err(|e| pg("publish: look up UIDs", &e))?;
        if !stored.is_empty() {
            drop(client);
            return commit_locked(shared, topic, partition, round, queue).await;
        }
    }
    let (new, slots) = plan(&records, &HashMap::new());
    let keys: Vec<&str> = new.iter().map(|r| r.key.as_str()).collect();
    let new_uids: Vec<Option<&str>> = new.iter().map(|r| r.uid.as_deref()).collect();
    let values: Vec<&[u8]> = new.iter().map(|r| r.value.as_slice()).collect();
    let count = new.len() as u64;
    let stored_at = now_ms();
    let base = expected.unwrap_or(0);
    let offsets: Vec<u64> = (base..base + count).collect();
    let tags = tags(auth.as_ref(), topic, partition, &new, &offsets, stored_at);
    let tags: Vec<Option<&[u8]>> = tags.iter().map(Option::as_deref).collect();
    let headers = headers_column(&new)?;
    let expected = match (&auth, expected) {
        (Some(_), Some(expected)) => Some(sql_offset(expected)?),
        _ => None,
    };
    let append = client
        .prepare_cached(&sql.append)
        .await
        .map_err(|e| pg("publish: prepare", &e))?;
    let result = client
        .query_opt(
            &append,
            &[
                &topic.id,
                &part,
                &sql_offset(count)?,
                &keys,
                &new_uids,
                &values,
                &tags,
                &sql_offset(stored_at)?,
                &topic.channel,
                &expected,
                &headers,
            ],
        )
        .await;
    match result {
        Ok(Some(row)) => {
            let base = offset_of(row.get(0))?;
            remember_next(queue, Some(base + count));
            let bytes = values.iter().map(|value| value.len() as u64).sum();
            bus_core::backend::metrics::stored("postgres", &topic.spec.name, count, bytes);
            bus_core::backend::metrics::dedup_hits(
                "postgres",
                &topic.spec.name,
                (records.len() - new.len()) as u64,
            );
            bus_core::backend::metrics::commit_round("postgres", new.len());
            Ok(slots
                .iter()
                .map(|slot| match slot {
                    Slot::Known(offset) => *offset,
                    Slot::New(index) => base + *index as u64,
                })
                .collect())
        }
        // The counter is not where the tags were made for (another writer
        // moved it), or there is no counter row: the locked round decides.
        Ok(None) => {
            drop(client);
            commit_locked(shared, topic, partition, round, queue).await
        }
        Err(error) if error.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
            drop(client);
            commit_locked(shared, topic, partition, round, queue).await
        }
        Err(error) => Err(pg("publish", &error)),
    }
}

/// How often a locked round is tried again when a foreign writer takes a
/// slot or a claim between its checks and its insert.
const LOCKED_ATTEMPTS: usize = 4;

/// [`commit_locked_once`], again while foreign rows race it.
async fn commit_locked(
    shared: &Shared,
    topic: &Topic,
    partition: u32,
    round: &[Request],
    queue: &Queue,
) -> Result<Vec<u64>, BusError> {
    for _ in 0..LOCKED_ATTEMPTS {
        if let Some(offsets) = commit_locked_once(shared, topic, partition, round, queue).await? {
            return Ok(offsets);
        }
    }
    Err(BusError::unavailable(
        "postgres",
        format!(
            "publish to {:?} partition {partition}: rows written around the bus kept taking the next offsets or UID claims ({LOCKED_ATTEMPTS} attempts); try again",
            topic.spec.name
        ),
    ))
}

/// One transaction for every record of `round` under the partition's lock,
/// deciding each UID against what is stored; their offsets in order, or
/// `None` when a row written meanwhile around the bus refused the insert.
async fn commit_locked_once(
    shared: &Shared,
    topic: &Topic,
    partition: u32,
    round: &[Request],
    queue: &Queue,
) -> Result<Option<Vec<u64>>, BusError> {
    let mut client = shared.pool.get().await.map_err(pool)?;
    let tx = client
        .transaction()
        .await
        .map_err(|e| pg("publish: begin", &e))?;
    let records: Vec<&Prepared> = round.iter().flat_map(|r| &r.records).collect();
    let Some(locked) = locked_round(Tx::Pool(&tx), shared, topic, partition, &records).await?
    else {
        return Ok(None);
    };
    tx.commit().await.map_err(|e| pg("publish: commit", &e))?;
    remember_next(queue, Some(locked.next));
    Ok(Some(locked.offsets))
}

/// The transaction a [`locked_round`] runs in: the bus's own (a pooled
/// connection, whose statements are prepared once and cached) or a
/// caller's (prepared per use: the connection is not the pool's).
#[derive(Clone, Copy)]
pub(crate) enum Tx<'a, 'c> {
    Pool(&'a deadpool_postgres::Transaction<'c>),
    Caller(&'a tokio_postgres::Transaction<'c>),
}

impl Tx<'_, '_> {
    fn tx(&self) -> &tokio_postgres::Transaction<'_> {
        match self {
            Self::Pool(tx) => tx,
            Self::Caller(tx) => tx,
        }
    }

    async fn statement(
        &self,
        sql: &str,
    ) -> Result<tokio_postgres::Statement, tokio_postgres::Error> {
        match self {
            Self::Pool(tx) => tx.prepare_cached(sql).await,
            Self::Caller(tx) => tx.prepare(sql).await,
        }
    }
}

/// What a [`locked_round`] stored: each record's offset, and the counter
/// after it.
pub(crate) struct Locked {
    pub(crate) offsets: Vec<u64>,
    pub(crate) next: u64,
}

/// The locked round's statements in `tx`, which the caller commits: the
/// partition's counter row locked (held until `tx` ends), each UID decided
/// against what is stored, the new records inserted with their tags, the
/// counter advanced and the channel notified (delivered at commit). `None`
/// when a row written meanwhile around the bus refused the insert; `tx`
/// is then aborted (a caller that retries does so in a savepoint).
pub(crate) async fn locked_round(
    t: Tx<'_, '_>,
    shared: &Shared,
    topic: &Topic,
    partition: u32,
    records: &[&Prepared],
) -> Result<Option<Locked>, BusError> {
    let sql = &shared.sql;
    let tx = t.tx();
    let name = &topic.spec.name;
    let part = i32::try_from(partition).map_err(|_| BusError::backend("postgres", "partition"))?;
    let row = tx
        .query_opt(
            &t.statement(&sql.lock_partition)
                .await
                .map_err(|e| pg("publish: prepare", &e))?,
            &[&topic.id, &part],
        )
        .await
        .map_err(|e| pg("publish: lock partition", &e))?
        .ok_or_else(|| {
            BusError::backend(
                "postgres",
                format!("topic {name:?} has no counter row for partition {partition}"),
            )
        })?;
    let next_row: i64 = row.get(0);
    let next = offset_of(next_row)?;

    let auth = shared.auth();
    let mut known: HashMap<&str, u64> = HashMap::new();
    let uids: Vec<&str> = records.iter().filter_map(|r| r.uid.as_deref()).collect();
    if !uids.is_empty() {
        let rows = tx
            .query(
                &t.statement(&sql.claims)
                    .await
                    .map_err(|e| pg("publish: prepare", &e))?,
                &[&topic.id, &part, &uids],
            )
            .await
            .map_err(|e| pg("publish: look up UIDs", &e))?;
        let mut forged = Vec::new();
        // Rows come by offset: the first authentic record of a UID answers.
        for row in &rows {
            let uid: Option<&str> = row.get(0);
            let offset: i64 = row.get(1);
            let claim: Option<&str> = row.get(5);
            let wanted = uid.and_then(|uid| uids.iter().copied().find(|wanted| *wanted == uid));
            let authentic = (0..next_row).contains(&offset)
                && wanted.is_some()
                && auth.as_ref().is_none_or(|auth| {
                    let parts = RecordParts {
                        topic: name,
                        partition,
                        key: row.get(2),
                        uid,
                        value: row.get(3),
                    };
                    crate::fetch::row_headers(row.get(7)).is_ok_and(|headers| {
                        crate::fetch::authenticate(
                            auth,
                            parts,
                            &headers,
                            offset,
                            row.get(6),
                            row.get(4),
                        )
                        .is_ok()
                    })
                });
            if let (true, Some(uid)) = (authentic, wanted) {
                known.entry(uid).or_insert(offset_of(offset)?);
            }
            if let Some(claim) = claim
                && !(authentic && uid == Some(claim))
            {
                // A claim held by anything but an authentic record of its
                // UID answers for nothing: the genuine record takes it.
                tracing::warn!(
                    "bus-postgres: topic {name:?} partition {partition} offset {offset} claims UID {claim:?} without being an authentic record of it; releasing the claim"
                );
                forged.push(offset);
            }
        }
        if !forged.is_empty() {
            tx.execute(
                &t.statement(&sql.unclaim)
                    .await
                    .map_err(|e| pg("publish: prepare", &e))?,
                &[&topic.id, &part, &forged],
            )
            .await
            .map_err(|e| pg("publish: release forged UID", &e))?;
        }
    }

    let (new, slots) = plan(records, &known);
    // The slots from the counter on that foreign rows occupy: widened until
    // the window holds a free slot for each new record.
    let occupied = t
        .statement(&sql.occupied)
        .await
        .map_err(|e| pg("publish: prepare", &e))?;
    let mut taken: Vec<u64> = Vec::new();
    let (mut low, mut high) = (next, next + new.len() as u64);
    while low < high {
        let rows = tx
            .query(
                &occupied,
                &[&topic.id, &part, &sql_offset(low)?, &sql_offset(high)?],
            )
            .await
            .map_err(|e| pg("publish: look up slots", &e))?;
        for row in &rows {
            taken.push(offset_of(row.get(0))?);
        }
        (low, high) = (high, high + rows.len() as u64);
    }
    if !taken.is_empty() {
        tracing::warn!(
            "bus-postgres: topic {name:?} partition {partition}: offsets {taken:?} hold rows written around the bus past the counter; they stay in the log (read as Integrity unless authentic) and the bus stores after them"
        );
    }
    let mut offsets = Vec::with_capacity(new.len());
    let mut cursor = next;
    let mut skipped = taken.iter().peekable();
    for _ in &new {
        while skipped.next_if_eq(&&cursor).is_some() {
            cursor += 1;
        }
        offsets.push(cursor);
        cursor += 1;
    }
    let end = high;
    if !new.is_empty() {
        let stored_at = now_ms();
        let tags = tags(auth.as_ref(), topic, partition, &new, &offsets, stored_at);
        let tags: Vec<Option<&[u8]>> = tags.iter().map(Option::as_deref).collect();
        let new_offsets = offsets
            .iter()
            .map(|offset| sql_offset(*offset))
            .collect::<Result<Vec<_>, _>>()?;
        let keys: Vec<&str> = new.iter().map(|r| r.key.as_str()).collect();
        let new_uids: Vec<Option<&str>> = new.iter().map(|r| r.uid.as_deref()).collect();
        let values: Vec<&[u8]> = new.iter().map(|r| r.value.as_slice()).collect();
        let headers = headers_column(&new)?;
        let inserted = tx
            .execute(
                &t.statement(&sql.insert_records)
                    .await
                    .map_err(|e| pg("publish: prepare", &e))?,
                &[
                    &topic.id,
                    &part,
                    &new_offsets,
                    &keys,
                    &new_uids,
                    &values,
                    &tags,
                    &sql_offset(stored_at)?,
                    &headers,
                ],
            )
            .await;
        match inserted {
            Ok(_) => {}
            // A foreign row took a slot or a claim since the checks.
            Err(error) if error.code() == Some(&SqlState::UNIQUE_VIOLATION) => return Ok(None),
            Err(error) => return Err(pg("publish: insert records", &error)),
        }
        tx.execute(
            &t.statement(&sql.advance)
                .await
                .map_err(|e| pg("publish: prepare", &e))?,
            &[&topic.id, &part, &sql_offset(end)?],
        )
        .await
        .map_err(|e| pg("publish: advance offset", &e))?;
        // A wake-up only: subscribers read the records from the table.
        let payload = format!("{partition}:{}", end - 1);
        tx.execute(
            &t.statement(&sql.notify)
                .await
                .map_err(|e| pg("publish: prepare", &e))?,
            &[&topic.channel, &payload],
        )
        .await
        .map_err(|e| pg("publish: notify", &e))?;
    }
    Ok(Some(Locked {
        offsets: slots
            .iter()
            .map(|slot| match slot {
                Slot::Known(offset) => *offset,
                Slot::New(index) => offsets[*index],
            })
            .collect(),
        next: if new.is_empty() { next } else { end },
    }))
}

/// The `headers` column of `records` (C25): JSON text, `None` for none.
fn headers_column(records: &[&Prepared]) -> Result<Vec<Option<String>>, BusError> {
    records
        .iter()
        .map(|record| crate::fetch::headers_text(&record.headers))
        .collect()
}
