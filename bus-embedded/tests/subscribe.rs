//! Live subscriptions of the embedded bus and read-only opens (contract
//! C16, C17): a reader beside a writer in this process or another one,
//! woken by inotify, never writing, never showing what the writer has not
//! acked.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bus_core::{
    BatchRecord, BusError, EventBus, Manifest, Selector, StartAt, SubscribeOptions, Subscription,
    SubscriptionItem, TopicSpec,
};
use bus_embedded::{EmbeddedBus, Options};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(30);
/// Set for the child process of [`a_reader_follows_a_writer_in_another_process`].
const CHILD_DIR: &str = "BUS_EMBEDDED_SUBSCRIBE_CHILD_DIR";

fn provision(bus: &dyn EventBus, topic: &str, partitions: u32) {
    bus.provision(&Manifest::new([TopicSpec::new(topic, partitions)]))
        .unwrap();
}

/// The next `n` records of `sub`, failing on anything else or at the deadline.
fn receive(sub: &mut Subscription, n: usize) -> Vec<(u32, u64, i64)> {
    let deadline = Instant::now() + DEADLINE;
    let mut out = Vec::new();
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "only {} of {n} records arrived", out.len());
        match sub.recv_timeout(left).unwrap() {
            Some(SubscriptionItem::Record { event, .. }) => {
                out.push((
                    event.partition,
                    event.offset,
                    event.value["n"].as_i64().unwrap(),
                ));
            }
            Some(other) => panic!("unexpected item {other:?}"),
            None => {}
        }
    }
    out
}

/// Asserts `got` holds the values `0..n`, in offset order per partition.
fn assert_each_once_in_order(got: &[(u32, u64, i64)], n: i64) {
    assert_values(got, 0..n);
}

/// Asserts `got` holds the values of `range`, in offset order per partition.
fn assert_values(got: &[(u32, u64, i64)], range: std::ops::Range<i64>) {
    let mut values: Vec<i64> = got.iter().map(|g| g.2).collect();
    values.sort_unstable();
    assert_eq!(values, range.collect::<Vec<_>>(), "each record once");
    let mut last: BTreeMap<u32, u64> = BTreeMap::new();
    for &(partition, offset, _) in got {
        if let Some(&before) = last.get(&partition) {
            assert_eq!(offset, before + 1, "partition {partition} in order, no gap");
        }
        last.insert(partition, offset);
    }
}

fn publish_range(bus: &dyn EventBus, topic: &str, range: std::ops::Range<i64>) {
    for n in range {
        bus.publish(topic, &format!("k{}", n % 5), &json!({ "n": n }))
            .unwrap();
    }
}

#[test]
fn a_writer_subscription_gets_history_then_the_live_tail() {
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open(dir.path()).unwrap();
    provision(&bus, "t", 3);
    publish_range(&bus, "t", 0..20);
    let mut sub = bus
        .subscribe(
            "t",
            Selector::Topic,
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .unwrap();
    let mut got = receive(&mut sub, 20);
    std::thread::scope(|scope| {
        scope.spawn(|| publish_range(&bus, "t", 20..60));
        got.extend(receive(&mut sub, 40));
    });
    assert_each_once_in_order(&got, 60);
    assert!(sub.try_recv().unwrap().is_none(), "nothing more");
}

#[test]
fn dropping_the_bus_ends_its_subscriptions() {
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open(dir.path()).unwrap();
    provision(&bus, "t", 1);
    let mut writer_sub = bus
        .subscribe(
            "t",
            Selector::Topic,
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .unwrap();
    let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
    let mut reader_sub = reader
        .subscribe(
            "t",
            Selector::Topic,
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .unwrap();
    drop(bus);
    drop(reader);
    for sub in [&mut writer_sub, &mut reader_sub] {
        assert!(sub.recv_timeout(DEADLINE).unwrap().is_none());
        assert!(sub.is_closed(), "ended, not timed out");
        assert!(sub.recv().is_none());
    }
    // Nothing of the closed bus is held: the directory opens again.
    drop(EmbeddedBus::open(dir.path()).unwrap());
}

#[test]
fn a_read_only_open_beside_a_writer_delivers_each_record_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let writer = EmbeddedBus::open(dir.path()).unwrap();
    provision(&writer, "t", 2);
    publish_range(&writer, "t", 0..5);
    // The writer holds its lock; the reader takes none.
    let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
    let mut now = reader
        .subscribe(
            "t",
            Selector::Topic,
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .unwrap();
    let mut all = reader
        .subscribe(
            "t",
            Selector::Topic,
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .unwrap();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            publish_range(&writer, "t", 5..40);
            let batch: Vec<BatchRecord> = (40..100)
                .map(|n| BatchRecord::new(format!("k{}", n % 5), json!({ "n": n })))
                .collect();
            writer.publish_batch("t", &batch).unwrap();
        });
        let got = receive(&mut all, 100);
        assert_each_once_in_order(&got, 100);
    });
    let live: Vec<i64> = receive(&mut now, 95).iter().map(|g| g.2).collect();
    let mut sorted = live.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (5..100).collect::<Vec<_>>(),
        "Now: every record after, none before"
    );
    assert!(now.try_recv().unwrap().is_none());
    // Fetch, offsets and lookups read what the writer acked.
    let total: u64 = (0..2).map(|p| reader.offsets("t", p).unwrap().next).sum();
    assert_eq!(total, 100);
}

#[test]
fn a_read_only_open_follows_rolls_and_retention() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::default().segment_bytes(400);
    let writer = EmbeddedBus::open_with(dir.path(), options).unwrap();
    writer
        .provision(&Manifest::new(
            [TopicSpec::new("t", 1).with_retention_ms(1)],
        ))
        .unwrap();
    publish_range(&writer, "t", 0..10);
    let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
    let mut sub = reader
        .subscribe(
            "t",
            Selector::Partition(0),
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .unwrap();
    assert_each_once_in_order(&receive(&mut sub, 10), 10);
    publish_range(&writer, "t", 10..30);
    assert_values(&receive(&mut sub, 20), 10..30);
    assert!(log_files(dir.path()) > 3, "the writer rolled segments");
    let expired = writer.maintenance(u64::MAX / 2).unwrap();
    assert_eq!(expired, 30);
    publish_range(&writer, "t", 30..33);
    assert_values(&receive(&mut sub, 3), 30..33);
    let range = reader.offsets("t", 0).unwrap();
    assert_eq!(range, writer.offsets("t", 0).unwrap());
    let from_zero = reader.fetch("t", 0, 0, 100).unwrap();
    assert_eq!(from_zero.first().map(|e| e.offset), Some(range.first));
    assert_eq!(from_zero.len() as u64, range.retained());
}

fn log_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("topics/t/p0000"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "log")
        })
        .count()
}

/// Every file under `dir` with its length and content.
fn listing(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(at) = todo.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                out.insert(path.clone(), Vec::new());
                todo.push(path);
            } else {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

fn assert_read_only(result: Result<impl std::fmt::Debug, BusError>, operation: &str) {
    match result {
        Err(BusError::ReadOnly { operation: op, .. }) => assert_eq!(op, operation),
        other => panic!("{operation}: expected a read-only refusal, got {other:?}"),
    }
}

#[test]
fn a_read_only_open_refuses_writes_and_changes_no_file() {
    let dir = tempfile::tempdir().unwrap();
    {
        let options = Options::default().segment_bytes(1);
        let writer = EmbeddedBus::open_with(dir.path(), options).unwrap();
        provision(&writer, "t", 1);
        for n in 0..4 {
            let uid = format!("u{n}");
            writer
                .publish_idempotent("t", "k", &json!({ "n": n }), &uid)
                .unwrap();
        }
    }
    let pdir = dir.path().join("topics/t/p0000");
    assert_eq!(log_files(dir.path()), 4, "one segment per record");
    // Missing hints a writer would rebuild on disk: the reader must not.
    std::fs::remove_file(pdir.join("00000000000000000000.idx")).unwrap();
    std::fs::remove_file(pdir.join("00000000000000000001.uids")).unwrap();
    // A torn tail the next writer would truncate: the reader must not.
    let segment = pdir.join("00000000000000000003.log");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&segment)
        .unwrap();
    file.write_all(b"\x01\x02\x03 torn").unwrap();
    drop(file);
    let before = listing(dir.path());

    let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
    assert_eq!(reader.topics(), vec!["t".to_owned()]);
    assert_eq!(reader.fetch("t", 0, 0, 10).unwrap().len(), 4);
    assert_eq!(reader.offsets("t", 0).unwrap().next, 4);
    for n in 0..4 {
        let uid = format!("u{n}");
        let found = reader.find_event_by_uid("t", "k", &uid).unwrap();
        assert_eq!(found.map(|a| a.offset), Some(n));
    }
    reader.set_control_key([7; 32]).unwrap();
    let mut sub = reader
        .subscribe(
            "t",
            Selector::Key("k".to_owned()),
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .unwrap();
    // The records are unsigned: under a control key each is an integrity error.
    for n in 0..4 {
        assert!(matches!(
            sub.recv_timeout(DEADLINE),
            Err(BusError::Integrity { offset, .. }) if offset == n
        ));
    }
    drop(sub);
    let value = json!({"n": 1});
    assert_read_only(reader.publish("t", "k", &value), "publish");
    assert_read_only(
        reader.publish_idempotent("t", "k", &value, "u1"),
        "publish_idempotent",
    );
    assert_read_only(
        reader.publish_batch("t", &[BatchRecord::new("k", value.clone())]),
        "publish_batch",
    );
    assert_read_only(reader.maintenance(u64::MAX / 2), "maintenance");
    assert_read_only(
        reader.provision(&Manifest::new([TopicSpec::new("new", 1)])),
        "provision",
    );
    // Provisioning what exists writes nothing, so it is allowed.
    provision(&reader, "t", 1);
    drop(reader);
    assert_eq!(listing(dir.path()), before, "the directory is unchanged");
}

#[test]
fn a_read_only_open_of_a_missing_directory_fails_and_creates_it_not() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nothing-here");
    assert!(EmbeddedBus::open_read_only(&missing).is_err());
    assert!(!missing.exists());
}

#[test]
fn a_read_only_open_takes_no_lock_from_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
    assert!(reader.topics().is_empty());
    // The reader holds no lock: a writer opens beside it, provisions after
    // the reader opened, and the reader sees the new topic.
    let writer = EmbeddedBus::open(dir.path()).unwrap();
    provision(&writer, "late", 1);
    writer.publish("late", "k", &json!({"n": 0})).unwrap();
    assert_eq!(reader.topics(), vec!["late".to_owned()]);
    assert_eq!(reader.fetch("late", 0, 0, 10).unwrap().len(), 1);
    // A second writer is still refused by the first one's lock.
    assert!(matches!(
        EmbeddedBus::open(dir.path()),
        Err(BusError::Locked { .. })
    ));
    let second_reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
    assert_eq!(second_reader.offsets("late", 0).unwrap().next, 1);
}

#[test]
fn a_reader_shows_no_frame_past_the_writers_acked_end() {
    let dir = tempfile::tempdir().unwrap();
    let writer = EmbeddedBus::open(dir.path()).unwrap();
    provision(&writer, "t", 1);
    publish_range(&writer, "t", 0..3);
    let marker = dir.path().join("topics/t/p0000/acked");
    let acked_three = std::fs::read(&marker).unwrap();
    publish_range(&writer, "t", 3..4);
    let acked_four = std::fs::read(&marker).unwrap();
    // As if the fourth frame were written but not yet fsynced and acked.
    std::fs::write(&marker, &acked_three).unwrap();
    let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
    assert_eq!(reader.offsets("t", 0).unwrap().next, 3);
    assert_eq!(reader.fetch("t", 0, 0, 10).unwrap().len(), 3);
    std::fs::write(&marker, &acked_four).unwrap();
    assert_eq!(reader.fetch("t", 0, 0, 10).unwrap().len(), 4);
}

/// The child of [`a_reader_follows_a_writer_in_another_process`]: a no-op
/// unless that test started this process.
#[test]
fn child_writer_process() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let writer = EmbeddedBus::open(&dir).unwrap();
    provision(&writer, "x", 2);
    println!("PROVISIONED");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    publish_range(&writer, "x", 0..150);
    let batch: Vec<BatchRecord> = (150..300)
        .map(|n| BatchRecord::new(format!("k{}", n % 5), json!({ "n": n })))
        .collect();
    writer.publish_batch("x", &batch).unwrap();
}

#[test]
fn a_reader_follows_a_writer_in_another_process() {
    let dir = tempfile::tempdir().unwrap();
    // Opened before the writer exists or provisions anything.
    let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_writer_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("PROVISIONED") {
        line.clear();
        assert_ne!(stdout.read_line(&mut line).unwrap(), 0, "child ended early");
    }
    let mut sub = reader
        .subscribe(
            "x",
            Selector::Topic,
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "go").unwrap();
    let got = receive(&mut sub, 300);
    assert_each_once_in_order(&got, 300);
    assert!(child.wait().unwrap().success());
    assert!(sub.try_recv().unwrap().is_none(), "nothing twice");
}

#[test]
fn a_read_only_open_follows_an_interval_writer_across_rolls() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::default()
        .durability(bus_embedded::Durability::Interval(60_000))
        .segment_bytes(400);
    let writer = EmbeddedBus::open_with(dir.path(), options).unwrap();
    provision(&writer, "t", 1);
    let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
    let mut sub = reader
        .subscribe(
            "t",
            Selector::Topic,
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .unwrap();
    // Acked at the write in this mode: visible before any fsync.
    publish_range(&writer, "t", 0..30);
    assert_each_once_in_order(&receive(&mut sub, 30), 30);
    assert!(log_files(dir.path()) > 3, "the writer rolled segments");
    assert_eq!(reader.offsets("t", 0).unwrap().next, 30);
}
