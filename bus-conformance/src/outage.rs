//! Calls in flight through a broker outage (contract C10), for the network
//! backends' outage tests: publisher threads and a reader thread keep
//! calling one bus while the test stops and restarts its own broker; every
//! failed call is kept with how long it took, every ack with its value.

use bus_core::backend::sync::lock;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bus_core::{BatchRecord, BusError, EventBus, PublishAck, StoredEvent};
use serde_json::{Value, json};

use crate::util::poll_until;

/// How a test takes its broker down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM, then wait for the process to exit: the broker shuts down
    /// cleanly (JetStream stops its streams, Kafka hands off leadership).
    Clean,
    /// SIGKILL: the broker vanishes mid-request.
    Kill,
}

/// Takes the broker process down as `how` says and waits until it exited.
///
/// # Panics
/// When the signal cannot be sent or the process outlives `deadline`.
pub fn stop(child: &mut Child, how: Stop, deadline: Duration) {
    match how {
        Stop::Kill => {
            let _ = child.kill();
        }
        Stop::Clean => signal(child, "TERM"),
    }
    poll_until("the broker process to exit", deadline, || {
        child.try_wait().ok().flatten()
    });
}

/// Sends the signal `name` (`TERM`, `USR2`, ...) to `child`.
///
/// # Panics
/// When it cannot be sent.
pub fn signal(child: &Child, name: &str) {
    // std sends only SIGKILL and the workspace forbids unsafe: kill(1).
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .stdin(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("kill -{name}: {e}"));
    assert!(status.success(), "kill -{name} {} failed", child.id());
}

/// One call that failed.
#[derive(Debug)]
pub struct Failure {
    /// `publish` or `fetch`.
    pub call: &'static str,
    /// From the call to its error.
    pub took: Duration,
    /// What it returned.
    pub error: BusError,
}

/// Live counts of the workers (publishers first, the reader last), for the
/// test to wait on while it stops and restarts the broker.
pub struct Progress {
    ok: Vec<AtomicU64>,
    failed: Vec<AtomicU64>,
    /// Each worker's last error, for the message of a wait that fails.
    last_error: Vec<Mutex<Option<String>>>,
}

impl Progress {
    fn counts(counters: &[AtomicU64]) -> Vec<u64> {
        counters.iter().map(|c| c.load(Ordering::Acquire)).collect()
    }

    fn wait_each(&self, counters: &[AtomicU64], what: &str, deadline: Duration) {
        let before = Self::counts(counters);
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            let now = Self::counts(counters);
            if now.iter().zip(&before).all(|(now, then)| now > then) {
                return;
            }
            if start.elapsed() >= deadline {
                let last: Vec<_> = self.last_error.iter().map(|e| lock(e).clone()).collect();
                panic!(
                    "timed out after {deadline:?} waiting for {what}: counts {before:?} -> {now:?} \
                     (publishers first, the reader last); last errors: {last:#?}"
                );
            }
            std::thread::park_timeout(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// Waits until every worker has had a call succeed from now on.
    ///
    /// # Panics
    /// When one has not within `deadline`.
    pub fn wait_for_successes(&self, what: &str, deadline: Duration) {
        self.wait_each(&self.ok, what, deadline);
    }

    /// Waits until every worker has had a call fail from now on.
    ///
    /// # Panics
    /// When one has not within `deadline`.
    pub fn wait_for_failures(&self, what: &str, deadline: Duration) {
        self.wait_each(&self.failed, what, deadline);
    }
}

/// What the workers saw.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Every successful publish with the value it carried.
    pub acked: Vec<(PublishAck, Value)>,
    /// Every failed call.
    pub failures: Vec<Failure>,
    /// Records the reader fetched.
    pub fetched: u64,
}

impl Outcome {
    /// Every failure came within `limit` and was retryable (`Timeout` or
    /// `Unavailable`), never one that blames the caller or the topic.
    ///
    /// # Panics
    /// On the first failure that was not.
    pub fn assert_failures_transient(&self, limit: Duration) {
        for failure in &self.failures {
            assert!(
                failure.error.is_transient(),
                "a {} failed with a non-retryable error during the outage: {:?}",
                failure.call,
                failure.error
            );
            assert!(
                failure.took <= limit,
                "a failing {} took {:?} (> {limit:?}): {}",
                failure.call,
                failure.took,
                failure.error
            );
        }
    }

    /// The acks, records read and failures counted by call and error, for a
    /// test's output.
    pub fn summary(&self) -> String {
        let mut kinds = std::collections::BTreeMap::<String, usize>::new();
        for failure in &self.failures {
            *kinds
                .entry(format!("{} {:?}", failure.call, failure.error))
                .or_default() += 1;
        }
        format!(
            "acked {}, fetched {}, failures {kinds:#?}",
            self.acked.len(),
            self.fetched
        )
    }

    /// Every acknowledged record is stored at its acked offset with its
    /// value (read through `bus`). The outage is over, but the bus may
    /// still be reconnecting, and a restarted Kafka broker on two loaded
    /// cores answers some reads with a 3 s `Timeout`: a page that fails
    /// with a transient error is asked again (the read goes on from where
    /// it stopped), until no page has come for 30 s.
    ///
    /// # Panics
    /// On a missing or different record, a fetch failing with an error
    /// that is not transient, or no progress for 30 s (naming the last
    /// error).
    pub fn assert_acked_stored(&self, bus: &dyn EventBus, topic: &str, partitions: u32) {
        let stored: Vec<_> = (0..partitions)
            .map(|partition| read_back(bus, topic, partition))
            .collect();
        for (ack, value) in &self.acked {
            let found = stored[ack.partition as usize]
                .iter()
                .find(|event| event.offset == ack.offset);
            assert_eq!(
                found.map(|event| &event.value),
                Some(value),
                "acked record at {}/{} is missing or different",
                ack.partition,
                ack.offset
            );
        }
    }
}

/// How long the read-back after an outage may go without a page.
const READ_BACK: Duration = Duration::from_secs(30);

/// Every record of `partition`, in pages of 100; a page that fails with a
/// transient error is asked again until [`READ_BACK`] passes without one.
fn read_back(bus: &dyn EventBus, topic: &str, partition: u32) -> Vec<StoredEvent> {
    let mut records: Vec<StoredEvent> = Vec::new();
    let mut progress = Instant::now();
    loop {
        let from = records.last().map_or(0, |last| last.offset + 1);
        match bus.fetch(topic, partition, from, 100) {
            Ok(page) if page.is_empty() => return records,
            Ok(page) => {
                assert!(page[0].offset >= from, "fetch went backwards");
                records.extend(page);
                progress = Instant::now();
            }
            Err(error) if error.is_transient() => {
                assert!(
                    progress.elapsed() < READ_BACK,
                    "fetch {topic}/{partition} from {from}: no page for {READ_BACK:?}, the last error: {error}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(error) => panic!("fetch {topic}/{partition} from {from}: {error}"),
        }
    }
}

/// Records in each batch of the batch publishers.
const BATCH: u64 = 100;

/// Tells the workers to stop when dropped.
struct Finish<'a>(&'a AtomicBool);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Runs `publishers` publishing threads (the odd ones in batches) and one thread reading every
/// partition of `topic` (each catching up to the end, again and again)
/// while `during` runs on the calling thread; then stops them and returns
/// what `during` returned and what they saw.
pub fn with_traffic<R>(
    bus: &dyn EventBus,
    topic: &str,
    partitions: u32,
    publishers: usize,
    during: impl FnOnce(&Progress) -> R,
) -> (R, Outcome) {
    let progress = Progress {
        ok: (0..=publishers).map(|_| AtomicU64::new(0)).collect(),
        failed: (0..=publishers).map(|_| AtomicU64::new(0)).collect(),
        last_error: (0..=publishers).map(|_| Mutex::new(None)).collect(),
    };
    let done = AtomicBool::new(false);
    let outcome = Mutex::new(Outcome::default());
    let record = |worker: usize, call: &'static str, started: Instant, error: Option<BusError>| {
        match error {
            None => progress.ok[worker].fetch_add(1, Ordering::AcqRel),
            Some(error) => {
                let took = started.elapsed();
                *lock(&progress.last_error[worker]) = Some(format!("{call}: {error:?}"));
                lock(&outcome).failures.push(Failure { call, took, error });
                progress.failed[worker].fetch_add(1, Ordering::AcqRel)
            }
        };
    };
    let result = std::thread::scope(|scope| {
        for worker in 0..publishers {
            let (done, outcome, record) = (&done, &outcome, &record);
            scope.spawn(move || {
                // Odd workers publish batches: many records in flight at
                // once, so some are on the wire at any moment of a shutdown.
                let size = if worker % 2 == 1 { BATCH } else { 1 };
                for round in 0u64.. {
                    if done.load(Ordering::Acquire) {
                        break;
                    }
                    let batch: Vec<BatchRecord> = (0..size)
                        .map(|i| {
                            let n = round * size + i;
                            let value = json!({ "worker": worker, "n": n });
                            BatchRecord::new(format!("w{worker}-{}", n % 16), value)
                        })
                        .collect();
                    let started = Instant::now();
                    let result = if size == 1 {
                        let record = &batch[0];
                        bus.publish(topic, &record.key, &record.value)
                            .map(|ack| vec![ack])
                    } else {
                        bus.publish_batch(topic, &batch)
                    };
                    match result {
                        Ok(acks) => {
                            let values = batch.into_iter().map(|record| record.value);
                            lock(outcome).acked.extend(acks.into_iter().zip(values));
                            record(worker, "publish", started, None);
                        }
                        Err(error) => record(worker, "publish", started, Some(error)),
                    }
                }
            });
        }
        let (done, outcome, record) = (&done, &outcome, &record);
        scope.spawn(move || {
            let mut next = vec![0u64; partitions as usize];
            for round in 0usize.. {
                if done.load(Ordering::Acquire) {
                    break;
                }
                let partition = round % next.len();
                let started = Instant::now();
                let index = u32::try_from(partition).unwrap_or(u32::MAX);
                match bus.fetch(topic, index, next[partition], 50) {
                    Ok(page) => {
                        if let Some(last) = page.last() {
                            next[partition] = last.offset + 1;
                        }
                        lock(outcome).fetched += page.len() as u64;
                        record(publishers, "fetch", started, None);
                    }
                    Err(error) => record(publishers, "fetch", started, Some(error)),
                }
            }
        });
        // Also when `during` panics, so the scope can join the workers.
        let _finish = Finish(done);
        during(&progress)
    });
    let outcome = outcome
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    (result, outcome)
}

/// How [`offsets_until`] receives from a subscription.
#[derive(Debug, Clone, Copy)]
pub struct Receiving {
    /// Each `recv_timeout` call's timeout.
    pub recv: Duration,
    /// How much longer than `recv` a call may take, outage or not.
    pub slack: Duration,
    /// When to give up altogether.
    pub wait: Duration,
}

/// Offsets of the records `subscription` delivers until `until(offsets,
/// errors so far)` says stop, failing on an error item unless `errors`
/// collects them; every receive must come back within `recv + slack`.
///
/// # Panics
/// On a slow receive, an uncollected error item, or after `wait`.
pub fn offsets_until(
    subscription: &mut bus_core::Subscription,
    receiving: Receiving,
    mut errors: Option<&mut Vec<BusError>>,
    mut until: impl FnMut(&[u64], usize) -> bool,
) -> Vec<u64> {
    let Receiving { recv, slack, wait } = receiving;
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    let mut error_count = 0;
    while !until(&got, error_count) {
        assert!(Instant::now() < deadline, "gave up with {got:?}");
        let started = Instant::now();
        let item = subscription.recv_timeout(recv);
        let took = started.elapsed();
        assert!(took <= recv + slack, "recv_timeout({recv:?}) took {took:?}");
        match item {
            Ok(Some(item)) => got.push(item.event().map_or(u64::MAX, |e| e.offset)),
            Ok(None) => {}
            Err(error) => match errors.as_deref_mut() {
                Some(errors) => {
                    error_count += 1;
                    errors.push(error);
                }
                None => panic!("error item: {error}"),
            },
        }
    }
    got
}
