//! One kill -9 harness for the backends' durable-consumer crash tests
//! (C21 at-least-once and durable acks, C22 dead letters, C23 one owner).
//!
//! A test binary plays two parts. As the **child** (re-invoked by the
//! parent with `BUS_CONSUMER_CHILD` set) it opens its backend's bus, a
//! durable consumer `worker` and, in a consuming round, a producer thread
//! ([`run_child`]); it prints one protocol line per step on stdout:
//!
//! - `@@H p o`: record (p, o) handed to the handler;
//! - `@@A p o`: its ack returned, so it is durable (`ack_every(1)`);
//! - `@@D p o`: the record, poisoned on purpose, was dead-lettered (`nack`
//!   returned);
//! - `@@F p o`: its ack was refused with `Fenced` (another owner, C23); the
//!   child stops;
//! - `@@DONE`: a draining child found nothing left.
//!
//! `@@` marks the start of a line: libtest's `test consumer_child_process
//! ... ` has no newline of its own, so the first line shares its line.
//!
//! As the **parent** ([`Run`]) it starts a child per round and kills it
//! after a random number of lines, lets a last child drain the topic, then
//! reads back what is stored ([`Outcome`]) and checks that every record was
//! handled at least once, none handled again after its durable ack, and the
//! dead-letter topic holds exactly the poisoned records, once each.
//!
//! What differs per backend is a [`Plan`] (timeouts, the consumer's open
//! retry, where the producer runs, the child's stderr), the environment the
//! child gets to open its bus, the consume options (owner policy) and the
//! ack itself (PostgreSQL acks some records inside the handler's
//! transaction). A backend with extra fault steps drives the rounds itself
//! ([`Run::round`]) and does its step between two of them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bus_core::{BusError, EventBus, Manifest, TopicSpec};
use serde_json::{Value, json};

mod child;
mod parent;
#[cfg(test)]
mod tests;

pub use child::{Role, plain_ack, role, run_child, say, var};
pub use parent::{Outcome, Run, lines, spawn_child};

/// The variable that makes the test binary a child: its mode.
pub const CHILD_VAR: &str = "BUS_CONSUMER_CHILD";
/// The variable carrying the child's round (what its producer publishes).
pub const ROUND_VAR: &str = "BUS_CONSUMER_ROUND";
/// The durable consumer's name.
pub const CONSUMER: &str = "worker";

/// A (partition, offset) pair.
pub type Key = (u32, u64);

/// Something the harness could not do (not a broken rule: those are
/// [`Outcome::assert_holds`]'s).
#[derive(Debug)]
pub enum CrashError {
    /// A bus call failed.
    Bus(BusError),
    /// Spawning, killing or talking to a child failed.
    Io(std::io::Error),
    /// The child's environment or a protocol line made no sense.
    Protocol(String),
    /// The draining child (which nobody kills) exited unsuccessfully.
    ChildFailed(String),
}

impl std::fmt::Display for CrashError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bus(error) => write!(f, "bus: {error}"),
            Self::Io(error) => write!(f, "child process: {error}"),
            Self::Protocol(what) => write!(f, "protocol: {what}"),
            Self::ChildFailed(what) => write!(f, "child failed: {what}"),
        }
    }
}

impl std::error::Error for CrashError {}

impl From<BusError> for CrashError {
    fn from(error: BusError) -> Self {
        Self::Bus(error)
    }
}

impl From<std::io::Error> for CrashError {
    fn from(error: std::io::Error) -> Self {
        Self::Io(error)
    }
}

/// Where the round's records are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Producer {
    /// A thread of the consuming child, so a kill also cuts publishing
    /// (the embedded log needs this: one writer per directory).
    Child,
    /// The parent, before it starts the round's child.
    Parent,
}

/// Where a child's stderr goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildStderr {
    /// Nowhere.
    Silent,
    /// To the test's output for the draining child only (it is not killed:
    /// why it failed, if it does, belongs in the output).
    Drain,
    /// To the test's output for every child.
    All,
}

/// What differs per backend.
#[derive(Debug, Clone)]
pub struct Plan {
    /// For the printed figures.
    pub backend: &'static str,
    /// The consumed topic.
    pub topic: &'static str,
    /// The dead-letter topic (one partition).
    pub dead_letter: &'static str,
    /// Partitions of `topic`.
    pub partitions: u32,
    /// Killed rounds before the drain.
    pub rounds: usize,
    /// Records published per round.
    pub per_round: u64,
    /// Lines before a kill: 1 to this many, at random.
    pub max_lines: u64,
    /// The longest a round waits for its lines.
    pub round_deadline: Duration,
    /// Wait for a round's first line (connecting and opening come first).
    pub first_line: Duration,
    /// Wait for each further line: silence this long means the child
    /// consumed everything there was, and it is killed early.
    pub next_line: Duration,
    /// A consuming child's `recv_timeout`.
    pub poll: Duration,
    /// A draining child's `recv_timeout`: nothing in this long is `DONE`.
    pub drain_idle: Duration,
    /// Retry a transient error of `consume` this long (Kafka's metadata
    /// settling after a kill), or not at all.
    pub open_retry: Option<Duration>,
    /// Where the round's records are published.
    pub producer: Producer,
    /// Where a child's stderr goes.
    pub child_stderr: ChildStderr,
    /// Page size when reading everything back.
    pub fetch_page: usize,
    /// The child's `#[test]` function.
    pub child_test: &'static str,
}

impl Plan {
    /// The embedded backend's plan, a base for the others.
    pub const fn new(backend: &'static str) -> Self {
        Self {
            backend,
            topic: "jobs",
            dead_letter: "jobs-dead",
            partitions: 2,
            rounds: 50,
            per_round: 20,
            max_lines: 30,
            round_deadline: Duration::from_secs(30),
            first_line: Duration::from_secs(2),
            next_line: Duration::from_secs(2),
            poll: Duration::from_millis(200),
            drain_idle: Duration::from_millis(500),
            open_retry: None,
            producer: Producer::Child,
            child_stderr: ChildStderr::Silent,
            fetch_page: 1024,
            child_test: "consumer_child_process",
        }
    }

    /// The topic and its dead-letter topic, to provision.
    pub fn manifest(&self) -> Manifest {
        Manifest::new([
            TopicSpec::new(self.topic, self.partitions),
            TopicSpec::new(self.dead_letter, 1),
        ])
    }
}

/// Record `i` is poisoned on purpose: the child dead-letters it (C22).
pub fn is_poison(i: u64) -> bool {
    i % 7 == 3
}

/// The index `i` a record was published with.
pub fn index_of(value: &Value) -> Option<u64> {
    value["i"].as_u64()
}

/// Publishes round `round`'s records (`k{i}`, `{"i", "poison"}`),
/// idempotently by `r{i}` so a retried round repeats nothing.
///
/// # Errors
/// The first failed publish.
pub fn publish_round<B>(bus: &B, plan: &Plan, round: u64) -> Result<(), BusError>
where
    B: EventBus + ?Sized,
{
    for n in 0..plan.per_round {
        let i = round * plan.per_round + n;
        let value = json!({"i": i, "poison": is_poison(i)});
        bus.publish_idempotent(plan.topic, &format!("k{i}"), &value, &format!("r{i}"))?;
    }
    Ok(())
}

/// What a child does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Consume until killed.
    Consume,
    /// Consume until nothing is left, say `DONE` and exit.
    Drain,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Consume => "consume",
            Self::Drain => "drain",
        }
    }
}

/// What was handled and acknowledged, by (partition, offset), as the
/// children reported it.
#[derive(Debug, Default)]
pub struct Figures {
    /// How often each record was handed to a handler.
    pub handled: BTreeMap<Key, u32>,
    /// Records whose ack (or dead-lettering nack) returned: durable.
    pub acked: BTreeSet<Key>,
    /// Handlings of a record after its durable ack (C21: must be 0).
    pub handled_after_ack: u64,
    /// Handlings of a record handled before but not acked (allowed: C21
    /// is at least once).
    pub redelivered_unacked: u64,
    /// `D` lines.
    pub dead_lettered: u64,
    /// Acks refused with `Fenced` (C23).
    pub fencing_refusals: u64,
}

impl Figures {
    /// Counts one handling of `key`.
    pub fn handle(&mut self, key: Key) {
        if self.acked.contains(&key) {
            self.handled_after_ack += 1;
        }
        let count = self.handled.entry(key).or_default();
        if *count > 0 {
            self.redelivered_unacked += 1;
        }
        *count += 1;
    }

    /// Counts one protocol line (`H`, `A`, `D` or `F` with `p o`).
    ///
    /// # Errors
    /// On any other line.
    pub fn take(&mut self, line: &str) -> Result<(), CrashError> {
        let bad = || CrashError::Protocol(format!("unexpected line {line:?}"));
        let mut parts = line.split(' ');
        let kind = parts.next().ok_or_else(bad)?;
        let p: u32 = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let o: u64 = parts.next().and_then(|o| o.parse().ok()).ok_or_else(bad)?;
        match kind {
            "H" => self.handle((p, o)),
            "A" => {
                self.acked.insert((p, o));
            }
            "D" => {
                self.dead_lettered += 1;
                self.acked.insert((p, o));
            }
            "F" => self.fencing_refusals += 1,
            _ => return Err(bad()),
        }
        Ok(())
    }
}

/// A seeded generator: `BUS_TEST_SEED` or the clock, printed so a failing
/// run can be repeated.
#[derive(Debug)]
pub struct Rng {
    inner: fastrand::Rng,
    seed: u64,
}

impl Rng {
    /// Seeds from `BUS_TEST_SEED` or the clock and prints the seed.
    pub fn new() -> Self {
        let seed = std::env::var("BUS_TEST_SEED")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| fastrand::u64(..));
        eprintln!("BUS_TEST_SEED={seed}");
        Self {
            inner: fastrand::Rng::with_seed(seed),
            seed,
        }
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.inner.u64(..n) }
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

impl Default for Rng {
    fn default() -> Self {
        Self::new()
    }
}
