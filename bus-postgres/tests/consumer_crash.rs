//! C21/C22/C23 under kill -9 on PostgreSQL (`BUS_POSTGRES_URL`): a child
//! process (this test binary re-invoked) publishes from a producer thread
//! while a durable consumer in the same process handles each record
//! (prints `H`), then acknowledges it (prints `A` once the ack is durable)
//! or, for the records poisoned on purpose, dead-letters it (prints `D`).
//! Every other record is acknowledged inside the handler's own transaction
//! (`ack_in_transaction`), which also inserts a row naming the record: those
//! rows show exactly-once processing (one row per record, whatever was
//! killed when). The parent kills the child at random moments over many
//! rounds, lets a last child drain the topic, and checks: every record
//! handled at least once; none handled again after its durable ack; the
//! dead-letter topic holds exactly the poisoned records, once each.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bus_conformance::brokers_required;
use bus_core::consumer::{ConsumeOptions, DurableConsumers, OwnerPolicy};
use bus_core::{EventBus, EventBusExt, Manifest, Selector, StartAt, TopicSpec};
use bus_postgres::{PostgresBus, PostgresOptions, TransactionalAck, tokio_postgres};

const TOPIC: &str = "jobs";
const DLQ: &str = "jobs-dead";
const PARTITIONS: u32 = 2;
const ROUNDS: usize = 50;
const PER_ROUND: u64 = 20;

fn is_poison(i: u64) -> bool {
    i % 7 == 3
}

/// Acknowledged inside the handler's transaction (the others by a plain
/// ack).
fn in_transaction(i: u64) -> bool {
    i.is_multiple_of(2)
}

fn options(schema: &str) -> PostgresOptions {
    let url = std::env::var("BUS_POSTGRES_URL").unwrap();
    PostgresOptions::from_url(&url).unwrap().schema(schema)
}

/// The child's body; a no-op unless the parent set `BUS_CONSUMER_CHILD`.
#[test]
fn consumer_child_process() {
    let Ok(mode) = std::env::var("BUS_CONSUMER_CHILD") else {
        return;
    };
    let schema = std::env::var("BUS_CONSUMER_SCHEMA").unwrap();
    let round: u64 = std::env::var("BUS_CONSUMER_ROUND")
        .unwrap()
        .parse()
        .unwrap();
    let options = options(&schema);
    let bus = PostgresBus::connect_with(options.clone()).unwrap();
    let runtime = bus_conformance::current_thread_runtime().unwrap();
    let mut client = runtime.block_on(async {
        let (client, connection) = options.config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    });
    // The previous child was killed: its advisory lock goes when the
    // server notices its connection closed, so wait for it.
    let consume = ConsumeOptions::default()
        .dead_letter(DLQ)
        .owner(OwnerPolicy::Wait(Duration::from_secs(30)));
    let mut consumer = bus
        .consume(
            TOPIC,
            "worker",
            Selector::Topic,
            StartAt::Beginning,
            consume,
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
    let insert = format!("INSERT INTO \"{schema}\".handled (record) VALUES ($1)");
    std::thread::scope(|scope| {
        if mode == "consume" {
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
            let timeout = Duration::from_millis(if mode == "drain" { 1000 } else { 200 });
            let Some(delivery) = consumer.recv_timeout(timeout).unwrap() else {
                if mode == "drain" {
                    say("DONE".to_owned());
                    return;
                }
                continue;
            };
            let (p, o) = (delivery.partition, delivery.offset);
            let i = delivery.event.value["i"].as_u64().unwrap();
            say(format!("H {p} {o}"));
            if delivery.event.value["poison"] == true {
                consumer.nack(&delivery, "poisoned on purpose").unwrap();
                say(format!("D {p} {o}"));
            } else if in_transaction(i) {
                let record = i64::try_from(i).unwrap();
                let (bus, client, consumer) = (&bus, &mut client, &mut consumer);
                let outcome = runtime
                    .block_on(async {
                        let transaction = client.transaction().await.unwrap();
                        transaction.execute(&insert, &[&record]).await.unwrap();
                        bus.ack_in_transaction(consumer, transaction, &delivery)
                            .await
                    })
                    .unwrap();
                assert_eq!(outcome, TransactionalAck::Committed);
                say(format!("A {p} {o}"));
            } else {
                consumer.ack(&delivery).unwrap();
                say(format!("A {p} {o}"));
            }
        }
    });
}

fn spawn(schema: &str, mode: &str, round: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "consumer_child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BUS_CONSUMER_CHILD", mode)
        .env("BUS_CONSUMER_SCHEMA", schema)
        .env("BUS_CONSUMER_ROUND", round.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
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

/// A small xorshift generator seeded from the clock (the kill moments).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn kill_nine_mid_consume_loses_nothing_and_repeats_no_durable_ack() {
    if std::env::var("BUS_CONSUMER_CHILD").is_ok() {
        return;
    }
    let url = match bus_conformance::brokers::postgres_url() {
        Ok(url) => url,
        Err(why) if !brokers_required() => {
            eprintln!("SKIPPED kill -9 consumer test: {}", why.0);
            return;
        }
        Err(why) => panic!("BUS_REQUIRE_BROKERS=1 but {}", why.0),
    };
    let _ = url;
    let schema = format!("ckill_{}", bus_conformance::namespace_id(12));
    let bus = PostgresBus::connect_with(options(&schema)).unwrap();
    bus.provision(&Manifest::new([
        TopicSpec::new(TOPIC, PARTITIONS),
        TopicSpec::new(DLQ, 1),
    ]))
    .unwrap();
    let runtime = bus_conformance::current_thread_runtime().unwrap();
    let config = options(&schema).config;
    let client = runtime.block_on(async {
        let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        // No unique index: a record processed twice would show as two rows.
        client
            .batch_execute(&format!(
                "CREATE TABLE \"{schema}\".handled (record bigint NOT NULL)"
            ))
            .await
            .unwrap();
        client
    });
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut rng = Rng(seed);
    let mut figures = Figures::default();
    let started = Instant::now();
    for round in 0..ROUNDS {
        let target = 1 + rng.below(30) as usize;
        let mut child = spawn(&schema, "consume", round);
        let receive = lines(&mut child);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut got = 0;
        // Kill after `target` lines, or when the child has nothing left to
        // say for a moment (it consumed everything there was).
        while got < target {
            let left = deadline.saturating_duration_since(Instant::now());
            match receive.recv_timeout(left.min(Duration::from_secs(3))) {
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
    let mut child = spawn(&schema, "drain", ROUNDS);
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
    let mut transactional = BTreeSet::new();
    for p in 0..PARTITIONS {
        for event in bus.fetch_all(TOPIC, p, 0, 1024).unwrap() {
            all.insert((p, event.offset));
            let i = event.value["i"].as_u64().unwrap();
            if event.value["poison"] == true {
                poisoned.insert((p, event.offset));
            } else if in_transaction(i) {
                transactional.insert(i);
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
    let rows: Vec<u64> = runtime.block_on(async {
        client
            .query(
                &format!("SELECT record FROM \"{schema}\".handled ORDER BY record"),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| u64::try_from(row.get::<_, i64>(0)).unwrap())
            .collect()
    });
    let row_set: BTreeSet<u64> = rows.iter().copied().collect();
    eprintln!(
        "postgres consumer kill -9: rounds {ROUNDS} in {:.1} s, records {}, handled twice after a durable ack {}, \
         redelivered without an ack {}, dead-lettered {} (poisoned {}), acked in the handler's \
         transaction {} (rows {}, records with two rows {})",
        started.elapsed().as_secs_f64(),
        all.len(),
        figures.handled_after_ack,
        figures.redelivered_unacked,
        dead.len(),
        poisoned.len(),
        transactional.len(),
        rows.len(),
        rows.len() - row_set.len(),
    );
    let info = bus.consumers(TOPIC).unwrap();
    let _ = runtime.block_on(async {
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .await
    });
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
    assert_eq!(
        rows.len(),
        row_set.len(),
        "a record processed twice in a transaction"
    );
    assert_eq!(
        row_set, transactional,
        "exactly once: one row per record acked in a transaction"
    );
    assert!(
        info[0].partitions.iter().all(|p| p.lag_records == 0),
        "{info:?}"
    );
}
