//! C10 against real outages of a broker of the test's own (a child JVM on
//! its own port and data directory, from the jars `scripts/kafka.sh
//! install` cached), stopped cleanly (SIGTERM: controlled shutdown) or
//! killed (SIGKILL) while publisher threads and a reader keep calling one
//! bus, then started again on the same port and data. Every failed call
//! fails within timeout + 1 s with a retryable error, the same bus publishes
//! and fetches again, no acknowledged record is lost and UIDs still
//! deduplicate. A durable consumer (C20/C21) goes on across a broker kill
//! without handling again a record it acknowledged.

mod common;

use std::time::{Duration, Instant};

use bus_conformance::outage::{Stop, with_traffic};
use bus_conformance::util::poll_until;
use bus_core::consumer::{ConsumeOptions, DurableConsumers};
use bus_core::{BusError, EventBus, Manifest, Selector, StartAt, TopicSpec};
use bus_kafka::KafkaOptions;
use common::own::{self, Listener};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(3);
const LIMIT: Duration = Duration::from_secs(4);
const PARTITIONS: u32 = 2;
/// A JVM broker on a busy machine takes a while to serve.
const WAIT: Duration = Duration::from_secs(60);

fn outage(test: &str, how: Stop) {
    let Some(mut broker) = own::started(test, &Listener::Plaintext) else {
        return;
    };
    let options = KafkaOptions::new([broker.address()]).timeout(TIMEOUT);
    let bus = own::serving(&options);
    let topic = "outage";
    bus.provision(&Manifest::new([TopicSpec::new(topic, PARTITIONS)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    let before: Vec<_> = (0..20)
        .map(|i| {
            let (uid, value) = (format!("u{i}"), json!({ "before": i }));
            let ack = bus
                .publish_idempotent(topic, &format!("k{i}"), &value, &uid)
                .unwrap_or_else(|e| panic!("publish before the outage: {e}"));
            (uid, value, ack)
        })
        .collect();

    let ((), mut outcome) = with_traffic(&bus, topic, PARTITIONS, 2, |progress| {
        progress.wait_for_successes("traffic before the outage", WAIT);
        broker.stop(how);
        // Twice: calls that were in flight, then calls made while it is down.
        progress.wait_for_failures("every worker to fail during the outage", WAIT);
        progress.wait_for_failures("every worker to fail again", WAIT);
        assert!(
            bus.topics().iter().any(|name| name == topic),
            "the bus forgot its topic during the outage"
        );
        broker.start();
        progress.wait_for_successes("the same bus to publish and fetch again", WAIT);
    });

    eprintln!("{how:?}: {}", outcome.summary());
    assert!(!outcome.failures.is_empty(), "no call failed ({how:?})");
    outcome.assert_failures_transient(LIMIT);
    assert!(outcome.fetched > 0, "the reader read nothing");
    outcome.acked.extend(
        before
            .iter()
            .map(|(_, value, ack)| (ack.clone(), value.clone())),
    );
    outcome.assert_acked_stored(&bus, topic, PARTITIONS);
    for (i, (uid, value, ack)) in before.iter().enumerate() {
        let again = bus
            .publish_idempotent(topic, &format!("k{i}"), value, uid)
            .unwrap_or_else(|e| panic!("retry after recovery: {e}"));
        assert_eq!(&again, ack, "{uid} must still deduplicate");
    }
    broker.kill();
}

#[test]
fn clean_stop_fails_retryably_and_the_same_bus_recovers() {
    outage(
        "clean_stop_fails_retryably_and_the_same_bus_recovers",
        Stop::Clean,
    );
}

#[test]
fn kill_fails_retryably_and_the_same_bus_recovers() {
    outage("kill_fails_retryably_and_the_same_bus_recovers", Stop::Kill);
}

/// A durable consumer handles and acknowledges records while its broker is
/// killed and started again: the same consumer goes on once the broker is
/// back (an ack that failed meanwhile is made durable by `flush`), every
/// record is handled, none again after its durable ack, and a consumer
/// opened afterwards gets nothing back.
#[test]
fn a_durable_consumer_goes_on_after_a_broker_kill() {
    let test = "a_durable_consumer_goes_on_after_a_broker_kill";
    const RECORDS: usize = 60;
    let Some(mut broker) = own::started(test, &Listener::Plaintext) else {
        return;
    };
    let options = KafkaOptions::new([broker.address()]).timeout(TIMEOUT);
    let bus = own::serving(&options);
    let topic = "consumed";
    bus.provision(&Manifest::new([TopicSpec::new(topic, PARTITIONS)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    for i in 0..RECORDS {
        bus.publish(topic, &format!("k{i}"), &json!({ "i": i }))
            .unwrap_or_else(|e| panic!("publish: {e}"));
    }
    let open = || {
        bus.consume(
            topic,
            "c",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default().ack_wait(Duration::from_secs(5)),
        )
    };
    // A broker that just started answers the cursor's transactional
    // producer with retryable errors until it has loaded its transaction
    // state (past the 3 s timeout on loaded cores).
    let mut consumer = poll_until("the first consume", WAIT, || match open() {
        Ok(consumer) => Some(consumer),
        Err(e) if e.is_transient() => None,
        Err(e) => panic!("consume: {e}"),
    });
    let mut tally = common::Tally::default();
    let mut failures = 0u64;
    let deadline = Instant::now() + WAIT;
    while tally.handled.len() < 20 {
        assert!(Instant::now() < deadline, "20 records before the kill");
        tally
            .step(&mut consumer)
            .unwrap_or_else(|e| panic!("before the kill: {e}"));
    }
    broker.stop(Stop::Kill);
    let down = Instant::now();
    while down.elapsed() < TIMEOUT * 2 {
        if let Err(error) = tally.step(&mut consumer) {
            assert!(
                !matches!(error, BusError::Fenced { .. }),
                "fenced by an outage: {error}"
            );
            failures += 1;
        }
    }
    broker.start();
    let deadline = Instant::now() + WAIT * 2;
    while tally.handled.len() < RECORDS || !tally.pending.is_empty() {
        assert!(
            Instant::now() < deadline,
            "all records after the restart ({} handled)",
            tally.handled.len()
        );
        if let Err(error) = tally.step(&mut consumer) {
            assert!(
                !matches!(error, BusError::Fenced { .. }),
                "fenced by an outage: {error}"
            );
            failures += 1;
        }
    }
    drop(consumer);
    let mut again = open().unwrap_or_else(|e| panic!("consume again: {e}"));
    let back = again
        .recv_timeout(Duration::from_secs(3))
        .unwrap_or_else(|e| panic!("recv after reopening: {e}"));
    eprintln!(
        "kafka consumer broker kill: records {RECORDS}, handled {}, handled twice after a durable ack {}, \
         redelivered without an ack {}, failed calls {failures}",
        tally.handled.len(),
        tally.after_ack,
        tally
            .handled
            .values()
            .map(|n| u64::from(n - 1))
            .sum::<u64>()
    );
    assert!(back.is_none(), "an acked record came back: {back:?}");
    assert_eq!(
        tally.after_ack, 0,
        "a durably acked record was handled again"
    );
    assert_eq!(tally.handled.len(), RECORDS);
    drop(again);
    broker.kill();
}
