//! A durable consumer while its PostgreSQL server crashes and comes back
//! (a private server, never the shared one; C10, C21): during the outage
//! acks and receives fail within the timeout with retryable errors and
//! are never `Fenced`; a failed ack retried after the restart is durable;
//! the same consumer instance goes on; every record is acknowledged, none
//! delivered again after its ack, and a restarted consumer starts after
//! all of them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bus_conformance::util::poll_until;
use bus_core::consumer::{ConsumeOptions, Delivery, DurableConsumers, OwnerPolicy};
use bus_core::{BusError, EventBus, Manifest, Selector, StartAt, TopicSpec};
use bus_postgres::{PostgresBus, PostgresOptions};
use common::Server;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(2);
const LIMIT: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_secs(60);
const TOPIC: &str = "jobs";
const PARTITIONS: u32 = 2;

fn connect(url: &str) -> PostgresBus {
    let options = PostgresOptions::from_url(url)
        .expect("url")
        .schema("consumer_outage")
        .timeout(TIMEOUT);
    poll_until("the server to accept a bus", WAIT, || {
        PostgresBus::connect_with(options.clone()).ok()
    })
}

fn publish(bus: &PostgresBus, range: std::ops::Range<u64>) {
    for i in range {
        bus.publish(TOPIC, &format!("k{i}"), &json!({ "i": i }))
            .unwrap();
    }
}

#[test]
fn server_crash_mid_consume_loses_no_ack_and_repeats_none() {
    let Some(mut server) = Server::start_or_skip("consumer outage") else {
        return;
    };
    let bus = connect(&server.url);
    bus.provision(&Manifest::new([TopicSpec::new(TOPIC, PARTITIONS)]))
        .unwrap();
    publish(&bus, 0..30);
    let options = ConsumeOptions::default().ack_wait(Duration::from_secs(1));
    let mut consumer = bus
        .consume(
            TOPIC,
            "worker",
            Selector::Topic,
            StartAt::Beginning,
            options,
        )
        .unwrap();
    let mut acked: BTreeSet<(u32, u64)> = BTreeSet::new();
    let mut again_after_ack = 0;
    for _ in 0..10 {
        let delivery = consumer.recv_timeout(WAIT).unwrap().expect("a delivery");
        consumer.ack(&delivery).unwrap();
        acked.insert((delivery.partition, delivery.offset));
    }

    server.stop(true);
    // During the outage: whatever is called fails retryably, in bounded
    // time, and never as Fenced. Deliveries already read may still come.
    let mut errors: Vec<(Duration, BusError)> = Vec::new();
    let mut failed_acks: Vec<Delivery> = Vec::new();
    let outage_ends = Instant::now() + Duration::from_secs(4);
    while Instant::now() < outage_ends || (errors.is_empty() && Instant::now() < outage_ends + WAIT)
    {
        let started = Instant::now();
        match consumer.recv_timeout(Duration::from_millis(200)) {
            Ok(Some(delivery)) => {
                if acked.contains(&(delivery.partition, delivery.offset)) {
                    again_after_ack += 1;
                }
                let started = Instant::now();
                match consumer.ack(&delivery) {
                    Ok(()) => {
                        acked.insert((delivery.partition, delivery.offset));
                    }
                    Err(error) => {
                        errors.push((started.elapsed(), error));
                        failed_acks.push(delivery);
                    }
                }
            }
            Ok(None) => {}
            Err(error) => errors.push((started.elapsed(), error)),
        }
    }
    assert!(
        !errors.is_empty(),
        "nothing failed while the server was down"
    );
    for (took, error) in &errors {
        assert!(error.is_transient(), "{error:?}");
        assert!(!matches!(error, BusError::Fenced { .. }), "{error:?}");
        assert!(*took <= LIMIT, "an error took {took:?}: {error}");
    }

    server.start().expect("restart");
    poll_until("the bus to publish again", WAIT, || {
        bus.publish(TOPIC, "k30", &json!({ "i": 30 })).ok()
    });
    publish(&bus, 31..40);
    // A failed ack retried is written now (C21: Ok means durable).
    for delivery in &failed_acks {
        poll_until("a failed ack to go through", WAIT, || {
            consumer.ack(delivery).ok()
        });
        acked.insert((delivery.partition, delivery.offset));
    }
    // ... and durable when the retry says Ok: the stored cursors count every
    // record acknowledged so far (none was skipped: one key per record).
    let durable: u64 = bus.consumers(TOPIC).unwrap()[0]
        .partitions
        .iter()
        .map(|p| p.cursor + p.acked_above)
        .sum();
    assert_eq!(durable, acked.len() as u64, "a retried ack is not stored");
    let stored: u64 = (0..PARTITIONS)
        .map(|p| bus.offsets(TOPIC, p).unwrap().next)
        .sum();
    assert_eq!(stored, 40);
    let deadline = Instant::now() + WAIT;
    let mut errors_after = 0;
    while (acked.len() as u64) < stored {
        assert!(
            Instant::now() < deadline,
            "acked {} of {stored}",
            acked.len()
        );
        match consumer.recv_timeout(Duration::from_millis(500)) {
            Ok(Some(delivery)) => {
                if acked.contains(&(delivery.partition, delivery.offset)) {
                    again_after_ack += 1;
                }
                match consumer.ack(&delivery) {
                    Ok(()) => {
                        acked.insert((delivery.partition, delivery.offset));
                    }
                    Err(error) if error.is_transient() => errors_after += 1,
                    Err(error) => panic!("ack after the restart: {error:?}"),
                }
            }
            Ok(None) => {}
            Err(error) if error.is_transient() => errors_after += 1,
            Err(error) => panic!("recv after the restart: {error:?}"),
        }
    }
    consumer.flush().unwrap();
    eprintln!(
        "consumer through a server crash: acked {} of {stored}, errors during the outage {}, \
         acks that failed and were retried {}, transient errors after the restart {errors_after}, \
         delivered again after an ack {again_after_ack}",
        acked.len(),
        errors.len(),
        failed_acks.len()
    );
    assert_eq!(again_after_ack, 0, "an acknowledged record came again");
    drop(consumer);
    // A restarted consumer starts after everything.
    let fresh = connect(&server.url);
    let mut consumer = fresh
        .consume(
            TOPIC,
            "worker",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default().owner(OwnerPolicy::Wait(WAIT)),
        )
        .unwrap();
    let next = consumer.try_recv().unwrap();
    assert!(next.is_none(), "delivered after a restart: {next:?}");
    let info = fresh.consumers(TOPIC).unwrap();
    assert!(
        info[0].partitions.iter().all(|p| p.lag_records == 0),
        "{info:?}"
    );
}
