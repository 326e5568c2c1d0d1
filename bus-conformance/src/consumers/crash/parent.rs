//! The parent's side of the kill -9 harness: children started and killed,
//! their lines counted, what is stored read back and checked.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use bus_core::consumer::ConsumerInfo;
use bus_core::{EventBus, EventBusExt};
use serde_json::Value;

use super::super::ConsumerBus;
use super::{
    CHILD_VAR, CONSUMER, ChildStderr, CrashError, Figures, Key, Mode, Plan, Producer, ROUND_VAR,
    Rng, publish_round,
};

/// Starts this test binary as a child in `mode` for `round`, with the
/// backend's `env` (how the child opens its bus).
///
/// # Errors
/// When it cannot be started.
pub fn spawn_child(
    plan: &Plan,
    mode: Mode,
    round: u64,
    env: &[(String, String)],
) -> std::io::Result<Child> {
    let stderr = match (plan.child_stderr, mode) {
        (ChildStderr::All, _) | (ChildStderr::Drain, Mode::Drain) => Stdio::inherit(),
        _ => Stdio::null(),
    };
    Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            plan.child_test,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_VAR, mode.name())
        .env(ROUND_VAR, round.to_string())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
}

/// The child's complete protocol lines (without `@@`); a line cut by the
/// kill is dropped, other output ignored.
///
/// # Errors
/// When the child's stdout was not piped or was taken already.
pub fn lines(child: &mut Child) -> Result<Receiver<String>, CrashError> {
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| CrashError::Protocol("the child's stdout is not piped".to_owned()))?;
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if !line.ends_with('\n') => return,
                Ok(_) => {
                    let Some(at) = line.find("@@") else {
                        continue;
                    };
                    if send.send(line[at + 2..].trim_end().to_owned()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    Ok(receive)
}

/// The parent's side: rounds of killed children, the drain, the outcome.
pub struct Run<'a> {
    plan: &'a Plan,
    producer: Option<&'a dyn EventBus>,
    env: Vec<(String, String)>,
    rng: Rng,
    figures: Figures,
    rounds: usize,
    started: Instant,
}

impl<'a> Run<'a> {
    /// A run whose children open their bus (provisioned with
    /// [`Plan::manifest`]) as `env` tells them. The parent holds no bus
    /// meanwhile (the embedded log allows one writer per directory) unless
    /// it produces ([`Run::producing_on`]).
    pub fn new(plan: &'a Plan, env: Vec<(String, String)>) -> Self {
        Self {
            plan,
            producer: None,
            env,
            rng: Rng::new(),
            figures: Figures::default(),
            rounds: 0,
            started: Instant::now(),
        }
    }

    /// The bus the parent publishes each round's records on, for
    /// [`Producer::Parent`].
    #[must_use]
    pub fn producing_on(mut self, bus: &'a dyn EventBus) -> Self {
        self.producer = Some(bus);
        self
    }

    /// Every round of the plan, then the drain.
    ///
    /// # Errors
    /// As [`Run::round`] and [`Run::drain`].
    pub fn all_rounds_and_drain(&mut self) -> Result<(), CrashError> {
        for round in 0..self.plan.rounds {
            self.round(round as u64)?;
        }
        self.drain()
    }

    /// One round: publishes its records when the parent produces, starts a
    /// consuming child, kills it (SIGKILL) after 1 to [`Plan::max_lines`]
    /// lines, or once it said nothing for [`Plan::next_line`] (it consumed
    /// everything there was), then counts what it managed to print.
    /// Returns the lines counted.
    ///
    /// # Errors
    /// A failed publish, spawn or kill, or a malformed line.
    pub fn round(&mut self, round: u64) -> Result<u64, CrashError> {
        if self.plan.producer == Producer::Parent {
            let bus = self.producer.ok_or_else(|| {
                CrashError::Protocol("Producer::Parent without Run::producing_on".to_owned())
            })?;
            publish_round(bus, self.plan, round)?;
        }
        let target = 1 + self.rng.below(self.plan.max_lines);
        let mut child = spawn_child(self.plan, Mode::Consume, round, &self.env)?;
        let receive = lines(&mut child)?;
        let deadline = Instant::now() + self.plan.round_deadline;
        let mut got = 0u64;
        while got < target {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = if got == 0 {
                self.plan.first_line
            } else {
                self.plan.next_line
            };
            match receive.recv_timeout(left.min(wait)) {
                Ok(line) => {
                    self.figures.take(&line)?;
                    got += 1;
                }
                Err(_) => break,
            }
        }
        child.kill()?;
        child.wait()?;
        // What it printed before the kill landed.
        for line in receive.iter() {
            self.figures.take(&line)?;
            got += 1;
        }
        self.rounds += 1;
        Ok(got)
    }

    /// A last child, not killed, drains what is left.
    ///
    /// # Errors
    /// When it cannot be started, prints a malformed line or fails.
    pub fn drain(&mut self) -> Result<(), CrashError> {
        let round = self.plan.rounds as u64;
        let mut child = spawn_child(self.plan, Mode::Drain, round, &self.env)?;
        let receive = lines(&mut child)?;
        for line in receive.iter() {
            if line == "DONE" {
                break;
            }
            self.figures.take(&line)?;
        }
        let status = child.wait()?;
        if status.success() {
            Ok(())
        } else {
            Err(CrashError::ChildFailed(format!(
                "the draining child failed: {status}"
            )))
        }
    }

    /// The figures so far.
    pub fn figures(&self) -> &Figures {
        &self.figures
    }

    /// Reads back, on `bus`, the topic, the dead letters and the
    /// consumer's cursor.
    ///
    /// # Errors
    /// A failed read, or a dead letter without its metadata.
    pub fn finish(self, bus: &dyn ConsumerBus) -> Result<Outcome, CrashError> {
        let plan = self.plan;
        let mut records = BTreeMap::new();
        for p in 0..plan.partitions {
            for event in bus.fetch_all(plan.topic, p, 0, plan.fetch_page)? {
                records.insert((p, event.offset), event.value);
            }
        }
        let mut dead = Vec::new();
        for letter in bus.fetch_all(plan.dead_letter, 0, 0, plan.fetch_page)? {
            let meta = &letter.value["dead_letter"];
            let key = meta["partition"]
                .as_u64()
                .and_then(|p| u32::try_from(p).ok())
                .zip(meta["offset"].as_u64())
                .ok_or_else(|| {
                    CrashError::Protocol(format!("a dead letter without its origin: {meta}"))
                })?;
            dead.push(key);
        }
        let consumers = bus.consumers(plan.topic)?;
        Ok(Outcome {
            backend: plan.backend,
            rounds: self.rounds,
            elapsed: self.started.elapsed(),
            seed: self.rng.seed(),
            records,
            dead,
            consumers,
            figures: self.figures,
        })
    }
}

/// What the run left behind, to print and check.
#[derive(Debug)]
pub struct Outcome {
    /// The backend's name.
    pub backend: &'static str,
    /// Killed rounds.
    pub rounds: usize,
    /// Rounds, drain and reading back.
    pub elapsed: Duration,
    /// The generator's seed.
    pub seed: u64,
    /// Every stored record's value by (partition, offset).
    pub records: BTreeMap<Key, Value>,
    /// The origins of the dead letters, in their order.
    pub dead: Vec<Key>,
    /// The topic's durable consumers.
    pub consumers: Vec<ConsumerInfo>,
    /// What the children reported.
    pub figures: Figures,
}

impl Outcome {
    /// The records poisoned on purpose.
    pub fn poisoned(&self) -> BTreeSet<Key> {
        self.records
            .iter()
            .filter(|(_, value)| value["poison"] == true)
            .map(|(key, _)| *key)
            .collect()
    }

    /// The figures as one line.
    pub fn summary(&self) -> String {
        let f = &self.figures;
        format!(
            "consumer kill -9 ({}): rounds {} in {:.1} s, records {}, handled twice after a \
             durable ack {}, redelivered without an ack {}, dead-lettered {} (poisoned {}), \
             fencing refusals {}, seed {}",
            self.backend,
            self.rounds,
            self.elapsed.as_secs_f64(),
            self.records.len(),
            f.handled_after_ack,
            f.redelivered_unacked,
            self.dead.len(),
            self.poisoned().len(),
            f.fencing_refusals,
            self.seed,
        )
    }

    /// Checks the rules: every record handled at least once and none again
    /// after its durable ack (C21); the dead-letter topic holds exactly the
    /// poisoned records, once each (C22); the consumer has no lag left.
    ///
    /// # Panics
    /// When one is broken, naming it.
    pub fn assert_holds(&self) {
        let unhandled: Vec<_> = self
            .records
            .keys()
            .filter(|k| !self.figures.handled.contains_key(k))
            .collect();
        assert!(unhandled.is_empty(), "never handled: {unhandled:?}");
        assert_eq!(
            self.figures.handled_after_ack, 0,
            "a durably acked record was handled again"
        );
        let dead_set: BTreeSet<Key> = self.dead.iter().copied().collect();
        assert_eq!(
            self.dead.len(),
            dead_set.len(),
            "a record dead-lettered twice"
        );
        assert_eq!(
            dead_set,
            self.poisoned(),
            "the dead-letter topic holds exactly the poisoned records"
        );
        let worker = self.consumers.iter().find(|c| c.name == CONSUMER);
        assert!(
            worker.is_some_and(|w| w.partitions.iter().all(|p| p.lag_records == 0)),
            "the consumer has lag left: {:?}",
            self.consumers
        );
    }
}
