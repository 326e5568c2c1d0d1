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

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};

use bus_core::auth::{RecordAuth, RecordParts};
use bus_core::{BusError, now_ms, prepare_record};
use tokio::sync::oneshot;

use crate::errors::{pg, pool};
use crate::queue::{Prepared, Queue, Request};
use crate::shared::{Shared, Topic};

/// Checks and encodes one record; nothing is sent yet, so a batch with a bad
/// record stores nothing.
pub(crate) fn prepare(
    auth: Option<&RecordAuth>,
    topic: &Topic,
    key: &str,
    value: &serde_json::Value,
    uid: Option<&str>,
) -> Result<Prepared, BusError> {
    let record = prepare_record(&topic.spec, key, value, uid, auth)?;
    Ok(Prepared {
        partition: record.partition,
        key: record.key.to_owned(),
        uid: record.uid.map(str::to_owned),
        value: record.value,
        tag: record.tag.map(|tag| tag.to_vec()),
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
            commit_round(&shared, &topic, partition, &round),
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

/// Every record of `round` in one statement when none of its UIDs is stored
/// yet (the usual case: one round trip, or two with UIDs); else, or when
/// another writer stored one of them meanwhile, [`commit_locked`]. Their
/// offsets in order.
async fn commit_round(
    shared: &Shared,
    topic: &Topic,
    partition: u32,
    round: &[Request],
) -> Result<Vec<u64>, BusError> {
    let sql = &shared.sql;
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
            return commit_locked(shared, topic, partition, round).await;
        }
    }
    // Offsets relative to the round's first; a UID twice in the round is
    // stored once.
    let mut first_of: HashMap<&str, u64> = HashMap::new();
    let mut relative = Vec::with_capacity(records.len());
    let (mut keys, mut new_uids, mut values, mut tags) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for record in &records {
        if let Some(uid) = record.uid.as_deref()
            && let Some(at) = first_of.get(uid)
        {
            relative.push(*at);
            continue;
        }
        let at = keys.len() as u64;
        if let Some(uid) = record.uid.as_deref() {
            first_of.insert(uid, at);
        }
        relative.push(at);
        keys.push(record.key.as_str());
        new_uids.push(record.uid.as_deref());
        values.push(record.value.as_slice());
        tags.push(record.tag.as_deref());
    }
    let count =
        i64::try_from(keys.len()).map_err(|_| BusError::backend("postgres", "round size"))?;
    let stored_at = sql_offset(now_ms())?;
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
                &count,
                &keys,
                &new_uids,
                &values,
                &tags,
                &stored_at,
                &topic.channel,
            ],
        )
        .await;
    match result {
        Ok(Some(row)) => {
            let base = offset_of(row.get(0))?;
            let bytes = values.iter().map(|value| value.len() as u64).sum();
            bus_core::metrics::stored("postgres", &topic.spec.name, keys.len() as u64, bytes);
            bus_core::metrics::dedup_hits(
                "postgres",
                &topic.spec.name,
                (records.len() - keys.len()) as u64,
            );
            bus_core::metrics::commit_round("postgres", keys.len());
            Ok(relative.into_iter().map(|at| base + at).collect())
        }
        Ok(None) => Err(BusError::backend(
            "postgres",
            format!(
                "topic {:?} has no counter row for partition {partition}",
                topic.spec.name
            ),
        )),
        Err(error) if error.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
            drop(client);
            commit_locked(shared, topic, partition, round).await
        }
        Err(error) => Err(pg("publish", &error)),
    }
}

/// One transaction for every record of `round` under the partition's lock,
/// deciding each UID against what is stored; their offsets in order.
async fn commit_locked(
    shared: &Shared,
    topic: &Topic,
    partition: u32,
    round: &[Request],
) -> Result<Vec<u64>, BusError> {
    let sql = &shared.sql;
    let name = &topic.spec.name;
    let part = i32::try_from(partition).map_err(|_| BusError::backend("postgres", "partition"))?;
    let mut client = shared.pool.get().await.map_err(pool)?;
    let tx = client
        .transaction()
        .await
        .map_err(|e| pg("publish: begin", &e))?;
    let row = tx
        .query_one(
            &tx.prepare_cached(&sql.lock_partition)
                .await
                .map_err(|e| pg("publish: prepare", &e))?,
            &[&topic.id, &part],
        )
        .await
        .map_err(|e| pg("publish: lock partition", &e))?;
    let mut next = offset_of(row.get(0))?;

    let records = || round.iter().flat_map(|request| &request.records);
    let mut known: HashMap<&str, u64> = HashMap::new();
    let uids: Vec<&str> = records().filter_map(|r| r.uid.as_deref()).collect();
    if !uids.is_empty() {
        let rows = tx
            .query(
                &tx.prepare_cached(&sql.claims)
                    .await
                    .map_err(|e| pg("publish: prepare", &e))?,
                &[&topic.id, &part, &uids],
            )
            .await
            .map_err(|e| pg("publish: look up UIDs", &e))?;
        let auth = shared.auth();
        let mut forged = Vec::new();
        // Rows come by offset: the first authentic record of a UID answers.
        for row in &rows {
            let uid: &str = row.get(0);
            let offset: i64 = row.get(1);
            let claimed: bool = row.get(5);
            let authentic = auth.as_ref().is_none_or(|auth| {
                auth.verify(
                    RecordParts {
                        topic: name,
                        partition,
                        key: row.get(2),
                        uid: Some(uid),
                        value: row.get(3),
                    },
                    row.get::<_, Option<&[u8]>>(4).unwrap_or_default(),
                )
            });
            if authentic {
                if let Some(uid) = uids.iter().find(|wanted| **wanted == uid) {
                    known.entry(uid).or_insert(offset_of(offset)?);
                }
            } else if claimed {
                // A forged record that holds the claim answers for nothing:
                // the genuine record is stored after it and takes the claim.
                tracing::warn!(
                    "bus-postgres: topic {name:?} partition {partition} offset {offset} claims a UID without a valid tag; storing the genuine record after it"
                );
                forged.push(offset);
            }
        }
        if !forged.is_empty() {
            tx.execute(
                &tx.prepare_cached(&sql.unclaim)
                    .await
                    .map_err(|e| pg("publish: prepare", &e))?,
                &[&topic.id, &part, &forged],
            )
            .await
            .map_err(|e| pg("publish: release forged UID", &e))?;
        }
    }

    let mut offsets = Vec::new();
    let (mut new_offsets, mut keys, mut new_uids, mut values, mut tags) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for record in records() {
        if let Some(uid) = record.uid.as_deref()
            && let Some(offset) = known.get(uid)
        {
            offsets.push(*offset);
            continue;
        }
        offsets.push(next);
        if let Some(uid) = record.uid.as_deref() {
            known.insert(uid, next);
        }
        new_offsets.push(sql_offset(next)?);
        keys.push(record.key.as_str());
        new_uids.push(record.uid.as_deref());
        values.push(record.value.as_slice());
        tags.push(record.tag.as_deref());
        next += 1;
    }
    if !new_offsets.is_empty() {
        let stored_at = sql_offset(now_ms())?;
        tx.execute(
            &tx.prepare_cached(&sql.insert_records)
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
                &stored_at,
            ],
        )
        .await
        .map_err(|e| pg("publish: insert records", &e))?;
        tx.execute(
            &tx.prepare_cached(&sql.advance)
                .await
                .map_err(|e| pg("publish: prepare", &e))?,
            &[&topic.id, &part, &sql_offset(next)?],
        )
        .await
        .map_err(|e| pg("publish: advance offset", &e))?;
        // A wake-up only: subscribers read the records from the table.
        let payload = format!("{partition}:{}", next - 1);
        tx.execute(
            &tx.prepare_cached(&sql.notify)
                .await
                .map_err(|e| pg("publish: prepare", &e))?,
            &[&topic.channel, &payload],
        )
        .await
        .map_err(|e| pg("publish: notify", &e))?;
    }
    tx.commit().await.map_err(|e| pg("publish: commit", &e))?;
    Ok(offsets)
}
