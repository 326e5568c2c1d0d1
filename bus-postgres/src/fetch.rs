//! Reading (contracts C5, C7, C11, C14): fetch by primary-key range, find by
//! the UID index, the retained range, and retention by age.

use bus_core::auth::RecordParts;
use bus_core::{BusError, PartitionOffsets, StoredEvent};
use tokio_postgres::Row;

use crate::errors::{pg, pool};
use crate::shared::{Shared, Topic};

fn sql_number(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn number(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn integrity(topic: &Topic, partition: u32, offset: u64, reason: &str) -> BusError {
    BusError::Integrity {
        topic: topic.spec.name.clone(),
        partition,
        offset,
        reason: reason.to_owned(),
    }
}

/// One fetched row as a record, its tag checked when a control key is set.
fn record(
    shared: &Shared,
    topic: &Topic,
    partition: u32,
    row: &Row,
) -> Result<StoredEvent, BusError> {
    let offset = number(row.get(0));
    let key: &str = row.get(1);
    let uid: Option<&str> = row.get(2);
    let value: &[u8] = row.get(3);
    if let Some(auth) = shared.auth() {
        let parts = RecordParts {
            topic: &topic.spec.name,
            partition,
            key,
            uid,
            value,
        };
        auth.check(parts, row.get(4))
            .map_err(|fault| integrity(topic, partition, offset, fault.reason()))?;
    }
    let value = serde_json::from_slice(value).map_err(|error| {
        integrity(
            topic,
            partition,
            offset,
            &format!("value is not JSON: {error}"),
        )
    })?;
    Ok(StoredEvent {
        partition,
        offset,
        key: key.to_owned(),
        value,
        stored_at: number(row.get(5)),
    })
}

pub(crate) async fn fetch(
    shared: &Shared,
    topic: &Topic,
    partition: u32,
    from: u64,
    max: usize,
) -> Result<Vec<StoredEvent>, BusError> {
    if max == 0 {
        return Ok(Vec::new());
    }
    let part = i32::try_from(partition).unwrap_or(i32::MAX);
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    let client = shared.pool.get().await.map_err(pool)?;
    let statement = client
        .prepare_cached(&shared.sql.fetch)
        .await
        .map_err(|e| pg("fetch", &e))?;
    let rows = client
        .query(&statement, &[&topic.id, &part, &sql_number(from), &limit])
        .await
        .map_err(|e| pg("fetch", &e))?;
    let mut events = Vec::with_capacity(rows.len());
    for row in &rows {
        match record(shared, topic, partition, row) {
            Ok(event) => events.push(event),
            // The authentic prefix is returned; the next fetch starts at
            // the forged record and reports it.
            Err(_) if !events.is_empty() => break,
            Err(error) => return Err(error),
        }
    }
    Ok(events)
}

/// One range of the UID index. A record that carries the UID without a
/// valid tag answers for nothing.
pub(crate) async fn find(
    shared: &Shared,
    topic: &Topic,
    partition: u32,
    uid: &str,
) -> Result<Option<u64>, BusError> {
    let part = i32::try_from(partition).unwrap_or(i32::MAX);
    let client = shared.pool.get().await.map_err(pool)?;
    let statement = client
        .prepare_cached(&shared.sql.find)
        .await
        .map_err(|e| pg("find by UID", &e))?;
    let rows = client
        .query(&statement, &[&topic.id, &part, &uid])
        .await
        .map_err(|e| pg("find by UID", &e))?;
    let auth = shared.auth();
    // By offset: the first authentic record of the UID answers for it.
    let found = rows.iter().find(|row| {
        auth.as_ref().is_none_or(|auth| {
            let parts = RecordParts {
                topic: &topic.spec.name,
                partition,
                key: row.get(1),
                uid: Some(uid),
                value: row.get(2),
            };
            auth.verify(parts, row.get::<_, Option<&[u8]>>(3).unwrap_or_default())
        })
    });
    Ok(found.map(|row| number(row.get(0))))
}

pub(crate) async fn offsets(
    shared: &Shared,
    topic: &Topic,
    partition: u32,
) -> Result<PartitionOffsets, BusError> {
    let part = i32::try_from(partition).unwrap_or(i32::MAX);
    let client = shared.pool.get().await.map_err(pool)?;
    let statement = client
        .prepare_cached(&shared.sql.offsets)
        .await
        .map_err(|e| pg("offsets", &e))?;
    let row = client
        .query_opt(&statement, &[&topic.id, &part])
        .await
        .map_err(|e| pg("offsets", &e))?
        .ok_or_else(|| {
            BusError::backend(
                "postgres",
                format!(
                    "topic {:?} has no counter row for partition {partition}",
                    topic.spec.name
                ),
            )
        })?;
    let next = number(row.get(0));
    let first = row.get::<_, Option<i64>>(1).map_or(next, number);
    Ok(PartitionOffsets { first, next })
}

/// Deletes the records of `topic` stored before `now_ms - retention`: per
/// partition, the prefix up to the first record young enough, so the log
/// keeps no hole even if clocks of several writers disagree. The counter row
/// keeps the offsets.
pub(crate) async fn expire(shared: &Shared, topic: &Topic, now_ms: u64) -> Result<u64, BusError> {
    let Some(retention) = topic.spec.retention_ms else {
        return Ok(0);
    };
    let cutoff = sql_number(now_ms.saturating_sub(retention));
    let mut expired = 0;
    for partition in 0..topic.spec.partitions {
        let part = i32::try_from(partition).unwrap_or(i32::MAX);
        let next = offsets(shared, topic, partition).await?.next;
        let client = shared.pool.get().await.map_err(pool)?;
        let first_young = client
            .prepare_cached(&shared.sql.first_young)
            .await
            .map_err(|e| pg("retention", &e))?;
        let young = client
            .query_opt(&first_young, &[&topic.id, &part, &cutoff])
            .await
            .map_err(|e| pg("retention", &e))?;
        let below = match young {
            Some(row) => row.get::<_, i64>(0),
            None => sql_number(next),
        };
        expired += client
            .execute(&shared.sql.expire, &[&topic.id, &part, &below])
            .await
            .map_err(|e| pg("retention", &e))?;
    }
    Ok(expired)
}
