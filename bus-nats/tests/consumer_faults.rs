//! Durable consumers on NATS under faults (C21–C23):
//! - kill -9 of a consumer process at random moments over 50 rounds while
//!   it publishes (this test binary re-invoked as the child, on the shared
//!   harness `bus_conformance::consumers::crash`, as
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

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bus_conformance::consumers::crash::{self, Figures, Plan, Rng, Run};
use bus_conformance::outage::{Stop, stop};
use bus_conformance::util::poll_until;
use bus_core::consumer::{ConsumeOptions, DurableConsumers, OwnerPolicy};
use bus_core::{BusError, EventBus, Manifest, Selector, StartAt, TopicSpec};
use bus_nats::{NatsBus, NatsOptions};
use common::{Server, free_port, server_binary_or_skip, start};
use serde_json::json;

/// The kill -9 test's plan: a drain waits a second for stragglers (a
/// network hop, unlike the embedded log).
const PLAN: Plan = Plan {
    drain_idle: Duration::from_millis(1000),
    ..Plan::new("nats")
};
const TOPIC: &str = PLAN.topic;
const PARTITIONS: u32 = PLAN.partitions;
const WAIT: Duration = Duration::from_secs(60);

fn connect_prefix(prefix: &str) -> Option<NatsBus> {
    let url = std::env::var("BUS_NATS_URL").ok()?;
    let options = NatsOptions::from_url(&url).unwrap().prefix(prefix);
    Some(NatsBus::connect_with(options).unwrap())
}

/// The child's body; a no-op unless the parent set `BUS_CONSUMER_CHILD`.
#[test]
fn consumer_child_process() {
    let Some(role) = crash::role().unwrap() else {
        return;
    };
    let bus = connect_prefix(&crash::var("BUS_CONSUMER_PREFIX").unwrap()).unwrap();
    // Wait: the killed child's connection is gone once the server has
    // noticed it (at once for a killed process, whose socket the kernel
    // closes); waiting a little covers the moment in between (C23).
    let options = ConsumeOptions::default().owner(OwnerPolicy::Wait(Duration::from_secs(10)));
    crash::run_child(&bus, &PLAN, role, options, crash::plain_ack).unwrap();
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
    bus.provision(&PLAN.manifest()).unwrap();
    let mut run = Run::new(&PLAN, vec![("BUS_CONSUMER_PREFIX".to_owned(), prefix)]);
    run.all_rounds_and_drain().unwrap();
    let outcome = run.finish(&bus).unwrap();
    eprintln!("consumer-fault {}", outcome.summary());
    outcome.assert_holds();
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
