//! Reading (contracts C5, C7, C11, C14): fetch by primary-key range, find by
//! the UID index, the retained range, and retention by age.

use bus_core::auth::{RecordAuth, RecordParts, RecordPlace, TAG_LEN};
use bus_core::{BusError, Headers, PartitionOffsets, StoredEvent, StoredRecord};
use tokio_postgres::Row;

use crate::errors::{pg, pool};
use crate::shared::{Shared, Topic};
use crate::sql::FIND_PAGE;

/// The version byte of a tag that covers the record's offset and
/// `stored_at` ([`RecordAuth::tag_at`]); a tag of [`TAG_LEN`] bytes without
/// it was written before (over topic, partition, key, UID and value only).
pub(crate) const PLACED_TAG: u8 = 2;

/// Whether a stored row authenticates at its place, by the version of its
/// tag; `Err` names the fault.
pub(crate) fn authenticate(
    auth: &RecordAuth,
    parts: RecordParts<'_>,
    headers: &Headers,
    offset: i64,
    stored_at: i64,
    tag: Option<&[u8]>,
) -> Result<(), &'static str> {
    let (Ok(offset), Ok(stored_at)) = (u64::try_from(offset), u64::try_from(stored_at)) else {
        return Err("negative offset or time");
    };
    match tag {
        Some([PLACED_TAG, mac @ ..]) if mac.len() == TAG_LEN => {
            let place = RecordPlace { offset, stored_at };
            if auth.verify_at_with(parts, headers, place, mac) {
                Ok(())
            } else {
                Err("authentication tag does not match (content, offset or time changed)")
            }
        }
        tag => auth
            .check_with(parts, headers, tag)
            .map_err(|fault| fault.reason()),
    }
}

/// The headers of a row (C25): its `headers::text` column, `NULL` for none.
pub(crate) fn row_headers(text: Option<&str>) -> Result<Headers, &'static str> {
    match text {
        None => Ok(Headers::new()),
        Some(text) => {
            serde_json::from_str(text).map_err(|_| "headers are not an object of strings")
        }
    }
}

/// The `headers` column text of `headers`: `None` for none (the column
/// stays `NULL`, as in rows from before headers).
pub(crate) fn headers_text(headers: &Headers) -> Result<Option<String>, BusError> {
    if headers.is_empty() {
        return Ok(None);
    }
    Ok(Some(serde_json::to_string(headers)?))
}

/// The placed tag of `parts` with `headers` at `place` (C25: equal to
/// [`placed_tag`] without headers).
pub(crate) fn placed_tag_with(
    auth: &RecordAuth,
    parts: RecordParts<'_>,
    headers: &Headers,
    place: RecordPlace,
) -> Vec<u8> {
    let mut tag = Vec::with_capacity(TAG_LEN + 1);
    tag.push(PLACED_TAG);
    tag.extend_from_slice(&auth.tag_at_with(parts, headers, place));
    tag
}

fn corrupt(topic: &Topic, partition: u32, offset: u64, shared: &Shared) -> BusError {
    BusError::Corrupt {
        location: format!(
            "PostgreSQL table \"{}\".records, topic {:?} partition {partition}",
            shared.sql.schema, topic.spec.name
        ),
        offset,
        reason: "the record is missing (offsets are stored without holes, so a row was deleted around the bus); fetch from the next offset to read on".to_owned(),
    }
}

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
) -> Result<StoredRecord, BusError> {
    let offset = number(row.get(0));
    let headers =
        row_headers(row.get(8)).map_err(|reason| integrity(topic, partition, offset, reason))?;
    let key: &str = row.get(1);
    let uid: Option<&str> = row.get(2);
    let value: &[u8] = row.get(3);
    let stored_at: i64 = row.get(5);
    if let Some(auth) = shared.auth() {
        let parts = RecordParts {
            topic: &topic.spec.name,
            partition,
            key,
            uid,
            value,
        };
        authenticate(&auth, parts, &headers, row.get(0), stored_at, row.get(4))
            .map_err(|reason| integrity(topic, partition, offset, reason))?;
    }
    let value = serde_json::from_slice(value).map_err(|error| {
        integrity(
            topic,
            partition,
            offset,
            &format!("value is not JSON: {error}"),
        )
    })?;
    Ok(StoredRecord {
        event: StoredEvent {
            partition,
            offset,
            key: key.to_owned(),
            value,
            stored_at: number(stored_at),
        },
        headers,
    })
}

pub(crate) async fn fetch(
    shared: &Shared,
    topic: &Topic,
    partition: u32,
    from: u64,
    max: usize,
) -> Result<Vec<StoredRecord>, BusError> {
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
    let Some(first_row) = rows.first() else {
        return Err(BusError::backend(
            "postgres",
            format!(
                "topic {:?} has no counter row for partition {partition}",
                topic.spec.name
            ),
        ));
    };
    let next = number(first_row.get(6));
    let start = log_start(
        topic,
        next,
        number(first_row.get(9)),
        first_row.get::<_, Option<i64>>(7),
    );
    let mut expected = from.max(start);
    let mut events = Vec::with_capacity(rows.len());
    // The authentic prefix is returned; the next fetch starts at the
    // forged or missing record and reports it.
    let damage = |error: BusError, events: Vec<StoredRecord>| {
        if events.is_empty() {
            Err(error)
        } else {
            Ok(events)
        }
    };
    for row in &rows {
        let Some(offset) = row.get::<_, Option<i64>>(0) else {
            break;
        };
        if number(offset) != expected {
            return damage(corrupt(topic, partition, expected, shared), events);
        }
        match record(shared, topic, partition, row) {
            Ok(event) => events.push(event),
            Err(error) => return damage(error, events),
        }
        expected += 1;
    }
    if events.len() < max && expected < next {
        return damage(corrupt(topic, partition, expected, shared), events);
    }
    Ok(events)
}

/// The UID index, page by page in offset order, below the counter. A record
/// that carries the UID without a valid tag answers for nothing, and no
/// number of them hides the genuine one.
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
    let auth = shared.auth();
    let mut after: i64 = -1;
    loop {
        let rows = client
            .query(&statement, &[&topic.id, &part, &uid, &after])
            .await
            .map_err(|e| pg("find by UID", &e))?;
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
                row_headers(row.get(5)).is_ok_and(|headers| {
                    authenticate(auth, parts, &headers, row.get(0), row.get(4), row.get(3)).is_ok()
                })
            })
        });
        if let Some(row) = found {
            return Ok(Some(number(row.get(0))));
        }
        match rows.last() {
            Some(last) if rows.len() >= usize::try_from(FIND_PAGE).unwrap_or(usize::MAX) => {
                after = last.get(0);
            }
            _ => return Ok(None),
        }
    }
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
    let first = log_start(
        topic,
        next,
        number(row.get(2)),
        row.get::<_, Option<i64>>(1),
    );
    Ok(PartitionOffsets { first, next })
}

/// Where a partition's log begins: its recorded log start (0 until
/// `delete_below` moved it up), and on a topic with retention the first
/// record at or above it (the counter when none is left), as retention
/// expires a prefix without recording it. Never past the counter.
fn log_start(topic: &Topic, next: u64, recorded: u64, first_record: Option<i64>) -> u64 {
    let start = match topic.spec.retention_ms {
        None => recorded,
        Some(_) => first_record.map_or(next, number).max(recorded),
    };
    start.min(next)
}

/// Drops the records of `partition` below `offset` and moves its log
/// start there (never down, never past the counter): C24's
/// `delete_below`, what a cold tier's archiver calls. Returns the rows
/// dropped.
pub(crate) async fn delete_below(
    shared: &Shared,
    topic: &Topic,
    partition: u32,
    offset: u64,
) -> Result<u64, BusError> {
    let part = i32::try_from(partition).unwrap_or(i32::MAX);
    let client = shared.pool.get().await.map_err(pool)?;
    client
        .execute(
            &shared.sql.delete_below,
            &[&topic.id, &part, &sql_number(offset)],
        )
        .await
        .map_err(|e| pg("delete below", &e))
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
            Some(row) => row.get::<_, i64>(0).min(sql_number(next)),
            None => sql_number(next),
        };
        expired += client
            .execute(&shared.sql.expire, &[&topic.id, &part, &below])
            .await
            .map_err(|e| pg("retention", &e))?;
    }
    Ok(expired)
}
