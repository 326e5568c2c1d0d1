//! C19 for NATS subscriptions, against a nats-server of the test's own:
//! while it is down a live subscription keeps answering within its timeout
//! and says the backend is unavailable; once it is back (same port, same
//! store) the same subscription goes on with no gap and no duplicate.

use crate::common;

use std::time::Duration;

use bus_conformance::outage::{self, Receiving, Stop, stop};
use bus_conformance::util::poll_until;
use bus_core::{
    BusError, EventBus, Manifest, Selector, StartAt, SubscribeOptions, Subscription, TopicSpec,
};
use bus_nats::{NatsBus, NatsOptions};
use common::{Server, free_port, server_binary_or_skip, start};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(2);
const RECV: Duration = Duration::from_millis(300);
const WAIT: Duration = Duration::from_secs(60);

/// Each receive must come back within its timeout plus `slack`, outage or not.
const RECEIVING: Receiving = Receiving {
    recv: RECV,
    slack: Duration::from_millis(700),
    wait: WAIT,
};

fn offsets_until(
    sub: &mut Subscription,
    errors: Option<&mut Vec<BusError>>,
    until: impl FnMut(&[u64], usize) -> bool,
) -> Vec<u64> {
    outage::offsets_until(sub, RECEIVING, errors, until)
}

#[test]
fn killed_server_under_a_subscription_is_reported_then_resumed() {
    outage(Stop::Kill);
}

#[test]
fn cleanly_stopped_server_under_a_subscription_is_reported_then_resumed() {
    outage(Stop::Clean);
}

fn outage(how: Stop) {
    let Some(binary) = server_binary_or_skip("subscribe_outage") else {
        return;
    };
    let store = tempfile::tempdir().expect("store dir");
    let port = free_port();
    let mut server = Server(start(&binary, port, store.path(), ""));
    let options = NatsOptions::from_url(&format!("nats://127.0.0.1:{port}"))
        .expect("url")
        .prefix(format!("suboutage{how:?}").to_lowercase())
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT);
    let bus = poll_until("the server to accept a bus", WAIT, || {
        NatsBus::connect_with(options.clone()).ok()
    });
    let topic = "t";
    bus.provision(&Manifest::new([TopicSpec::new(topic, 1)]))
        .expect("provision");
    for n in 0..5 {
        bus.publish(topic, "k", &json!({ "n": n }))
            .expect("publish");
    }
    let mut sub = bus
        .subscribe(
            topic,
            Selector::Partition(0),
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .expect("subscribe");
    let history = offsets_until(&mut sub, None, |got, _| got.len() >= 5);
    assert_eq!(history, vec![0, 1, 2, 3, 4]);
    // Live records, delivered by the push consumer, before the outage.
    for n in 5..8 {
        bus.publish(topic, "k", &json!({ "n": n }))
            .expect("publish");
    }
    let live = offsets_until(&mut sub, None, |got, _| got.len() >= 3);
    assert_eq!(live, vec![5, 6, 7]);

    stop(&mut server.0, how, WAIT);
    let mut errors = Vec::new();
    let during = offsets_until(&mut sub, Some(&mut errors), |_, errors| errors >= 2);
    assert!(during.is_empty(), "records while down: {during:?}");
    assert!(
        errors
            .iter()
            .all(|error| matches!(error, BusError::Unavailable { .. })),
        "every error item says unavailable: {errors:?}"
    );

    // Back on the same port and store: the same subscription goes on.
    server = Server(start(&binary, port, store.path(), ""));
    let mut acked = Vec::new();
    for n in 8..13 {
        let ack = poll_until("the server to take a publish", WAIT, || {
            bus.publish(topic, "k", &json!({ "n": n })).ok()
        });
        acked.push(ack.offset);
    }
    assert_eq!(acked, vec![8, 9, 10, 11, 12], "no publish stored twice");
    let mut late_errors = Vec::new();
    let after = offsets_until(&mut sub, Some(&mut late_errors), |got, _| {
        got.last().is_some_and(|last| Some(last) == acked.last())
    });
    assert_eq!(after, acked, "after the outage: no gap, no duplicate");
    assert!(
        late_errors.iter().all(BusError::is_transient),
        "{late_errors:?}"
    );
    // Quiet again once the records are in.
    assert!(matches!(sub.recv_timeout(RECV), Ok(None)));
    // And live again: a record published now wakes it.
    bus.publish(topic, "k", &json!({"n": 13})).expect("publish");
    assert_eq!(
        offsets_until(&mut sub, None, |got, _| !got.is_empty()),
        [13]
    );
    drop(sub);
    drop(server);
}
