//! C10 against real outages of a private nats-server, stopped cleanly
//! (SIGTERM) or killed (SIGKILL) while publisher threads and a reader keep
//! calling one bus, then started again on the same port and store. Every
//! failed call fails within timeout + 1 s with a retryable error (never
//! `UnknownTopic`), the same bus publishes and fetches again, no
//! acknowledged record is lost and UIDs still deduplicate.

mod common;

use std::time::Duration;

use bus_conformance::outage::{Stop, signal, stop, with_traffic};
use bus_conformance::util::poll_until;
use bus_core::{EventBus, Manifest, TopicSpec};
use bus_nats::{NatsBus, NatsOptions};
use common::{Server, free_port, server_binary_or_skip, start};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(2);
const LIMIT: Duration = Duration::from_secs(3);
const PARTITIONS: u32 = 2;
const WAIT: Duration = Duration::from_secs(30);

fn connect(url: &str) -> NatsBus {
    let options = NatsOptions::from_url(url)
        .expect("url")
        .prefix("outage")
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT);
    poll_until("the server to accept a bus", WAIT, || {
        NatsBus::connect_with(options.clone()).ok()
    })
}

/// How the test takes its server down.
#[derive(Debug, Clone, Copy)]
enum Down {
    Stop(Stop),
    /// Lame duck mode (SIGUSR2, `nats-server --signal ldm`), the graceful
    /// stop: JetStream shuts down at once while clients stay connected for
    /// the grace period, so every publish meets "no responders"; then
    /// SIGTERM ends it.
    LameDuck,
}

fn outage(how: Down) {
    let Some(binary) = server_binary_or_skip("outage") else {
        return;
    };
    let store = tempfile::tempdir().expect("store dir");
    let port = free_port();
    let mut server = Server(start(&binary, port, store.path(), ""));
    let bus = connect(&format!("nats://127.0.0.1:{port}"));
    let topic = "t";
    bus.provision(&Manifest::new([TopicSpec::new(topic, PARTITIONS)]))
        .expect("provision");
    let before: Vec<_> = (0..20)
        .map(|i| {
            let (uid, value) = (format!("u{i}"), json!({ "before": i }));
            let ack = bus
                .publish_idempotent(topic, &format!("k{i}"), &value, &uid)
                .expect("publish before the outage");
            (uid, value, ack)
        })
        .collect();

    let ((), mut outcome) = with_traffic(&bus, topic, PARTITIONS, 2, |progress| {
        progress.wait_for_successes("traffic before the outage", WAIT);
        match how {
            Down::Stop(how) => stop(&mut server.0, how, WAIT),
            Down::LameDuck => signal(&server.0, "USR2"),
        }
        // Twice: calls that were in flight, then calls made while it is down.
        progress.wait_for_failures("every worker to fail during the outage", WAIT);
        progress.wait_for_failures("every worker to fail again", WAIT);
        assert!(
            bus.topics().iter().any(|name| name == topic),
            "the bus forgot its topic during the outage"
        );
        if let Down::LameDuck = how {
            stop(&mut server.0, Stop::Clean, WAIT);
        }
        server = Server(start(&binary, port, store.path(), ""));
        progress.wait_for_successes("the same bus to publish and fetch again", WAIT * 2);
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
            .expect("retry after recovery");
        assert_eq!(&again, ack, "{uid} must still deduplicate");
    }
    drop(server);
}

#[test]
fn clean_stop_fails_retryably_and_the_same_bus_recovers() {
    outage(Down::Stop(Stop::Clean));
}

#[test]
fn kill_fails_retryably_and_the_same_bus_recovers() {
    outage(Down::Stop(Stop::Kill));
}

#[test]
fn lame_duck_fails_retryably_and_the_same_bus_recovers() {
    outage(Down::LameDuck);
}
