//! The references each embedded figure is judged against, measured in the
//! same run on the same disk: the bare disk (fdatasync'd appends),
//! serde_json alone, and SQLite doing the same work.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::workload::{Latency, Lcg, event, rate, settle, uid};

/// write + fdatasync of ~200-byte appends for about `budget`.
pub fn bare_fsync_rate(dir: &Path, budget: Duration) -> f64 {
    let path = dir.join("fsync-probe");
    let file = std::fs::File::create(&path).unwrap();
    let buf = [b'x'; 200];
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed() < budget {
        file.write_all_at(&buf, n * 200).unwrap();
        file.sync_data().unwrap();
        n += 1;
    }
    let r = rate(n, start.elapsed());
    std::fs::remove_file(path).unwrap();
    r
}

/// write + fdatasync of 1 MiB appends for about `budget`: the disk's
/// bandwidth for what a batch publish does (append, then sync). MB/s.
pub fn bare_append_bandwidth(dir: &Path, budget: Duration) -> f64 {
    const CHUNK: usize = 1 << 20;
    let path = dir.join("append-probe");
    let file = std::fs::File::create(&path).unwrap();
    let buf = vec![b'x'; CHUNK];
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed() < budget {
        file.write_all_at(&buf, n * CHUNK as u64).unwrap();
        file.sync_data().unwrap();
        n += 1;
    }
    let r = rate(n * CHUNK as u64, start.elapsed()) / 1e6;
    std::fs::remove_file(path).unwrap();
    r
}

/// `serde_json::from_slice::<Value>` of the bench's events (already
/// serialized, ~200 bytes each) for about `budget`: records/s. What a
/// replay must at least do per record.
pub fn parse_rate(budget: Duration) -> f64 {
    let events: Vec<Vec<u8>> = (0..10_000)
        .map(|i| serde_json::to_vec(&event(i)).unwrap())
        .collect();
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed() < budget {
        for bytes in &events {
            let value: Value = serde_json::from_slice(bytes).unwrap();
            std::hint::black_box(value);
        }
        n += events.len() as u64;
    }
    rate(n, start.elapsed())
}

/// `serde_json::to_vec` of the bench's events (built as `Value`s first)
/// for about `budget`: records/s. What a publish must at least do per
/// record (the trait takes a `Value`; the log stores its bytes).
pub fn serialize_rate(budget: Duration) -> f64 {
    let events: Vec<Value> = (0..10_000u64).map(event).collect();
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed() < budget {
        for value in &events {
            std::hint::black_box(serde_json::to_vec(value).unwrap());
        }
        n += events.len() as u64;
    }
    rate(n, start.elapsed())
}

/// The same work in SQLite (WAL, `synchronous=FULL`): `records` events
/// inserted 1000 per transaction, replayed 1000 per query, and read one
/// by rowid at random, each value parsed as fetch does, and looked up by
/// UID through an index (created after the timed inserts, so the insert
/// figure stays comparable with earlier runs). Returns (insert rec/s,
/// replay rec/s, fetch latency, find-by-UID latency).
pub fn sqlite_reference(dir: &Path, records: u64) -> (f64, f64, Latency, Latency) {
    let db = rusqlite::Connection::open(dir.join("reference.sqlite")).unwrap();
    db.pragma_update(None, "journal_mode", "WAL").unwrap();
    db.pragma_update(None, "synchronous", "FULL").unwrap();
    db.execute_batch(
        "CREATE TABLE events (offset INTEGER PRIMARY KEY, key TEXT NOT NULL, uid TEXT, stored_at INTEGER NOT NULL, value BLOB NOT NULL)",
    )
    .unwrap();
    let mut spent = Duration::ZERO;
    let mut i = 0;
    while i < records {
        let rows: Vec<(u64, String, Vec<u8>)> = (i..(i + 1000).min(records))
            .map(|j| (j, uid(j), serde_json::to_vec(&event(j)).unwrap()))
            .collect();
        i += rows.len() as u64;
        let start = Instant::now();
        let tx = db.unchecked_transaction().unwrap();
        {
            let mut insert = tx
                .prepare_cached("INSERT INTO events VALUES (?1, 'k', ?2, ?3, ?4)")
                .unwrap();
            for (offset, uid, value) in &rows {
                insert
                    .execute(rusqlite::params![*offset as i64, uid, 0i64, value])
                    .unwrap();
            }
        }
        tx.commit().unwrap();
        spent += start.elapsed();
    }
    let insert = rate(records, spent);
    let start = Instant::now();
    let mut offset = 0i64;
    let mut seen = 0u64;
    let mut page = db
        .prepare(
            "SELECT offset, key, value FROM events WHERE offset >= ?1 ORDER BY offset LIMIT 1000",
        )
        .unwrap();
    loop {
        let got: Vec<(i64, String, Value)> = page
            .query_map([offset], |row| {
                let value: Vec<u8> = row.get(2)?;
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    serde_json::from_slice(&value).unwrap(),
                ))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let Some(last) = got.last() else { break };
        offset = last.0 + 1;
        seen += got.len() as u64;
    }
    assert_eq!(seen, records);
    let replay = rate(records, start.elapsed());
    settle();
    let mut rng = Lcg(records);
    let mut one = db
        .prepare("SELECT key, value FROM events WHERE offset = ?1")
        .unwrap();
    let fetches = (0..2000)
        .map(|_| {
            let offset = rng.below(records) as i64;
            let start = Instant::now();
            let got: (String, Value) = one
                .query_row([offset], |row| {
                    let value: Vec<u8> = row.get(1)?;
                    Ok((row.get(0)?, serde_json::from_slice(&value).unwrap()))
                })
                .unwrap();
            let took = start.elapsed();
            assert_eq!(got.1["seq"], offset);
            took
        })
        .collect();
    db.execute_batch("CREATE INDEX events_uid ON events (uid)")
        .unwrap();
    settle();
    let mut by_uid = db
        .prepare("SELECT offset FROM events WHERE uid = ?1 ORDER BY offset LIMIT 1")
        .unwrap();
    let finds = (0..2000)
        .map(|_| {
            let i = rng.below(records);
            let wanted = uid(i);
            let start = Instant::now();
            let got: i64 = by_uid.query_row([&wanted], |row| row.get(0)).unwrap();
            let took = start.elapsed();
            assert_eq!(got as u64, i);
            took
        })
        .collect();
    (insert, replay, Latency::of(fetches), Latency::of(finds))
}
