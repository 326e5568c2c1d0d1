//! TLS and SASL against a real broker of the test's own (a SASL_SSL
//! listener with a certificate from a CA the test made): PLAIN and
//! SCRAM-SHA-256 users publish and read, by builder and by URL; a wrong
//! password, a client without SASL and a client that does not trust the CA
//! fail within the timeout, and no error or `Debug` text shows a password.

mod common;

use std::time::Duration;

use bus_conformance::util::{assert_refused_quietly, poll_until};
use bus_core::{EventBus, Manifest, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions, SaslMechanism};
use common::own::{self, Listener};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(4);
const PLAIN: (&str, &str) = ("alice", "alice-Pw-7f3a");
const SCRAM: (&str, &str) = ("bob", "bob-Pw-91c2");

/// `attempt` fails within the timeout plus a second (and librdkafka's
/// handshake slack) without showing `secret`.
fn refused<T: std::fmt::Debug>(
    what: &str,
    secret: &str,
    attempt: impl FnOnce() -> Result<T, bus_core::BusError>,
) {
    let limit = TIMEOUT * 2 + Duration::from_secs(1);
    assert_refused_quietly(what, limit, &[secret], attempt);
}

#[test]
fn sasl_over_tls_works_and_refuses_without_leaking_secrets() {
    let test = "sasl_over_tls_works_and_refuses_without_leaking_secrets";
    let listener = Listener::SaslSsl {
        plain: (PLAIN.0.to_owned(), PLAIN.1.to_owned()),
        scram: (SCRAM.0.to_owned(), SCRAM.1.to_owned()),
    };
    let Some(mut broker) = own::started(test, &listener) else {
        return;
    };
    let ca = broker.ca().display().to_string();
    let plain = KafkaOptions::new([broker.address()])
        .timeout(TIMEOUT)
        .ca_location(ca.clone())
        .sasl(SaslMechanism::Plain, PLAIN.0, PLAIN.1);
    assert!(
        !format!("{plain:?}").contains(PLAIN.1),
        "Debug shows the password"
    );
    let alice = poll_until("the TLS broker to serve", Duration::from_secs(120), || {
        KafkaBus::connect_with(plain.clone()).ok()
    });

    // PLAIN over TLS: the whole round trip.
    let topic = "secure";
    alice
        .provision(&Manifest::new([TopicSpec::new(topic, 2)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    let ack = alice
        .publish_idempotent(topic, "agent-1", &json!({"n": 1}), "evt-1")
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let got = alice
        .fetch(topic, ack.partition, ack.offset, 10)
        .unwrap_or_else(|e| panic!("fetch: {e}"));
    assert_eq!(got.first().map(|e| &e.value), Some(&json!({"n": 1})));
    assert_eq!(
        alice
            .find_event_by_uid(topic, "agent-1", "evt-1")
            .ok()
            .flatten(),
        Some(ack.clone())
    );

    // SCRAM-SHA-256 by URL, credentials in the authority: the same topic.
    let url = format!(
        "kafkas://{}:{}@{}?ca={ca}&sasl_mechanism=SCRAM-SHA-256&timeout_ms={}",
        SCRAM.0,
        SCRAM.1,
        broker.address(),
        TIMEOUT.as_millis()
    );
    let scram = KafkaOptions::from_url(&url).unwrap_or_else(|e| panic!("url: {e}"));
    assert!(
        !format!("{scram:?}").contains(SCRAM.1),
        "Debug shows the password"
    );
    let bob = KafkaBus::connect_with(scram).unwrap_or_else(|e| panic!("scram connect: {e}"));
    assert_eq!(bob.partitions(topic).ok(), Some(2));
    let got = bob
        .fetch(topic, ack.partition, ack.offset, 10)
        .unwrap_or_else(|e| panic!("scram fetch: {e}"));
    assert_eq!(got.first().map(|e| &e.value), Some(&json!({"n": 1})));
    bob.publish(topic, "agent-2", &json!({"n": 2}))
        .unwrap_or_else(|e| panic!("scram publish: {e}"));

    // A wrong password, no SASL at all, and a CA the client does not trust.
    let wrong = "wrong-Pw-5d1e";
    refused("wrong password", wrong, || {
        let bus = KafkaBus::connect_with(
            KafkaOptions::new([broker.address()])
                .timeout(TIMEOUT)
                .ca_location(ca.clone())
                .sasl(SaslMechanism::Plain, PLAIN.0, wrong),
        )?;
        bus.partitions(topic)
    });
    refused("TLS without SASL", PLAIN.1, || {
        let bus = KafkaBus::connect_with(
            KafkaOptions::new([broker.address()])
                .timeout(TIMEOUT)
                .ca_location(ca.clone()),
        )?;
        bus.partitions(topic)
    });
    refused("an untrusted certificate", PLAIN.1, || {
        let bus = KafkaBus::connect_with(
            KafkaOptions::new([broker.address()])
                .timeout(TIMEOUT)
                .tls(true)
                .sasl(SaslMechanism::Plain, PLAIN.0, PLAIN.1),
        )?;
        bus.partitions(topic)
    });
    broker.kill();
}

/// Mutual TLS: a broker that requires a client certificate serves a bus
/// given one (by builder and by URL, with a librdkafka setting passed
/// through), and refuses one without within the timeout; a pass-through
/// setting librdkafka does not know is the caller's error, at connect.
#[test]
fn mutual_tls_with_a_client_certificate() {
    let test = "mutual_tls_with_a_client_certificate";
    let Some(mut broker) = own::started(test, &Listener::MutualTls) else {
        return;
    };
    let ca = broker.ca().display().to_string();
    let (cert, key) = broker.client_cert();
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let options = KafkaOptions::new([broker.address()])
        .timeout(TIMEOUT)
        .ca_location(ca.clone())
        .client_cert(cert.clone(), key.clone());
    let bus = poll_until(
        "the mutual-TLS broker to serve",
        Duration::from_secs(120),
        || KafkaBus::connect_with(options.clone()).ok(),
    );
    let topic = "mutual";
    bus.provision(&Manifest::new([TopicSpec::new(topic, 1)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    let ack = bus
        .publish(topic, "k", &json!({"mtls": true}))
        .unwrap_or_else(|e| panic!("publish: {e}"));

    // By URL, with a librdkafka setting passed through.
    let url = format!(
        "kafkas://{}?ca={ca}&cert={cert}&key={key}&rdkafka.client.id=bus-mtls-test&timeout_ms={}",
        broker.address(),
        TIMEOUT.as_millis()
    );
    let by_url =
        KafkaBus::connect_with(KafkaOptions::from_url(&url).unwrap_or_else(|e| panic!("url: {e}")))
            .unwrap_or_else(|e| panic!("connect by URL: {e}"));
    let got = by_url
        .fetch(topic, ack.partition, ack.offset, 1)
        .unwrap_or_else(|e| panic!("fetch by URL: {e}"));
    assert_eq!(got.first().map(|e| &e.value), Some(&json!({"mtls": true})));

    // No client certificate: the handshake fails, within the timeout.
    refused("TLS without a client certificate", "no secret", || {
        let bus = KafkaBus::connect_with(
            KafkaOptions::new([broker.address()])
                .timeout(TIMEOUT)
                .ca_location(ca.clone()),
        )?;
        bus.partitions(topic)
    });

    // A setting librdkafka does not know: the caller's error.
    let unknown = KafkaBus::connect_with(options.clone().rdkafka("no.such.setting", "1"));
    assert!(
        matches!(unknown, Err(bus_core::BusError::InvalidArgument { .. })),
        "unknown librdkafka setting: {:?}",
        unknown.err()
    );
    broker.kill();
}
