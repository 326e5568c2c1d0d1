//! C21/C22 under kill -9: a child process (this test binary re-invoked)
//! publishes from a producer thread while a durable consumer in the same
//! process handles each record (prints `H`), then acknowledges it (prints
//! `A` once the ack is durable: `ack_every(1)`) or, for the records
//! poisoned on purpose, dead-letters it (prints `D` once `nack` returned).
//! The parent kills the child at random moments over many rounds, then
//! lets a last child drain the topic, and checks: every record handled at
//! least once; none handled again after its durable ack; the dead-letter
//! topic holds exactly the poisoned records, once each.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bus_core::consumer::{ConsumeOptions, DurableConsumers};
use bus_core::{EventBus, EventBusExt, Manifest, Selector, StartAt, TopicSpec};
use bus_embedded::EmbeddedBus;

const TOPIC: &str = "jobs";
const DLQ: &str = "jobs-dead";
const PARTITIONS: u32 = 2;
const ROUNDS: usize = 50;
const PER_ROUND: u64 = 20;

fn is_poison(i: u64) -> bool {
    i % 7 == 3
}

/// The child's body; a no-op unless the parent set `BUS_CONSUMER_CHILD`.
#[test]
fn consumer_child_process() {
    let Ok(mode) = std::env::var("BUS_CONSUMER_CHILD") else {
        return;
    };
    let dir = std::env::var("BUS_CONSUMER_DIR").unwrap();
    let round: u64 = std::env::var("BUS_CONSUMER_ROUND")
        .unwrap()
        .parse()
        .unwrap();
    let bus = EmbeddedBus::open(&dir).unwrap();
    // The producer runs in the consuming process: the embedded log has
    // one writer per directory, and the consumer writes dead letters.
    let producer = (mode == "consume").then_some(round);
    let options = ConsumeOptions::default().dead_letter(DLQ);
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
        // The marker: libtest's "test consumer_child_process ... " has no
        // newline of its own, so the first line shares its line.
        writeln!(out, "@@{line}").unwrap();
        out.flush().unwrap();
    };
    std::thread::scope(|scope| {
        if let Some(round) = producer {
            let bus = &bus;
            scope.spawn(move || {
                for n in 0..PER_ROUND {
                    let i = round * PER_ROUND + n;
                    let value = serde_json::json!({"i": i, "poison": is_poison(i)});
                    bus.publish_idempotent(TOPIC, &format!("k{i}"), &value, &format!("r{i}"))
                        .unwrap();
                }
            });
        }
        loop {
            let timeout = Duration::from_millis(if mode == "drain" { 500 } else { 200 });
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

fn spawn(dir: &Path, mode: &str, round: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "consumer_child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BUS_CONSUMER_CHILD", mode)
        .env("BUS_CONSUMER_DIR", dir)
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
    let dir = tempfile::tempdir().unwrap();
    {
        let bus = EmbeddedBus::open(dir.path()).unwrap();
        bus.provision(&Manifest::new([
            TopicSpec::new(TOPIC, PARTITIONS),
            TopicSpec::new(DLQ, 1),
        ]))
        .unwrap();
    }
    let mut rng = support::Rng::new();
    let mut figures = Figures::default();
    for round in 0..ROUNDS {
        let target = 1 + rng.below(30) as usize;
        let mut child = spawn(dir.path(), "consume", round);
        let receive = lines(&mut child);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut got = 0;
        // Kill after `target` lines, or when the child has nothing left to
        // say for a moment (it consumed everything there was).
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
    // A last child, not killed, drains what is left.
    let mut child = spawn(dir.path(), "drain", ROUNDS);
    let receive = lines(&mut child);
    for line in receive.iter() {
        if line == "DONE" {
            break;
        }
        figures.take(&line);
    }
    assert!(child.wait().unwrap().success(), "the draining child failed");

    let bus = EmbeddedBus::open(dir.path()).unwrap();
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
        "consumer kill -9: rounds {ROUNDS}, records {}, handled twice after a durable ack {}, \
         redelivered without an ack {}, dead-lettered {} (poisoned {})",
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
