//! C10 against a broker of the test's own (a child JVM on its own port and
//! data directory, from the jars `scripts/kafka.sh install` cached): calls
//! fail within the timeout + 1 s while it is down, the same bus works again
//! once it is back, and no acknowledged record is missing.

mod common;

use std::time::{Duration, Instant};

use bus_conformance::util::{fetch_all, poll_until};
use bus_core::{EventBus, Manifest, PublishAck, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions};
use common::own::{Broker, Listener, kafka_libs};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(3);

#[test]
fn broker_outage_fails_fast_and_recovers_without_rebuild() {
    let test = "broker_outage_fails_fast_and_recovers_without_rebuild";
    let Some(libs) = kafka_libs() else {
        return common::skip(
            test,
            "no cached Kafka jars (run: bash scripts/kafka.sh install)",
        );
    };
    let mut broker = Broker::new(libs, &Listener::Plaintext);
    broker.start();
    let options = KafkaOptions::new([broker.address()]).timeout(TIMEOUT);
    let bus = poll_until("the test broker to serve", Duration::from_secs(120), || {
        KafkaBus::connect_with(options.clone()).ok()
    });
    let topic = "outage";
    bus.provision(&Manifest::new([TopicSpec::new(topic, 1)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    let mut acked: Vec<(PublishAck, serde_json::Value)> = Vec::new();
    for n in 0..50 {
        let value = json!({ "n": n, "phase": "before" });
        let ack = bus
            .publish(topic, "k", &value)
            .unwrap_or_else(|e| panic!("publish: {e}"));
        acked.push((ack, value));
    }

    // Kill the broker while a thread keeps publishing.
    let outcomes = std::thread::scope(|scope| {
        let publisher = scope.spawn(|| {
            let mut outcomes = Vec::new();
            let mut failures = 0;
            for n in 0.. {
                let value = json!({ "n": n, "phase": "during" });
                let started = Instant::now();
                let result = bus.publish(topic, "k", &value);
                outcomes.push((result.map(|ack| (ack, value)), started.elapsed()));
                if outcomes.last().is_some_and(|(r, _)| r.is_err()) {
                    failures += 1;
                    if failures == 3 {
                        break;
                    }
                }
            }
            outcomes
        });
        poll_until("some publishes to land", Duration::from_secs(30), || {
            (bus.fetch(topic, 0, 60, 1)
                .map(|got| !got.is_empty())
                .unwrap_or(false))
            .then_some(())
        });
        broker.kill();
        publisher
            .join()
            .unwrap_or_else(|_| panic!("publisher panicked"))
    });
    let limit = TIMEOUT + Duration::from_secs(1);
    for (result, took) in outcomes {
        match result {
            Ok(ack) => acked.push(ack),
            Err(error) => {
                assert!(error.is_transient(), "{error:?}");
                assert!(
                    took <= limit,
                    "a failing publish took {took:?} (> {limit:?}): {error}"
                );
            }
        }
    }
    for call in 0..2 {
        let started = Instant::now();
        let result = bus.fetch(topic, 0, 0, 10);
        let took = started.elapsed();
        assert!(
            result.is_err(),
            "fetch #{call} with the broker down: {result:?}"
        );
        assert!(took <= limit, "a failing fetch took {took:?}");
    }

    // Back on the same port and data: the same bus recovers.
    broker.start();
    let recovered = poll_until(
        "the same bus to publish again",
        Duration::from_secs(120),
        || bus.publish(topic, "k", &json!({"phase": "after"})).ok(),
    );
    assert!(recovered.offset >= 50);
    let stored = fetch_all(&bus, topic, 0, 0);
    for (ack, value) in &acked {
        let found = stored.iter().find(|event| event.offset == ack.offset);
        assert_eq!(
            found.map(|event| &event.value),
            Some(value),
            "acked record at {}",
            ack.offset
        );
    }
    broker.kill();
}
