//! C10 and C24 against a real S3 outage: a SeaweedFS server of the test's
//! own (`scripts/seaweedfs.sh` on free ports and its own directory) is
//! stopped while an archiver keeps archiving through one tier, then started
//! again on the same data. Every failed call fails within the tier's
//! timeout (plus a second) with a retryable error, a read of the tier fails
//! the same way, the same tier archives again once the server is back,
//! nothing is archived twice or half, and every archived record reads back
//! exactly.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bus_cold::ColdTier;
use common::server::Server;
use common::{records, unique};

/// The tier's bound on each store call.
const TIMEOUT: Duration = Duration::from_secs(5);
/// How long a failed call may take: the bound, and a second.
const LIMIT: Duration = Duration::from_secs(6);
/// SeaweedFS regains its raft leadership on kept data in about 15 s.
const WAIT: Duration = Duration::from_secs(120);
/// Records per archived object.
const OBJECT: u64 = 10;

/// Polls `condition` until it holds, panicking after `deadline`.
fn poll_until(what: &str, deadline: Duration, condition: impl Fn() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

/// What the archiver saw: its next offset, and each failed call with how
/// long it took.
#[derive(Default)]
struct Archiver {
    next: AtomicU64,
    successes: AtomicU64,
    failures: Mutex<Vec<(bus_core::BusError, Duration)>>,
}

impl Archiver {
    fn failed(&self) -> usize {
        self.failures.lock().unwrap().len()
    }

    /// Archives the next object, and the same one again after a failure.
    fn step(&self, tier: &ColdTier, topic: &str) {
        let from = self.next.load(Ordering::SeqCst);
        let batch = records(topic, 0, from, from + OBJECT);
        let started = Instant::now();
        match tier.archive_records(topic, 0, &batch) {
            Ok(_) => {
                self.next.store(from + OBJECT, Ordering::SeqCst);
                self.successes.fetch_add(1, Ordering::SeqCst);
            }
            Err(error) => self
                .failures
                .lock()
                .unwrap()
                .push((error, started.elapsed())),
        }
    }
}

#[test]
fn an_s3_outage_fails_retryably_and_the_same_tier_archives_again() {
    // The server of test.sh says the S3 server is wanted here (its binary
    // is cached); without one this is a loud skip, or a failure with
    // BUS_REQUIRE_BROKERS=1.
    if common::s3("s3-outage").is_none() {
        return;
    }
    let server = Server::new();
    server.start();
    let topic = "outage";
    let location = server.location(&unique("s3-outage"));
    let tier = Arc::new(ColdTier::open_with_timeout(&location, TIMEOUT).unwrap());
    let archiver = Arc::new(Archiver::default());
    let done = Arc::new(AtomicBool::new(false));
    let worker = {
        let (tier, archiver, done) = (Arc::clone(&tier), Arc::clone(&archiver), Arc::clone(&done));
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                archiver.step(&tier, topic);
            }
        })
    };

    poll_until("three objects before the outage", WAIT, || {
        archiver.successes.load(Ordering::SeqCst) >= 3
    });
    server.stop();
    poll_until("two failed archives during the outage", WAIT, || {
        archiver.failed() >= 2
    });
    // A reader that has nothing cached fails the same way.
    let reader = ColdTier::open_with_timeout(&location, TIMEOUT).unwrap();
    let started = Instant::now();
    let read = reader.read(topic, 0, 0, 100).unwrap_err();
    let took = started.elapsed();
    assert!(read.is_transient(), "a read during the outage: {read}");
    assert!(took <= LIMIT, "a read during the outage took {took:?}");

    server.start();
    let before = archiver.successes.load(Ordering::SeqCst);
    poll_until("the same tier to archive again", WAIT, || {
        archiver.successes.load(Ordering::SeqCst) >= before + 3
    });
    done.store(true, Ordering::SeqCst);
    worker.join().unwrap();

    let failures = archiver.failures.lock().unwrap();
    eprintln!(
        "S3 outage: archived {} objects, {} failed calls, slowest {:?}, kinds {:?}",
        archiver.successes.load(Ordering::SeqCst),
        failures.len(),
        failures.iter().map(|(_, took)| *took).max(),
        failures
            .iter()
            .map(|(error, _)| format!("{error}").chars().take(80).collect::<String>())
            .collect::<std::collections::BTreeSet<_>>()
    );
    for (error, took) in failures.iter() {
        assert!(error.is_transient(), "not retryable: {error:?}");
        assert!(*took <= LIMIT, "a failed archive took {took:?}: {error}");
    }

    // Nothing twice, nothing half: the manifest's ranges follow each other
    // up to the archiver's end, every record reads back as archived, and
    // archiving everything again writes nothing.
    let end = archiver.next.load(Ordering::SeqCst);
    let manifest = tier.manifest(topic, 0).unwrap();
    assert_eq!(manifest.end(), end, "{manifest:?}");
    for pair in manifest.ranges.windows(2) {
        assert_eq!(pair[0].end, pair[1].from, "ranges overlap or leave a gap");
    }
    let fresh = ColdTier::open_with_timeout(&location, TIMEOUT).unwrap();
    let mut back = Vec::new();
    while (back.len() as u64) < end {
        let page = fresh.read(topic, 0, back.len() as u64, 100).unwrap();
        assert!(!page.is_empty(), "the tier ends at {} of {end}", back.len());
        back.extend(page);
    }
    assert_eq!(back, records(topic, 0, 0, end));
    assert_eq!(
        tier.archive_records(topic, 0, &records(topic, 0, 0, end))
            .unwrap(),
        0,
        "archived twice"
    );
}
