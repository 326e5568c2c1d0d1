//! C19 for Kafka subscriptions, against a broker of the test's own: while it
//! is down a live subscription keeps answering within its timeout and says
//! the backend is unavailable; once it is back the same subscription goes on
//! with no gap and no duplicate.

mod common;

use std::time::Duration;

use bus_conformance::outage::{self, Receiving};
use bus_conformance::util::poll_until;
use bus_core::{EventBus, Manifest, Selector, StartAt, SubscribeOptions, Subscription, TopicSpec};
use bus_kafka::KafkaOptions;
use common::own::{self, Listener};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(3);
const RECV: Duration = Duration::from_millis(300);

/// Each receive must come back within its timeout plus `slack`, outage or not.
const RECEIVING: Receiving = Receiving {
    recv: RECV,
    // Generous: the point is that a receive never hangs on the outage.
    slack: Duration::from_secs(2),
    wait: Duration::from_secs(120),
};

fn offsets_until(
    sub: &mut Subscription,
    errors: Option<&mut Vec<bus_core::BusError>>,
    until: impl FnMut(&[u64], usize) -> bool,
) -> Vec<u64> {
    outage::offsets_until(sub, RECEIVING, errors, until)
}

#[test]
fn a_subscription_reports_the_outage_and_resumes_without_gap_or_duplicate() {
    let test = "a_subscription_reports_the_outage_and_resumes";
    let Some(mut broker) = own::started(test, &Listener::Plaintext) else {
        return;
    };
    let options = KafkaOptions::new([broker.address()]).timeout(TIMEOUT);
    let bus = own::serving(&options);
    let topic = "sub-outage";
    bus.provision(&Manifest::new([TopicSpec::new(topic, 1)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    for n in 0..5 {
        bus.publish(topic, "k", &json!({ "n": n }))
            .unwrap_or_else(|e| panic!("publish: {e}"));
    }
    let mut sub = bus
        .subscribe(
            topic,
            Selector::Partition(0),
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .unwrap_or_else(|e| panic!("subscribe: {e}"));
    let before = offsets_until(&mut sub, None, |got, _| got.len() >= 5);
    assert_eq!(before, vec![0, 1, 2, 3, 4]);

    broker.kill();
    let mut errors = Vec::new();
    let during = offsets_until(&mut sub, Some(&mut errors), |_, errors| errors >= 2);
    assert!(during.is_empty(), "records while down: {during:?}");
    for error in &errors {
        assert!(error.is_transient(), "not a transient error: {error:?}");
    }
    assert!(
        errors
            .iter()
            .any(|error| matches!(error, bus_core::BusError::Unavailable { .. })),
        "no unavailable item among {errors:?}"
    );

    // Back on the same port and data: the same subscription goes on.
    broker.start();
    let mut acked = Vec::new();
    for n in 5..10 {
        let ack = poll_until(
            "the broker to take a publish",
            Duration::from_secs(120),
            // With a UID: a publish that timed out while the broker came
            // back may still be stored, and the retry must not store it
            // twice.
            || {
                bus.publish_idempotent(topic, "k", &json!({ "n": n }), &format!("after-{n}"))
                    .ok()
            },
        );
        acked.push(ack.offset);
    }
    let mut late_errors = Vec::new();
    let after = offsets_until(&mut sub, Some(&mut late_errors), |got, _| {
        got.last().is_some_and(|last| Some(last) == acked.last())
    });
    assert_eq!(after, acked, "after the outage");
    assert_eq!(acked, vec![5, 6, 7, 8, 9]);
    // Quiet again once the records are in.
    assert!(matches!(sub.recv_timeout(RECV), Ok(None)));
    drop(sub);
    broker.kill();
}
