//! Crash tests that really crash: a child process (this test binary
//! re-invoked) publishes from several threads and prints each ack; the
//! parent kills it with SIGKILL at random moments and checks, after every
//! reopen, that each acked record is there exactly once with its bytes.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

mod support;

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bus_core::{BusError, EventBus};
use bus_embedded::EmbeddedBus;
use support::{TOPIC, assert_gap_free, open, provision, read_all, value_for};

const PARTITIONS: u32 = 2;
const THREADS: usize = 4;
const ROUNDS: usize = 20;

/// The child's body; a no-op unless the parent set `BUS_CRASH_CHILD`.
#[test]
fn child_process() {
    let Ok(mode) = std::env::var("BUS_CRASH_CHILD") else {
        return;
    };
    let dir = std::env::var("BUS_CRASH_DIR").unwrap();
    // The parent's bus is closed, but another test thread of the parent
    // may have forked a child of its own while that bus's lock (an flock)
    // was open: the fork holds a copy of it until it execs. Wait for that.
    let deadline = Instant::now() + Duration::from_secs(10);
    let bus = loop {
        match EmbeddedBus::open(&dir) {
            Err(BusError::Locked { .. }) if Instant::now() < deadline => {
                std::thread::yield_now();
            }
            other => break other.unwrap(),
        }
    };
    let mut out = std::io::stdout();
    // libtest has printed "test child_process ... " without a newline.
    writeln!(out).unwrap();
    out.flush().unwrap();
    if mode == "hold" {
        writeln!(out, "READY").unwrap();
        out.flush().unwrap();
        // Block until killed: the parent never writes to stdin.
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        return;
    }
    let round = std::env::var("BUS_CRASH_ROUND").unwrap();
    let threads = std::env::var("BUS_CRASH_THREADS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(THREADS);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (bus, round) = (&bus, &round);
            scope.spawn(move || {
                for i in 0.. {
                    let uid = format!("r{round}-t{t}-{i}");
                    let ack = bus
                        .publish_idempotent(TOPIC, &format!("k{t}"), &value_for(&uid, i), &uid)
                        .unwrap();
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ACK {} {} {uid} {i}", ack.partition, ack.offset).unwrap();
                    out.flush().unwrap();
                }
            });
        }
    });
}

fn spawn_child(dir: &Path, mode: &str, round: usize) -> Child {
    spawn_child_with(dir, mode, round, THREADS)
}

fn spawn_child_with(dir: &Path, mode: &str, round: usize, threads: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BUS_CRASH_CHILD", mode)
        .env("BUS_CRASH_DIR", dir)
        .env("BUS_CRASH_ROUND", round.to_string())
        .env("BUS_CRASH_THREADS", threads.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Complete lines of the child's stdout, sent as they arrive; a line cut
/// by the kill (no newline) is not an ack and is dropped.
fn lines(child: &mut Child) -> (mpsc::Receiver<String>, std::thread::JoinHandle<()>) {
    let stdout = child.stdout.take().unwrap();
    let (send, receive) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                // libtest prints its own lines ("running 1 test") too.
                Ok(_) if !(line.starts_with("ACK ") || line.starts_with("READY")) => {}
                Ok(_) if line.ends_with('\n') => {
                    if send.send(line.trim_end().to_owned()).is_err() {
                        return;
                    }
                }
                Ok(_) => return,
            }
        }
    });
    (receive, thread)
}

#[derive(Debug, Clone, PartialEq)]
struct Acked {
    partition: u32,
    offset: u64,
    i: usize,
}

fn parse_ack(line: &str) -> Option<(String, Acked)> {
    let mut parts = line.strip_prefix("ACK ")?.split(' ');
    let partition = parts.next()?.parse().ok()?;
    let offset = parts.next()?.parse().ok()?;
    let uid = parts.next()?.to_owned();
    let i = parts.next()?.parse().ok()?;
    Some((
        uid,
        Acked {
            partition,
            offset,
            i,
        },
    ))
}

#[test]
fn kill_nine_loses_no_acked_record() {
    let dir = tempfile::tempdir().unwrap();
    provision(&open(dir.path()), PARTITIONS);
    let mut rng = support::Rng::new();
    let mut acked: BTreeMap<String, Acked> = BTreeMap::new();
    let mut zero_tails = 0;
    for round in 0..ROUNDS {
        let target = 1 + rng.below(80) as usize;
        let mut child = spawn_child(dir.path(), "publish", round);
        let (receive, reader) = lines(&mut child);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut got = 0;
        while got < target {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = receive
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("round {round}: child stopped acking after {got}"));
            let (uid, ack) = parse_ack(&line).unwrap_or_else(|| panic!("bad line {line:?}"));
            acked.insert(uid, ack);
            got += 1;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        reader.join().unwrap();
        for line in receive.try_iter() {
            let (uid, ack) = parse_ack(&line).unwrap_or_else(|| panic!("bad line {line:?}"));
            acked.insert(uid, ack);
        }
        // A killed writer leaves the zeros it wrote ahead of its last frame;
        // recovery must take them for what they are, and a clean close
        // (verify's) leaves none.
        zero_tails += ends_with_zero(dir.path());
        verify(dir.path(), &acked, round);
        assert_eq!(
            ends_with_zero(dir.path()),
            0,
            "round {round}: zeros after close"
        );
    }
    assert!(zero_tails > 0, "no kill ever left zeros written ahead");
}

/// Publishes from `threads` threads in a child, kills it with SIGKILL once
/// `target` acks were printed, and returns every ack it printed.
fn crash_after(dir: &Path, round: usize, threads: usize, target: usize) -> BTreeMap<String, Acked> {
    let mut acked = BTreeMap::new();
    let mut child = spawn_child_with(dir, "publish", round, threads);
    let (receive, reader) = lines(&mut child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.len() < target {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = receive
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("round {round}: child stopped acking"));
        let (uid, ack) = parse_ack(&line).unwrap_or_else(|| panic!("bad line {line:?}"));
        acked.insert(uid, ack);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    for line in receive.try_iter() {
        let (uid, ack) = parse_ack(&line).unwrap_or_else(|| panic!("bad line {line:?}"));
        acked.insert(uid, ack);
    }
    acked
}

/// C15, damage a crash cannot cause: after a kill -9, the newest segment
/// of a random partition loses the zeros written ahead of its tail and
/// 1-200 bytes of its frames. The writer had fsynced those zeros (and
/// stored how far they reach) before any frame it acked filled them, so
/// reopening must report `Corrupt`, or give back every acked record; an
/// open that succeeds without an acked record is a silent loss.
#[test]
fn kill_nine_then_a_cut_tail_is_corrupt_never_a_silent_loss() {
    const CUT_ROUNDS: usize = 30;
    let mut rng = support::Rng::new();
    let (mut corrupt, mut whole) = (0, 0);
    for round in 0..CUT_ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        provision(&open(dir.path()), PARTITIONS);
        let target = 20 + rng.below(400) as usize;
        let acked = crash_after(dir.path(), round, 8, target);
        let partition = rng.below(u64::from(PARTITIONS)) as u32;
        let log = support::segments(dir.path(), partition).pop().unwrap();
        let bytes = std::fs::read(&log).unwrap();
        let frames_end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let cut = frames_end.saturating_sub(1 + rng.below(200) as usize);
        std::fs::write(&log, &bytes[..cut]).unwrap();
        let bus = match EmbeddedBus::open(dir.path()) {
            Err(BusError::Corrupt { location, .. }) => {
                assert_eq!(
                    Path::new(&location),
                    log,
                    "round {round}: names the segment"
                );
                corrupt += 1;
                continue;
            }
            Err(other) => panic!("round {round}: open failed other than Corrupt: {other}"),
            Ok(bus) => bus,
        };
        let events = read_all(&bus, partition)
            .unwrap_or_else(|e| panic!("round {round}: partition {partition}: {e}"));
        for (uid, ack) in acked.iter().filter(|(_, a)| a.partition == partition) {
            assert!(
                events
                    .get(ack.offset as usize)
                    .is_some_and(|e| e.value["uid"] == *uid),
                "round {round}: acked {uid} at {partition}/{} silently lost \
                 ({} bytes of frames cut to {cut}; the open succeeded)",
                ack.offset,
                frames_end
            );
        }
        whole += 1;
    }
    println!(
        "{CUT_ROUNDS} rounds: {corrupt} reported Corrupt, {whole} reopened with every acked record, \
         silently lost = 0"
    );
    assert_eq!(corrupt + whole, CUT_ROUNDS);
}

/// How many segment files of the topic end in a zero byte.
fn ends_with_zero(dir: &Path) -> usize {
    (0..PARTITIONS)
        .flat_map(|partition| support::segments(dir, partition))
        .filter(|log| std::fs::read(log).unwrap().last() == Some(&0))
        .count()
}

fn verify(dir: &Path, acked: &BTreeMap<String, Acked>, round: usize) {
    let bus = open(dir);
    let mut stored = 0;
    for partition in 0..PARTITIONS {
        let events = read_all(&bus, partition)
            .unwrap_or_else(|e| panic!("round {round}: partition {partition}: {e}"));
        assert_gap_free(&events);
        let mut uids = HashSet::new();
        for event in &events {
            let uid = event.value["uid"].as_str().unwrap().to_owned();
            assert!(
                uids.insert(uid.clone()),
                "round {round}: {uid} stored twice"
            );
            if let Some(ack) = acked.get(&uid) {
                assert_eq!(
                    (ack.partition, ack.offset),
                    (partition, event.offset),
                    "{uid}"
                );
                assert_eq!(event.value, value_for(&uid, ack.i), "{uid} changed");
            }
        }
        stored += events.len();
        for (uid, ack) in acked.iter().filter(|(_, a)| a.partition == partition) {
            assert!(
                events
                    .get(ack.offset as usize)
                    .is_some_and(|e| e.value["uid"] == *uid),
                "round {round}: acked {uid} at {}/{} is missing",
                ack.partition,
                ack.offset
            );
        }
        // Publishing continues right after the last record.
        let key = bus_conformance::util::key_for_partition("next", partition, PARTITIONS);
        let uid = format!("parent-{round}-{partition}");
        let ack = bus
            .publish_idempotent(TOPIC, &key, &value_for(&uid, 0), &uid)
            .unwrap();
        assert_eq!(ack.offset, events.len() as u64);
    }
    assert!(stored >= acked.len());
}

#[test]
fn lock_is_refused_while_held_and_released_by_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()));
    let mut child = spawn_child(dir.path(), "hold", 0);
    let (receive, reader) = lines(&mut child);
    let line = receive.recv_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(line, "READY");
    match EmbeddedBus::open(dir.path()) {
        Err(BusError::Locked { path }) => assert_eq!(path, dir.path()),
        other => panic!("expected Locked, got {other:?}"),
    }
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    let bus = open(dir.path());
    assert!(bus.topics().is_empty());
    // The same process cannot open it twice either.
    assert!(matches!(
        EmbeddedBus::open(dir.path()),
        Err(BusError::Locked { .. })
    ));
}
