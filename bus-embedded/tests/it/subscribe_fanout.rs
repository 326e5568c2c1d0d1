//! Many live subscribers of one topic (contract C17, issue #26 item 8): a
//! publish wakes one sleeping subscriber and the woken ones wake the rest,
//! so every subscriber must still get every record, in order, with no
//! wake-up lost, on the memory bus and on the embedded writer.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use bus_core::memory::MemoryBus;
use bus_core::{EventBus, Manifest, Selector, StartAt, SubscribeOptions, TopicSpec};
use bus_embedded::{EmbeddedBus, Options};
use serde_json::json;

const SUBSCRIBERS: usize = 48;
/// Records published one at a time, each waited for by every subscriber:
/// each one's wake-up must reach all of them (a later publish cannot hide
/// a lost one).
const LOCKSTEP: u64 = 60;
/// Then a burst, published without waiting.
const BURST: u64 = 2_000;
/// How long the test waits for a subscriber's report. The subscribers'
/// own waits are far longer, so a lost wake-up fails here, not as a
/// timeout that reads again.
const DEADLINE: Duration = Duration::from_secs(30);

type Subscriber = JoinHandle<Result<(), String>>;

/// Subscribers on their own threads, each reporting every offset it
/// receives and checking the values come in order.
fn subscribers(bus: &dyn EventBus, reports: &mpsc::Sender<u64>) -> Vec<Subscriber> {
    (0..SUBSCRIBERS)
        .map(|_| {
            let mut sub = bus
                .subscribe(
                    "fan",
                    Selector::Topic,
                    StartAt::Now,
                    SubscribeOptions::default(),
                )
                .unwrap();
            let reports = reports.clone();
            std::thread::spawn(move || {
                for expected in 0..LOCKSTEP + BURST {
                    let item = sub
                        .recv_timeout(Duration::from_secs(600))
                        .map_err(|error| error.to_string())?;
                    let Some(event) = item.as_ref().and_then(|item| item.event()) else {
                        // The bus was dropped: the test gave up on us.
                        return Err(format!("ended at {expected}: {item:?}"));
                    };
                    if event.offset != expected || event.value["n"] != json!(expected) {
                        return Err(format!("expected {expected}, got {event:?}"));
                    }
                    if reports.send(expected).is_err() {
                        return Err("the test is gone".to_owned());
                    }
                }
                Ok(())
            })
        })
        .collect()
}

/// Publishes in lockstep then in a burst; `None` when every subscriber
/// got every record, else what went wrong.
fn publish_and_check(bus: &dyn EventBus, reports: &mpsc::Receiver<u64>) -> Option<String> {
    let publish = |n: u64| bus.publish("fan", "k", &json!({ "n": n })).unwrap();
    for n in 0..LOCKSTEP {
        publish(n);
        for got in 0..SUBSCRIBERS {
            match reports.recv_timeout(DEADLINE) {
                Ok(offset) if offset == n => {}
                Ok(offset) => return Some(format!("record {n}: a report of {offset}")),
                Err(_) => {
                    return Some(format!(
                        "record {n}: only {got} of {SUBSCRIBERS} subscribers got it (lost wake-up)"
                    ));
                }
            }
        }
    }
    for n in LOCKSTEP..LOCKSTEP + BURST {
        publish(n);
    }
    let expected = SUBSCRIBERS * BURST as usize;
    for got in 0..expected {
        if reports.recv_timeout(DEADLINE).is_err() {
            return Some(format!("burst: {got} of {expected} deliveries arrived"));
        }
    }
    None
}

fn every_subscriber_gets_every_record(bus: Box<dyn EventBus>) {
    bus.provision(&Manifest::new([TopicSpec::new("fan", 1)]))
        .unwrap();
    let (reports, received) = mpsc::channel();
    let threads = subscribers(bus.as_ref(), &reports);
    drop(reports);
    let failure = publish_and_check(bus.as_ref(), &received);
    // Dropping the bus ends the subscriptions of a failed run (C17), so
    // the joins below cannot hang.
    drop(bus);
    drop(received);
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(failure, None);
    for result in results {
        assert_eq!(result, Ok(()));
    }
}

#[test]
fn memory_every_subscriber_gets_every_record() {
    every_subscriber_gets_every_record(Box::new(MemoryBus::new()));
}

#[test]
fn embedded_every_subscriber_gets_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open_with(dir.path(), Options::default()).unwrap();
    every_subscriber_gets_every_record(Box::new(bus));
}
