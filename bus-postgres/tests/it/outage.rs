//! C10 and C19 against real outages of a private PostgreSQL, stopped cleanly
//! (`pg_ctl -m fast`) or crashed (`-m immediate`) while publisher threads, a
//! reader and a live subscription keep using one bus, then started again on
//! the same port and data. Every failed call fails within timeout + 1 s with
//! a retryable error, the same bus works again, no acknowledged record is
//! lost, UIDs still deduplicate, and the subscription resumes with no gap
//! and no duplicate.

use crate::common;

use std::time::{Duration, Instant};

use bus_conformance::outage::with_traffic;
use bus_conformance::util::poll_until;
use bus_core::{
    BusError, EventBus, Manifest, Selector, StartAt, SubscribeOptions, SubscriptionItem, TopicSpec,
};
use bus_postgres::{PostgresBus, PostgresOptions};
use common::Server;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(2);
const LIMIT: Duration = Duration::from_secs(3);
const PARTITIONS: u32 = 2;
const WAIT: Duration = Duration::from_secs(30);

fn connect(url: &str) -> PostgresBus {
    let options = PostgresOptions::from_url(url)
        .expect("url")
        .schema("outage")
        .timeout(TIMEOUT);
    poll_until("the server to accept a bus", WAIT, || {
        PostgresBus::connect_with(options.clone()).ok()
    })
}

/// What the subscriber saw: per partition the offsets delivered, and the
/// errors with how long the call that returned them took.
#[derive(Default)]
struct Seen {
    offsets: Vec<Vec<u64>>,
    errors: Vec<(Duration, BusError)>,
}

fn outage(crash: bool) {
    let Some(mut server) = Server::start_or_skip("outage") else {
        return;
    };
    let bus = connect(&server.url);
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
    let mut subscription = bus
        .subscribe(
            topic,
            Selector::Topic,
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .expect("subscribe");
    let targets = std::sync::Mutex::new(None::<(Vec<u64>, Instant)>);

    let (seen, mut outcome) = std::thread::scope(|scope| {
        let subscriber = scope.spawn(|| {
            let mut seen = Seen {
                offsets: vec![Vec::new(); PARTITIONS as usize],
                ..Seen::default()
            };
            loop {
                if let Some((ends, deadline)) = targets.lock().expect("targets").as_ref() {
                    let reached = ends.iter().enumerate().all(|(p, end)| {
                        *end == 0 || seen.offsets[p].last().is_some_and(|last| last + 1 >= *end)
                    });
                    if reached || Instant::now() > *deadline {
                        break;
                    }
                }
                let started = Instant::now();
                match subscription.recv_timeout(Duration::from_millis(200)) {
                    Ok(Some(SubscriptionItem::Record { event, .. })) => {
                        seen.offsets[event.partition as usize].push(event.offset);
                    }
                    Ok(Some(other)) => panic!("unexpected item {other:?}"),
                    Ok(None) => {}
                    Err(error) => seen.errors.push((started.elapsed(), error)),
                }
            }
            seen
        });
        let ((), outcome) = with_traffic(&bus, topic, PARTITIONS, 2, |progress| {
            progress.wait_for_successes("traffic before the outage", WAIT);
            server.stop(crash);
            // Twice: calls that were in flight, then calls made while it is down.
            progress.wait_for_failures("every worker to fail during the outage", WAIT);
            progress.wait_for_failures("every worker to fail again", WAIT);
            assert!(
                bus.topics().iter().any(|name| name == topic),
                "the bus forgot its topic during the outage"
            );
            server.start().expect("restart");
            progress.wait_for_successes("the same bus to publish and fetch again", WAIT * 2);
        });
        // The subscriber catches up with everything stored, then stops.
        let ends: Vec<u64> = (0..PARTITIONS)
            .map(|p| bus.offsets(topic, p).expect("offsets").next)
            .collect();
        *targets.lock().expect("targets") = Some((ends.clone(), Instant::now() + WAIT));
        let seen = subscriber.join().expect("subscriber thread");
        for (partition, end) in ends.iter().enumerate() {
            assert!(
                seen.offsets[partition]
                    .last()
                    .is_some_and(|last| last + 1 >= *end),
                "the subscription did not catch up on partition {partition}: saw up to {:?}, stored {end}",
                seen.offsets[partition].last()
            );
        }
        (seen, outcome)
    });

    eprintln!(
        "crash={crash}: {}; subscription errors {}",
        outcome.summary(),
        seen.errors.len()
    );
    assert!(!outcome.failures.is_empty(), "no call failed");
    outcome.assert_failures_transient(LIMIT);
    assert!(
        outcome
            .failures
            .iter()
            .any(|failure| std::error::Error::source(&failure.error).is_some()),
        "no outage error kept its cause as source(): {}",
        outcome.summary()
    );
    assert!(outcome.fetched > 0, "the reader read nothing");
    assert!(
        !seen.errors.is_empty(),
        "the subscription reported no error during the outage"
    );
    for (took, error) in &seen.errors {
        assert!(error.is_transient(), "subscription error {error:?}");
        assert!(
            *took <= LIMIT,
            "a subscription error took {took:?}: {error}"
        );
    }
    for (partition, offsets) in seen.offsets.iter().enumerate() {
        let expected: Vec<u64> = (0..offsets.len() as u64).collect();
        assert_eq!(
            offsets, &expected,
            "partition {partition}: the subscription must deliver 0.. with no gap and no duplicate"
        );
    }
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
}

#[test]
fn clean_stop_fails_retryably_and_the_same_bus_recovers() {
    outage(false);
}

#[test]
fn crash_fails_retryably_and_the_same_bus_recovers() {
    outage(true);
}
