//! C10 against real outages of a broker of the test's own (a child JVM on
//! its own port and data directory, from the jars `scripts/kafka.sh
//! install` cached), stopped cleanly (SIGTERM: controlled shutdown) or
//! killed (SIGKILL) while publisher threads and a reader keep calling one
//! bus, then started again on the same port and data. Every failed call
//! fails within timeout + 1 s with a retryable error, the same bus publishes
//! and fetches again, no acknowledged record is lost and UIDs still
//! deduplicate.

mod common;

use std::time::Duration;

use bus_conformance::outage::{Stop, with_traffic};
use bus_conformance::util::poll_until;
use bus_core::{EventBus, Manifest, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions};
use common::own::{Broker, Listener, kafka_libs};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(3);
const LIMIT: Duration = Duration::from_secs(4);
const PARTITIONS: u32 = 2;
/// A JVM broker on a busy machine takes a while to serve.
const WAIT: Duration = Duration::from_secs(60);

fn outage(test: &str, how: Stop) {
    let Some(libs) = kafka_libs() else {
        return common::skip(
            test,
            "no cached Kafka jars (run: bash scripts/kafka.sh install)",
        );
    };
    let mut broker = Broker::new(libs, &Listener::Plaintext);
    broker.start();
    let options = KafkaOptions::new([broker.address()]).timeout(TIMEOUT);
    let bus = poll_until("the test broker to serve", WAIT * 2, || {
        KafkaBus::connect_with(options.clone()).ok()
    });
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
