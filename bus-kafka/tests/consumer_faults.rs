//! Durable consumers on Kafka under faults (C21–C23), against the broker
//! of `BUS_KAFKA_BROKERS`; each test owns its manifest topic and its
//! topics (named after the manifest's id: bus topic names are Kafka topic
//! names, whatever the manifest) and deletes them at the end. The tests
//! run in parallel (as `cargo test` runs them in CI); a child's stderr is
//! kept in a file per round, shown when a round fails.
//! - kill -9: a child process (this test binary re-invoked) publishes from
//!   a producer thread while a durable consumer in the same process
//!   handles each record (prints `H`), then acknowledges it (prints `A`
//!   once the ack is durable: `ack_every(1)`) or, for the records poisoned
//!   on purpose, dead-letters it (prints `D` once `nack` returned). The
//!   parent kills the child at random moments over many rounds, lets a
//!   last child drain the topic, and checks: every record handled at least
//!   once; none handled again after its durable ack; the dead-letter topic
//!   holds exactly the poisoned records, once each. The children open with
//!   `TakeOver` (the previous one is dead for sure; waiting out its lease
//!   each round would only add time); a dead owner's lease is tested
//!   apart (`a_dead_owner_keeps_the_consumer_only_for_its_lease`).
//! - Two instances of one consumer take it over from each other, back and
//!   forth, while both consume: no record is acknowledged by both.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bus_core::consumer::{ConsumeOptions, DurableConsumers, OwnerPolicy};
use bus_core::{BusError, EventBus, EventBusExt, Manifest, Selector, StartAt, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions};

/// The consumed topic and its dead-letter topic of test namespace `id`.
/// Bus topic names are not scoped by the manifest (topic "jobs" is the
/// Kafka topic "jobs" whatever the manifest), so each test names its own:
/// with shared names, the first test to finish deleted the topics the
/// others still consumed, and their `consume` failed with "unknown
/// partition" until their deadlines (the stalls of #28).
fn topic_of(id: &str) -> String {
    format!("jobs-{id}")
}

fn dlq_of(id: &str) -> String {
    format!("jobs-{id}-dead")
}
const PARTITIONS: u32 = 2;
const ROUNDS: usize = 50;
const PER_ROUND: u64 = 20;

fn is_poison(i: u64) -> bool {
    i % 7 == 3
}

/// A small xorshift generator seeded from the clock (printed, so a failing
/// run can be told apart).
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        eprintln!("rng seed {seed}");
        Self(seed)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn options(brokers: &str, manifest: &str) -> KafkaOptions {
    KafkaOptions::new(brokers.split(',').map(str::to_owned)).manifest_topic(manifest.to_owned())
}

/// Deletes a test's topics, its cursor topic and its manifest topic.
struct Cleanup {
    brokers: String,
    manifest: String,
    /// The namespace id, which names the test's topics.
    id: String,
    topic: String,
    dlq: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let mut raw = vec![self.manifest.clone()];
        if let Ok(bus) = KafkaBus::connect_with(options(&self.brokers, &self.manifest)) {
            let _ = bus.delete_topics(&bus.topics());
            raw.push(bus.cursor_topic());
        }
        common::delete_raw_topics(&self.brokers, &raw);
    }
}

/// `RUST_LOG=bus_kafka=debug` shows the store's retries (in a child's
/// log file, or in the test's output).
/// Without `RUST_LOG`, nothing (the expected fencing errors of the race
/// test would flood the output: this writer is not captured by libtest).
fn init_tracing() {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    }
}

fn setup(test: &str) -> Option<(KafkaBus, Cleanup)> {
    init_tracing();
    let brokers = match common::brokers() {
        Ok(brokers) => brokers,
        Err(why) => {
            common::skip(test, &why);
            return None;
        }
    };
    let id = bus_conformance::namespace_id(12);
    let manifest = format!("bus-test-cfault-{id}");
    let (topic, dlq) = (topic_of(&id), dlq_of(&id));
    let bus = KafkaBus::connect_with(options(&brokers, &manifest)).unwrap();
    bus.provision(&Manifest::new([
        TopicSpec::new(&topic, PARTITIONS),
        TopicSpec::new(&dlq, 1),
    ]))
    .unwrap();
    Some((
        bus,
        Cleanup {
            brokers,
            manifest,
            id,
            topic,
            dlq,
        },
    ))
}

/// The child's body; a no-op unless the parent set `BUS_CONSUMER_CHILD`.
#[test]
fn consumer_child_process() {
    let Ok(mode) = std::env::var("BUS_CONSUMER_CHILD") else {
        return;
    };
    init_tracing();
    let brokers = std::env::var("BUS_CONSUMER_BROKERS").unwrap();
    let manifest = std::env::var("BUS_CONSUMER_MANIFEST").unwrap();
    let id = std::env::var("BUS_CONSUMER_ID").unwrap();
    let (topic, dlq) = (topic_of(&id), dlq_of(&id));
    let round: u64 = std::env::var("BUS_CONSUMER_ROUND")
        .unwrap()
        .parse()
        .unwrap();
    let bus = KafkaBus::connect_with(options(&brokers, &manifest)).unwrap();
    let producer = (mode == "consume").then_some(round);
    let options = ConsumeOptions::default()
        .dead_letter(dlq.as_str())
        .owner(OwnerPolicy::TakeOver);
    // A fresh client can meet the broker's metadata still settling (an
    // `Unavailable` "unknown partition" right after a kill): what a careful
    // user does, retry a transient error until a deadline.
    let opened = Instant::now();
    eprintln!("child {mode} round {round}: connected");
    let mut consumer = loop {
        match bus.consume(
            &topic,
            "worker",
            Selector::Topic,
            StartAt::Beginning,
            options.clone(),
        ) {
            Ok(consumer) => break consumer,
            Err(error) if error.is_transient() && opened.elapsed() < Duration::from_secs(60) => {
                eprintln!("consume: {error} (transient, retrying)");
            }
            Err(error) => panic!("consume: {error}"),
        }
    };
    eprintln!(
        "child {mode} round {round}: consuming after {:.2} s",
        opened.elapsed().as_secs_f64()
    );
    let out = std::io::stdout();
    let say = |line: String| {
        let mut out = out.lock();
        writeln!(out, "@@{line}").unwrap();
        out.flush().unwrap();
    };
    std::thread::scope(|scope| {
        if let Some(round) = producer {
            let (bus, topic) = (&bus, &topic);
            scope.spawn(move || {
                for n in 0..PER_ROUND {
                    let i = round * PER_ROUND + n;
                    let value = serde_json::json!({"i": i, "poison": is_poison(i)});
                    bus.publish_idempotent(topic, &format!("k{i}"), &value, &format!("r{i}"))
                        .unwrap();
                }
            });
        }
        loop {
            let timeout = Duration::from_millis(if mode == "drain" { 3000 } else { 200 });
            let Some(delivery) = consumer.recv_timeout(timeout).unwrap() else {
                if mode == "drain" {
                    say("DONE".to_owned());
                    return;
                }
                continue;
            };
            let (p, o) = (delivery.partition, delivery.offset);
            say(format!("H {p} {o}"));
            if delivery.event.value["poison"] == true {
                consumer.nack(&delivery, "poisoned on purpose").unwrap();
                say(format!("D {p} {o}"));
            } else {
                consumer.ack(&delivery).unwrap();
                say(format!("A {p} {o}"));
            }
        }
    });
}

/// Starts a child; its stderr goes to `log` (one file per round, so the
/// error a child kept retrying, or where it spent its time, can be read
/// after the kill) or, without one, to the test's own stderr.
fn spawn(test: &Cleanup, mode: &str, round: usize, log: Option<&Path>) -> Child {
    let stderr = match log {
        Some(path) => Stdio::from(std::fs::File::create(path).unwrap()),
        None => Stdio::inherit(),
    };
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "consumer_child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BUS_CONSUMER_CHILD", mode)
        .env("BUS_CONSUMER_BROKERS", &test.brokers)
        .env("BUS_CONSUMER_MANIFEST", &test.manifest)
        .env("BUS_CONSUMER_ID", &test.id)
        .env("BUS_CONSUMER_ROUND", round.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// Complete protocol lines of the child's stdout; a line cut by the kill
/// is dropped.
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().unwrap();
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
    receive
}

#[derive(Default)]
struct Figures {
    handled: BTreeMap<(u32, u64), u32>,
    acked: BTreeSet<(u32, u64)>,
    handled_after_ack: u64,
    redelivered_unacked: u64,
}

impl Figures {
    fn take(&mut self, line: &str) {
        let mut parts = line.split(' ');
        let kind = parts.next().unwrap();
        let p: u32 = parts.next().unwrap().parse().unwrap();
        let o: u64 = parts.next().unwrap().parse().unwrap();
        match kind {
            "H" => {
                if self.acked.contains(&(p, o)) {
                    self.handled_after_ack += 1;
                }
                let count = self.handled.entry((p, o)).or_default();
                if *count > 0 {
                    self.redelivered_unacked += 1;
                }
                *count += 1;
            }
            _ => {
                self.acked.insert((p, o));
            }
        }
    }
}

#[test]
fn kill_nine_mid_consume_loses_nothing_and_repeats_no_durable_ack() {
    let Some((bus, cleanup)) = setup("kill_nine_mid_consume") else {
        return;
    };
    let mut rng = Rng::new();
    let mut figures = Figures::default();
    let logs = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut first_lines = Vec::new();
    for round in 0..ROUNDS {
        let target = 1 + rng.below(30) as usize;
        let log = logs.path().join(format!("child-{round}.log"));
        let spawned = Instant::now();
        let mut child = spawn(&cleanup, "consume", round, Some(&log));
        let receive = lines(&mut child);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut got = 0;
        // Kill after `target` lines, or when the child has nothing left to
        // say for a moment (it consumed everything there was).
        while got < target {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = if got == 0 {
                left // connecting and taking over come first
            } else {
                left.min(Duration::from_secs(3))
            };
            match receive.recv_timeout(wait) {
                Ok(line) => {
                    if got == 0 {
                        first_lines.push(spawned.elapsed());
                    }
                    figures.take(&line);
                    got += 1;
                }
                Err(_) => break,
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        for line in receive.iter() {
            figures.take(&line);
        }
        // A take-over after a kill -9 is bounded (the bus timeout for
        // `init_transactions`, plus the settled read's wait: 45 s by
        // default); a child silent past the first-line wait is a stall,
        // a defect, reported at once with its log rather than repeated
        // round after round.
        assert!(
            got > 0,
            "round {round}: the child said nothing in {:.1} s; its stderr:\n{}",
            spawned.elapsed().as_secs_f64(),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    first_lines.sort();
    eprintln!(
        "kafka consumer kill -9: first line after spawn: median {:?}, max {:?}, {} of {ROUNDS} rounds",
        first_lines.get(first_lines.len() / 2),
        first_lines.last(),
        first_lines.len()
    );
    let mut child = spawn(&cleanup, "drain", ROUNDS, None);
    let receive = lines(&mut child);
    for line in receive.iter() {
        if line == "DONE" {
            break;
        }
        figures.take(&line);
    }
    assert!(child.wait().unwrap().success(), "the draining child failed");

    let mut all = BTreeSet::new();
    let mut poisoned = BTreeSet::new();
    for p in 0..PARTITIONS {
        for event in bus.fetch_all(&cleanup.topic, p, 0, 4096).unwrap() {
            all.insert((p, event.offset));
            if event.value["poison"] == true {
                poisoned.insert((p, event.offset));
            }
        }
    }
    let letters = bus.fetch_all(&cleanup.dlq, 0, 0, 4096).unwrap();
    let dead: Vec<(u32, u64)> = letters
        .iter()
        .map(|l| {
            let meta = &l.value["dead_letter"];
            (
                meta["partition"].as_u64().unwrap() as u32,
                meta["offset"].as_u64().unwrap(),
            )
        })
        .collect();
    let dead_set: BTreeSet<_> = dead.iter().copied().collect();
    eprintln!(
        "kafka consumer kill -9: rounds {ROUNDS}, records {}, handled twice after a durable ack {}, \
         redelivered without an ack {}, dead-lettered {} (poisoned {}), {:.0} s",
        all.len(),
        figures.handled_after_ack,
        figures.redelivered_unacked,
        dead.len(),
        poisoned.len(),
        started.elapsed().as_secs_f64()
    );
    let unhandled: Vec<_> = all
        .iter()
        .filter(|k| !figures.handled.contains_key(k))
        .collect();
    assert!(unhandled.is_empty(), "never handled: {unhandled:?}");
    assert_eq!(
        figures.handled_after_ack, 0,
        "a durably acked record was handled again"
    );
    assert_eq!(dead.len(), dead_set.len(), "a record dead-lettered twice");
    assert_eq!(
        dead_set, poisoned,
        "the dead-letter topic holds exactly the poisoned records"
    );
    let info = bus.consumers(&cleanup.topic).unwrap();
    assert!(
        info[0].partitions.iter().all(|p| p.lag_records == 0),
        "{info:?}"
    );
}

/// A process killed while it owns a consumer keeps it until its lease
/// runs out (nothing renews it any more), then `Wait` gets it.
#[test]
fn a_dead_owner_keeps_the_consumer_only_for_its_lease() {
    let Some((bus, cleanup)) = setup("a_dead_owner_keeps_the_consumer_only_for_its_lease") else {
        return;
    };
    bus.publish(
        &cleanup.topic,
        "k",
        &serde_json::json!({"i": 0, "poison": false}),
    )
    .unwrap();
    // The child owns "worker" once it printed its first line.
    let mut child = spawn(&cleanup, "consume", 1000, None);
    let receive = lines(&mut child);
    receive.recv_timeout(Duration::from_secs(60)).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    let open = |policy| {
        bus.consume(
            &cleanup.topic,
            "worker",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default().owner(policy),
        )
    };
    assert!(
        matches!(open(OwnerPolicy::Fail), Err(BusError::ConsumerBusy { .. })),
        "a dead owner's lease still holds right after the kill"
    );
    let waited = open(OwnerPolicy::Wait(Duration::from_secs(30)));
    assert!(waited.is_ok(), "{:?}", waited.err());
    eprintln!(
        "kafka consumer lease: taken {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
}

/// Per record, the instances whose ack of it returned `Ok`.
type AckedBy = BTreeMap<(u32, u64), Vec<usize>>;

/// Two instances (two buses, as two processes would be) take one consumer
/// over from each other while both consume and acknowledge.
#[test]
fn two_instances_taking_over_never_both_ack_a_record() {
    let Some((bus, cleanup)) = setup("two_instances_taking_over") else {
        return;
    };
    const RECORDS: u64 = 150;
    for i in 0..RECORDS {
        bus.publish(
            &cleanup.topic,
            &format!("k{i}"),
            &serde_json::json!({"i": i}),
        )
        .unwrap();
    }
    let acked: Arc<Mutex<AckedBy>> = Arc::default();
    let refusals = Arc::new(Mutex::new(0u64));
    let takeovers = Arc::new(Mutex::new(0u64));
    let deadline = Instant::now() + Duration::from_secs(120);
    std::thread::scope(|scope| {
        for who in 0..2usize {
            let (acked, refusals, takeovers) = (&acked, &refusals, &takeovers);
            let options = options(&cleanup.brokers, &cleanup.manifest);
            let topic = cleanup.topic.as_str();
            scope.spawn(move || {
                let bus = KafkaBus::connect_with(options).unwrap();
                // Opening can lose the race too: the other instance may
                // take over between this one's acquire and its first
                // cursor write (a refusal, then another try).
                let take = || loop {
                    match bus.consume(
                        topic,
                        "racer",
                        Selector::Topic,
                        StartAt::Beginning,
                        ConsumeOptions::default().owner(OwnerPolicy::TakeOver),
                    ) {
                        Err(BusError::Fenced { .. }) => *refusals.lock().unwrap() += 1,
                        // Not what this test is about: a transient error
                        // (metadata settling: an open defect, see the
                        // kill -9 test) is retried as a careful user would.
                        Err(error) if error.is_transient() && Instant::now() < deadline => {
                            eprintln!("consume: {error} (transient, retrying)");
                        }
                        other => return other,
                    }
                };
                let mut consumer = take().unwrap();
                *takeovers.lock().unwrap() += 1;
                let mut since_takeover = 0u32;
                while Instant::now() < deadline {
                    if acked.lock().unwrap().len() as u64 >= RECORDS {
                        return;
                    }
                    let delivery = match consumer.recv_timeout(Duration::from_millis(300)) {
                        Ok(Some(delivery)) => delivery,
                        Ok(None) => continue,
                        Err(BusError::Fenced { .. }) => {
                            *refusals.lock().unwrap() += 1;
                            consumer = take().unwrap();
                            *takeovers.lock().unwrap() += 1;
                            continue;
                        }
                        Err(error) => panic!("recv: {error}"),
                    };
                    match consumer.ack(&delivery) {
                        Ok(()) => acked
                            .lock()
                            .unwrap()
                            .entry((delivery.partition, delivery.offset))
                            .or_default()
                            .push(who),
                        Err(BusError::Fenced { .. }) => {
                            *refusals.lock().unwrap() += 1;
                            consumer = take().unwrap();
                            *takeovers.lock().unwrap() += 1;
                            since_takeover = 0;
                            continue;
                        }
                        Err(error) => panic!("ack: {error}"),
                    }
                    since_takeover += 1;
                    // Take it back from the other now and then.
                    if since_takeover >= 7 + who as u32 * 4 {
                        // The new instance first: it fences this one.
                        let fresh = take().unwrap();
                        consumer = fresh;
                        *takeovers.lock().unwrap() += 1;
                        since_takeover = 0;
                    }
                }
            });
        }
    });
    let acked = acked.lock().unwrap();
    let twice: Vec<_> = acked.iter().filter(|(_, by)| by.len() > 1).collect();
    eprintln!(
        "kafka consumer race: records {RECORDS}, acknowledged {}, acknowledged twice {}, \
         fencing refusals {}, takeovers {}",
        acked.len(),
        twice.len(),
        refusals.lock().unwrap(),
        takeovers.lock().unwrap()
    );
    assert!(twice.is_empty(), "acknowledged by both: {twice:?}");
    assert_eq!(
        acked.len() as u64,
        RECORDS,
        "every record acknowledged once"
    );
    assert!(*refusals.lock().unwrap() > 0, "no instance was ever fenced");
}
