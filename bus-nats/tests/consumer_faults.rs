//! Durable consumers on NATS under faults (C21–C23):
//! - kill -9 of a consumer process at random moments over 50 rounds while
//!   it publishes (this test binary re-invoked as the child, as
//!   bus-embedded/tests/consumer_crash.rs does): every record handled at
//!   least once, none handled again after its durable ack, the dead-letter
//!   topic exactly the poisoned records once each;
//! - a private nats-server killed and started again on the same store and
//!   port mid-consume: an ack while it is down fails (and is made durable
//!   by the first flush after the restart: the engine keeps it pending),
//!   nothing acknowledged handled again, everything handled;
//! - two instances of one consumer taking it over from each other: no
//!   record acknowledged by both; the fenced one's ack is refused with
//!   `Fenced` (the refusals are counted).
//!
//! Each test prints one `consumer-fault` line with its figures.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use bus_conformance::outage::{Stop, stop};
use bus_conformance::util::poll_until;
use bus_core::consumer::{ConsumeOptions, DurableConsumers, OwnerPolicy};
use bus_core::{BusError, EventBus, EventBusExt, Manifest, Selector, StartAt, TopicSpec};
use bus_nats::{NatsBus, NatsOptions};
use common::{Server, free_port, server_binary_or_skip, start};
use serde_json::json;

const TOPIC: &str = "jobs";
const DLQ: &str = "jobs-dead";
const PARTITIONS: u32 = 2;
const ROUNDS: usize = 50;
const PER_ROUND: u64 = 20;
const WAIT: Duration = Duration::from_secs(60);

fn is_poison(i: u64) -> bool {
    i % 7 == 3
}

/// A tiny xorshift, seeded from the clock (or `BUS_TEST_SEED`), printed
/// so a failing run can be repeated.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        let seed = std::env::var("BUS_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos();
                (nanos as u64) | 1
            });
        eprintln!("BUS_TEST_SEED={seed}");
        Self(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

fn connect_prefix(prefix: &str) -> Option<NatsBus> {
    let url = std::env::var("BUS_NATS_URL").ok()?;
    let options = NatsOptions::from_url(&url).unwrap().prefix(prefix);
    Some(NatsBus::connect_with(options).unwrap())
}

/// The child's body; a no-op unless the parent set `BUS_CONSUMER_CHILD`.
#[test]
fn consumer_child_process() {
    let Ok(mode) = std::env::var("BUS_CONSUMER_CHILD") else {
        return;
    };
    let prefix = std::env::var("BUS_CONSUMER_PREFIX").unwrap();
    let round: u64 = std::env::var("BUS_CONSUMER_ROUND")
        .unwrap()
        .parse()
        .unwrap();
    let bus = connect_prefix(&prefix).unwrap();
    let producer = (mode == "consume").then_some(round);
    // Wait: the killed child's connection is gone once the server has
    // noticed it (at once for a killed process, whose socket the kernel
    // closes); waiting a little covers the moment in between.
    let options = ConsumeOptions::default()
        .dead_letter(DLQ)
        .owner(OwnerPolicy::Wait(Duration::from_secs(10)));
    let mut consumer = bus
        .consume(
            TOPIC,
            "worker",
            Selector::Topic,
            StartAt::Beginning,
            options,
        )
        .unwrap();
    let out = std::io::stdout();
    let say = |line: String| {
        let mut out = out.lock();
        // libtest's "test consumer_child_process ... " shares the first line.
        writeln!(out, "@@{line}").unwrap();
        out.flush().unwrap();
    };
    std::thread::scope(|scope| {
        if let Some(round) = producer {
            let bus = &bus;
            scope.spawn(move || {
                for n in 0..PER_ROUND {
                    let i = round * PER_ROUND + n;
                    let value = json!({"i": i, "poison": is_poison(i)});
                    bus.publish_idempotent(TOPIC, &format!("k{i}"), &value, &format!("r{i}"))
                        .unwrap();
                }
            });
        }
        loop {
            let timeout = Duration::from_millis(if mode == "drain" { 1000 } else { 200 });
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

fn spawn(prefix: &str, mode: &str, round: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "consumer_child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BUS_CONSUMER_CHILD", mode)
        .env("BUS_CONSUMER_PREFIX", prefix)
        .env("BUS_CONSUMER_ROUND", round.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
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

/// What was handled and acknowledged, by (partition, offset).
#[derive(Default)]
struct Figures {
    handled: BTreeMap<(u32, u64), u32>,
    acked: BTreeSet<(u32, u64)>,
    handled_after_ack: u64,
    redelivered_unacked: u64,
}

impl Figures {
    fn handle(&mut self, key: (u32, u64)) {
        if self.acked.contains(&key) {
            self.handled_after_ack += 1;
        }
        let count = self.handled.entry(key).or_default();
        if *count > 0 {
            self.redelivered_unacked += 1;
        }
        *count += 1;
    }

    fn take(&mut self, line: &str) {
        let mut parts = line.split(' ');
        let kind = parts.next().unwrap();
        let p: u32 = parts.next().unwrap().parse().unwrap();
        let o: u64 = parts.next().unwrap().parse().unwrap();
        match kind {
            "H" => self.handle((p, o)),
            _ => {
                self.acked.insert((p, o));
            }
        }
    }
}

/// What one instance acknowledged, by (partition, offset).
type Acked = BTreeSet<(u32, u64)>;

/// Deletes the prefix's streams and consumer bucket when the test ends.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let prefix = self.0.clone();
        common::raw(async |js| common::delete_streams(&js, &prefix).await);
    }
}

#[test]
fn kill_nine_mid_consume_loses_nothing_and_repeats_no_durable_ack() {
    let Some(bus) = common::shared_bus("consumer_faults", "ck") else {
        return;
    };
    let prefix = bus.prefix().to_owned();
    let _cleanup = Cleanup(prefix.clone());
    bus.provision(&Manifest::new([
        TopicSpec::new(TOPIC, PARTITIONS),
        TopicSpec::new(DLQ, 1),
    ]))
    .unwrap();
    let mut rng = Rng::new();
    let mut figures = Figures::default();
    for round in 0..ROUNDS {
        let target = 1 + rng.below(30) as usize;
        let mut child = spawn(&prefix, "consume", round);
        let receive = lines(&mut child);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut got = 0;
        while got < target {
            let left = deadline.saturating_duration_since(Instant::now());
            match receive.recv_timeout(left.min(Duration::from_secs(2))) {
                Ok(line) => {
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
    }
    let mut child = spawn(&prefix, "drain", ROUNDS);
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
        for event in bus.fetch_all(TOPIC, p, 0, 1024).unwrap() {
            all.insert((p, event.offset));
            if event.value["poison"] == true {
                poisoned.insert((p, event.offset));
            }
        }
    }
    let letters = bus.fetch_all(DLQ, 0, 0, 1024).unwrap();
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
        "consumer-fault kill -9 (nats): rounds {ROUNDS}, records {}, handled twice after a durable \
         ack {}, redelivered without an ack {}, dead-lettered {} (poisoned {})",
        all.len(),
        figures.handled_after_ack,
        figures.redelivered_unacked,
        dead.len(),
        poisoned.len()
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
    let info = bus.consumers(TOPIC).unwrap();
    assert!(
        info[0].partitions.iter().all(|p| p.lag_records == 0),
        "{info:?}"
    );
}

/// Consumes with an ack per record until `until` says stop; failures (the
/// server is down) are retried; returns how many calls failed.
fn consume_some(
    consumer: &mut bus_core::consumer::Consumer,
    figures: &mut Figures,
    mut until: impl FnMut(&Figures) -> bool,
) -> u64 {
    let mut failures = 0;
    let deadline = Instant::now() + WAIT;
    while !until(figures) {
        assert!(
            Instant::now() < deadline,
            "consuming did not finish in time: {} handled, {} acked, {failures} failed calls",
            figures.handled.len(),
            figures.acked.len()
        );
        match consumer.recv_timeout(Duration::from_millis(200)) {
            Ok(Some(delivery)) => {
                let key = (delivery.partition, delivery.offset);
                figures.handle(key);
                // A failed ack stays pending in the engine (a second ack
                // of it is a no-op): `flush` until its write is durable.
                let mut outcome = consumer.ack(&delivery);
                while let Err(error) = outcome {
                    if let BusError::Fenced { reason, .. } = error {
                        panic!("fenced: {reason}");
                    }
                    failures += 1;
                    assert!(Instant::now() < deadline, "acks kept failing: {error}");
                    std::thread::sleep(Duration::from_millis(100));
                    outcome = consumer.flush();
                }
                figures.acked.insert(key);
            }
            Ok(None) => {}
            Err(BusError::Fenced { reason, .. }) => panic!("fenced: {reason}"),
            Err(error) => {
                eprintln!("recv failed: {error}");
                failures += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    failures
}

#[test]
fn broker_restarted_mid_consume_repeats_no_ack_and_loses_nothing() {
    let Some(binary) = server_binary_or_skip("consumer_faults") else {
        return;
    };
    let store = tempfile::tempdir().expect("store dir");
    let port = free_port();
    let mut server = Server(start(&binary, port, store.path(), ""));
    let options = NatsOptions::from_url(&format!("nats://127.0.0.1:{port}"))
        .unwrap()
        .prefix("crestart")
        .timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2));
    let connect = || {
        poll_until("the server to accept a bus", WAIT, || {
            NatsBus::connect_with(options.clone()).ok()
        })
    };
    let bus = connect();
    bus.provision(&Manifest::new([TopicSpec::new(TOPIC, PARTITIONS)]))
        .unwrap();
    let total = 200u64;
    for i in 0..total {
        bus.publish_idempotent(TOPIC, &format!("k{i}"), &json!({"i": i}), &format!("r{i}"))
            .unwrap();
    }
    let mut figures = Figures::default();
    let mut consumer = bus
        .consume(
            TOPIC,
            "w",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default(),
        )
        .unwrap();
    consume_some(&mut consumer, &mut figures, |f| f.acked.len() >= 60);
    // One delivery taken before the kill and acknowledged while the
    // server is down: the ack must fail and the record come back.
    let held = poll_until("a delivery before the kill", WAIT, || {
        consumer.recv_timeout(Duration::from_millis(200)).unwrap()
    });
    figures.handle((held.partition, held.offset));
    stop(&mut server.0, Stop::Kill, WAIT);
    let down = consumer.ack(&held);
    assert!(
        matches!(down, Err(ref error) if !matches!(error, BusError::Fenced { .. })),
        "an ack while the server is down: {down:?}"
    );
    server = Server(start(&binary, port, store.path(), ""));
    // The engine keeps a failed ack pending (as with batching): the next
    // durable write, here a flush retried until the server is back, makes
    // it durable.
    poll_until("a flush after the restart", WAIT, || consumer.flush().ok());
    figures.acked.insert((held.partition, held.offset));
    let failures = consume_some(&mut consumer, &mut figures, |f| f.acked.len() >= 140);
    // A restarted process on the restarted server goes on from the cursor.
    drop(consumer);
    drop(bus);
    let bus = connect();
    let mut consumer = bus
        .consume(
            TOPIC,
            "w",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default(),
        )
        .unwrap();
    consume_some(&mut consumer, &mut figures, |f| {
        f.acked.len() as u64 >= total
    });
    let extra = consumer.recv_timeout(Duration::from_millis(500)).unwrap();
    eprintln!(
        "consumer-fault broker restart (nats): records {total}, handled {}, handled twice after \
         an ack {}, redelivered without an ack {}, failed calls after the restart {failures}, \
         the ack while down: {}",
        figures.handled.len(),
        figures.handled_after_ack,
        figures.redelivered_unacked,
        down.err().map(|e| e.to_string()).unwrap_or_default()
    );
    assert!(
        extra.is_none(),
        "a record after every one was acked: {extra:?}"
    );
    assert_eq!(figures.handled.len() as u64, total, "every record handled");
    assert_eq!(
        figures.handled_after_ack, 0,
        "an acked record handled again"
    );
    let info = bus.consumers(TOPIC).unwrap();
    assert!(
        info[0].partitions.iter().all(|p| p.lag_records == 0),
        "{info:?}"
    );
    drop(server);
}

#[test]
fn two_instances_taking_over_never_both_ack_a_record() {
    let Some(bus) = common::shared_bus("consumer_faults", "ct") else {
        return;
    };
    let prefix = bus.prefix().to_owned();
    let _cleanup = Cleanup(prefix.clone());
    bus.provision(&Manifest::new([TopicSpec::new(TOPIC, PARTITIONS)]))
        .unwrap();
    let total = 300u64;
    let records: Vec<bus_core::BatchRecord> = (0..total)
        .map(|i| bus_core::BatchRecord::new(format!("k{i}"), json!({"i": i})))
        .collect();
    bus.publish_batch(TOPIC, &records).unwrap();
    let acked: Arc<Mutex<[Acked; 2]>> = Arc::default();
    let refusals = Arc::new(AtomicU64::new(0));
    let takeovers = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    std::thread::scope(|scope| {
        for instance in 0..2usize {
            let (acked, refusals, takeovers, done) = (
                Arc::clone(&acked),
                Arc::clone(&refusals),
                Arc::clone(&takeovers),
                Arc::clone(&done),
            );
            let prefix = prefix.clone();
            scope.spawn(move || {
                let bus = connect_prefix(&prefix).unwrap();
                let mut rng = Rng::new();
                let deadline = Instant::now() + WAIT * 2;
                while !done.load(Ordering::SeqCst) {
                    assert!(Instant::now() < deadline, "the race did not finish");
                    let options = ConsumeOptions::default().owner(OwnerPolicy::TakeOver);
                    // The other may take over while this one opens (the
                    // first open writes the start): then it tries again.
                    let mut consumer = match bus.consume(
                        TOPIC,
                        "racer",
                        Selector::Topic,
                        StartAt::Beginning,
                        options,
                    ) {
                        Ok(consumer) => consumer,
                        Err(BusError::Fenced { .. }) => continue,
                        Err(error) => panic!("consume: {error}"),
                    };
                    takeovers.fetch_add(1, Ordering::SeqCst);
                    // Handle a few, then let the other take over.
                    for _ in 0..(1 + rng.below(20)) {
                        let delivery = match consumer.recv_timeout(Duration::from_millis(100)) {
                            Ok(Some(delivery)) => delivery,
                            Ok(None) | Err(BusError::Fenced { .. }) => break,
                            Err(error) => panic!("recv: {error}"),
                        };
                        match consumer.ack(&delivery) {
                            Ok(()) => {
                                let mut acked = acked.lock().unwrap();
                                acked[instance].insert((delivery.partition, delivery.offset));
                                let all = acked[0].len() + acked[1].len();
                                if all as u64 >= total {
                                    done.store(true, Ordering::SeqCst);
                                }
                            }
                            Err(BusError::Fenced { .. }) => {
                                refusals.fetch_add(1, Ordering::SeqCst);
                                break;
                            }
                            Err(error) => panic!("ack: {error}"),
                        }
                    }
                }
            });
        }
    });
    let acked = acked.lock().unwrap();
    let both: Vec<_> = acked[0].intersection(&acked[1]).collect();
    let union: BTreeSet<_> = acked[0].union(&acked[1]).collect();
    eprintln!(
        "consumer-fault takeover race (nats): records {total}, acked by A {}, by B {}, by both {}, \
         takeovers {}, fencing refusals {}",
        acked[0].len(),
        acked[1].len(),
        both.len(),
        takeovers.load(Ordering::SeqCst),
        refusals.load(Ordering::SeqCst)
    );
    assert!(both.is_empty(), "acknowledged by both instances: {both:?}");
    assert_eq!(union.len() as u64, total, "every record acknowledged once");
    assert!(
        refusals.load(Ordering::SeqCst) > 0,
        "no ack was refused: the instances never raced"
    );
}
