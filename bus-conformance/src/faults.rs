//! Node kills on a cluster (issue 19), for the NATS and Kafka
//! `cluster_faults` tests: publisher threads, each publishing with UIDs
//! through a bus until acked, while the test kills and restarts nodes; then
//! the checks that every acked record is stored exactly once at its acked
//! offset, and the figures each test prints.

pub use bus_core::backend::sync::lock;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bus_core::{EventBus, PublishAck, Subscription};
use serde_json::json;

use crate::util::{assert_contiguous, fetch_all, poll_until};

/// One publisher thread: the bus it publishes through and that bus's
/// operation timeout (a failed call must end within it + 1 s, contract C10).
#[derive(Clone, Copy)]
pub struct Publisher<'a> {
    /// The bus.
    pub bus: &'a dyn EventBus,
    /// Its operation timeout.
    pub timeout: Duration,
}

/// One acknowledged publish.
#[derive(Debug, Clone)]
pub struct Acked {
    /// The publisher thread (its records have key `k{thread}`).
    pub thread: usize,
    /// The thread's record number.
    pub seq: usize,
    /// The ack.
    pub ack: PublishAck,
    /// When the successful call started.
    pub started: Instant,
    /// When it returned.
    pub ended: Instant,
}

/// What the publishers saw.
#[derive(Debug, Default)]
pub struct Log {
    /// Every ack.
    pub acked: Vec<Acked>,
    /// Every failed call: how long it took, and the error.
    pub failures: Vec<(Duration, String)>,
}

impl Log {
    /// The time from `at` to the first ack of a call started after `at`.
    #[must_use]
    pub fn resumed_after(&self, at: Instant) -> Option<Duration> {
        self.acked
            .iter()
            .filter(|acked| acked.started >= at)
            .map(|acked| acked.ended - at)
            .min()
    }

    /// The longest time between two consecutive acks.
    #[must_use]
    pub fn longest_gap(&self) -> Duration {
        let mut ends: Vec<Instant> = self.acked.iter().map(|acked| acked.ended).collect();
        ends.sort();
        ends.windows(2)
            .map(|pair| pair[1] - pair[0])
            .max()
            .unwrap_or_default()
    }

    /// The slowest failed call.
    #[must_use]
    pub fn slowest_failure(&self) -> Duration {
        self.failures
            .iter()
            .map(|(took, _)| *took)
            .max()
            .unwrap_or_default()
    }
}

/// The UID of a thread's record.
#[must_use]
pub fn uid(thread: usize, seq: usize) -> String {
    format!("t{thread}-{seq}")
}

fn value(thread: usize, seq: usize) -> serde_json::Value {
    json!({ "t": thread, "i": seq })
}

/// Publishes record `seq` of `thread` on `topic` until acked.
///
/// # Panics
/// On a non-transient error, a failed call slower than the timeout + 1 s,
/// or no ack within `wait`.
pub fn publish_until_acked(
    publisher: Publisher<'_>,
    topic: &str,
    thread: usize,
    seq: usize,
    log: &Mutex<Log>,
    wait: Duration,
) {
    let first = Instant::now();
    let key = format!("k{thread}");
    loop {
        let started = Instant::now();
        match publisher
            .bus
            .publish_idempotent(topic, &key, &value(thread, seq), &uid(thread, seq))
        {
            Ok(ack) => {
                lock(log).acked.push(Acked {
                    thread,
                    seq,
                    ack,
                    started,
                    ended: Instant::now(),
                });
                return;
            }
            Err(error) => {
                let took = started.elapsed();
                lock(log).failures.push((took, error.to_string()));
                assert!(
                    error.is_transient(),
                    "publish {} failed with a non-transient error: {error}",
                    uid(thread, seq)
                );
                assert!(
                    took <= publisher.timeout + Duration::from_secs(1),
                    "a failed publish took {took:?} (> timeout + 1 s): {error}"
                );
                assert!(
                    first.elapsed() < wait,
                    "{} not acked within {wait:?}",
                    uid(thread, seq)
                );
            }
        }
    }
}

/// One thread per entry of `publishers` (thread `i` publishes through
/// `publishers[i]`) until `during` returns; the publishers' log.
pub fn with_publishers(
    publishers: &[Publisher<'_>],
    topic: &str,
    wait: Duration,
    during: impl FnOnce(&Mutex<Log>),
) -> Log {
    let log = Mutex::new(Log::default());
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for (thread, &publisher) in publishers.iter().enumerate() {
            let (log, stop) = (&log, &stop);
            scope.spawn(move || {
                let mut seq = 0;
                while !stop.load(Ordering::Relaxed) {
                    publish_until_acked(publisher, topic, thread, seq, log, wait);
                    seq += 1;
                }
            });
        }
        let guard = StopOnDrop(&stop);
        during(&log);
        drop(guard);
    });
    log.into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Waits until the log holds more than `more_than` acks.
///
/// # Panics
/// After `wait`.
pub fn wait_acks(log: &Mutex<Log>, more_than: usize, what: &str, wait: Duration) {
    poll_until(what, wait, || {
        (lock(log).acked.len() > more_than).then_some(())
    });
}

/// What [`check_stored`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Acks checked.
    pub checked: usize,
    /// Acked records not stored.
    pub lost: usize,
    /// Records stored more than once.
    pub duplicated: usize,
    /// Records in the partition.
    pub stored: usize,
}

/// Partition 0 of `topic` read back: offsets gap-free, every acked record
/// stored exactly once at its acked offset.
///
/// # Panics
/// On a gap, or an acked record stored first at another offset.
#[must_use]
pub fn check_stored(bus: &dyn EventBus, topic: &str, log: &Log) -> Tally {
    let events = fetch_all(bus, topic, 0, 0);
    assert_contiguous(&events);
    let mut seen: HashMap<(u64, u64), Vec<u64>> = HashMap::new();
    for event in &events {
        let id = (
            event.value["t"].as_u64().unwrap_or(u64::MAX),
            event.value["i"].as_u64().unwrap_or(u64::MAX),
        );
        seen.entry(id).or_default().push(event.offset);
    }
    let duplicated = seen.values().filter(|offsets| offsets.len() > 1).count();
    let mut lost = 0;
    for acked in &log.acked {
        match seen.get(&(acked.thread as u64, acked.seq as u64)) {
            Some(offsets) => assert_eq!(
                offsets[0],
                acked.ack.offset,
                "{} stored at another offset than acked",
                uid(acked.thread, acked.seq)
            ),
            None => lost += 1,
        }
    }
    Tally {
        checked: log.acked.len(),
        lost,
        duplicated,
        stored: events.len(),
    }
}

/// Publishes every `step`th acked record again through `bus`: each retry
/// returns the original ack (dedup across the fault); how many were tried.
///
/// # Panics
/// On an error or another ack.
pub fn retry_acked(bus: &dyn EventBus, topic: &str, log: &Log, step: usize) -> usize {
    let mut tried = 0;
    for acked in log.acked.iter().step_by(step.max(1)) {
        let again = bus
            .publish_idempotent(
                topic,
                &format!("k{}", acked.thread),
                &value(acked.thread, acked.seq),
                &uid(acked.thread, acked.seq),
            )
            .unwrap_or_else(|error| panic!("retry of {}: {error}", uid(acked.thread, acked.seq)));
        assert_eq!(again, acked.ack, "a retry after the fault");
        tried += 1;
    }
    tried
}

/// Reads `subscription` (partition 0 from its start) until it delivered
/// `stored` records: each the next offset, none twice; returns how many
/// transient errors it yielded on the way.
///
/// # Panics
/// On a gap, a duplicate, a non-transient error, or fewer records after
/// `wait`.
pub fn drain_subscription(subscription: &mut Subscription, stored: usize, wait: Duration) -> usize {
    let mut next = 0_u64;
    let mut errors = 0;
    let until = Instant::now() + wait;
    while next < stored as u64 {
        assert!(
            Instant::now() < until,
            "the subscription delivered {next} of {stored} records in {wait:?} \
             ({errors} transient errors)"
        );
        match subscription.recv_timeout(Duration::from_millis(200)) {
            Ok(Some(item)) => {
                let event = item.event().expect("no lag without max_lag");
                assert_eq!(event.offset, next, "subscription gap or duplicate");
                next += 1;
            }
            Ok(None) => {}
            Err(error) => {
                assert!(error.is_transient(), "subscription error: {error}");
                errors += 1;
            }
        }
    }
    errors
}

/// Prints a test's figures on one `cluster-fault` line.
pub fn report(backend: &str, test: &str, fields: &str) {
    eprintln!("cluster-fault {backend} {test}: {fields}");
}

/// Publishes `value` with `uid` twice while the cluster cannot take it:
/// each attempt must fail retryably (`Unavailable` or `Timeout`) within
/// `timeout` + 1 s, never with an ack. Returns the slowest attempt.
///
/// # Panics
/// When an attempt is acked, fails otherwise, or takes longer.
pub fn assert_refused_in_time(
    bus: &dyn EventBus,
    topic: &str,
    value: &serde_json::Value,
    uid: &str,
    timeout: Duration,
) -> Duration {
    let mut slowest = Duration::ZERO;
    for attempt in 0..2 {
        let begun = Instant::now();
        let result = bus.publish_idempotent(topic, "k", value, uid);
        let took = begun.elapsed();
        slowest = slowest.max(took);
        match result {
            Err(error) => {
                assert!(error.is_transient(), "attempt {attempt}: {error}");
                assert!(
                    matches!(
                        error,
                        bus_core::BusError::Unavailable { .. } | bus_core::BusError::Timeout { .. }
                    ),
                    "attempt {attempt}: {error:?}"
                );
            }
            Ok(ack) => panic!("acked {ack:?} with two of three nodes down"),
        }
        assert!(
            took <= timeout + Duration::from_secs(1),
            "attempt {attempt} took {took:?}"
        );
    }
    slowest
}
