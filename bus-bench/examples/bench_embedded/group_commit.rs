//! SQLite with a group-commit writer: what a user would build instead of
//! the log for many publishers of one stream. One writer thread owns the
//! connection (WAL, `synchronous=FULL`, a unique index on the UID, as the
//! log deduplicates by UID); each publisher serializes its event, hands it
//! over and waits for its commit; the writer takes every request waiting,
//! inserts them in one transaction, commits (the fsync) and answers them.

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::workload::{event, rate};

/// A publisher's record and where its commit is answered.
type Request = (String, Vec<u8>, mpsc::SyncSender<()>);

/// Records/s of `publishers` threads publishing through one group-commit
/// writer for about `budget`.
pub fn sqlite_group_commit_rate(dir: &Path, publishers: u64, budget: Duration) -> f64 {
    let path = dir.join("group-commit.sqlite");
    let (send, receive) = mpsc::channel::<Request>();
    let writer = {
        let path = path.clone();
        std::thread::spawn(move || write_groups(&path, &receive))
    };
    let start = Instant::now();
    let total: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..publishers)
            .map(|t| {
                let send = send.clone();
                scope.spawn(move || {
                    let (done, wait) = mpsc::sync_channel(1);
                    let mut n = 0u64;
                    while start.elapsed() < budget {
                        let value = event(t * 1_000_000_000 + n);
                        let uid = value["metadata"]["uid"].as_str().unwrap().to_owned();
                        let bytes = serde_json::to_vec(&value).unwrap();
                        send.send((uid, bytes, done.clone())).unwrap();
                        wait.recv().unwrap();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let took = start.elapsed();
    drop(send);
    let groups = writer.join().unwrap();
    assert!(groups > 0 && groups <= total, "{groups} groups for {total}");
    let _ = std::fs::remove_file(&path);
    rate(total, took)
}

/// The writer: one transaction per gathering of waiting requests; returns
/// how many it committed.
fn write_groups(path: &Path, receive: &mpsc::Receiver<Request>) -> u64 {
    let db = rusqlite::Connection::open(path).unwrap();
    db.pragma_update(None, "journal_mode", "WAL").unwrap();
    db.pragma_update(None, "synchronous", "FULL").unwrap();
    db.execute_batch(
        "CREATE TABLE events (offset INTEGER PRIMARY KEY, key TEXT NOT NULL, uid TEXT UNIQUE, \
         stored_at INTEGER NOT NULL, value BLOB NOT NULL)",
    )
    .unwrap();
    let mut groups = 0;
    while let Ok(first) = receive.recv() {
        let mut group = vec![first];
        group.extend(receive.try_iter());
        let tx = db.unchecked_transaction().unwrap();
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO events (key, uid, stored_at, value) VALUES ('k', ?1, 0, ?2) \
                     ON CONFLICT (uid) DO NOTHING",
                )
                .unwrap();
            for (uid, value, _) in &group {
                insert.execute(rusqlite::params![uid, value]).unwrap();
            }
        }
        tx.commit().unwrap();
        groups += 1;
        for (_, _, done) in group {
            let _ = done.send(());
        }
    }
    groups
}
