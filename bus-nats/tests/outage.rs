//! C10 against a real outage: a private nats-server is killed while a bus
//! publishes, and started again on the same port and store. Calls fail
//! within timeout + 1 s, the same bus recovers without being rebuilt, and
//! no acknowledged record is lost.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bus_conformance::util::{fetch_all, poll_until};
use bus_core::{EventBus, Manifest, PublishAck, TopicSpec};
use bus_nats::{NatsBus, NatsOptions};
use common::{Server, free_port, server_binary_or_skip, start};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(2);
const BOUND: Duration = Duration::from_secs(3);

fn connect(url: &str) -> NatsBus {
    let options = NatsOptions::from_url(url)
        .expect("url")
        .prefix("outage")
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT);
    poll_until(
        "the server to accept a bus",
        Duration::from_secs(30),
        || NatsBus::connect_with(options.clone()).ok(),
    )
}

#[test]
fn outage_fails_fast_and_recovers_without_rebuild() {
    let Some(binary) = server_binary_or_skip("outage") else {
        return;
    };
    let store = tempfile::tempdir().expect("store dir");
    let port = free_port();
    let url = format!("nats://127.0.0.1:{port}");
    let mut server = Server(start(&binary, port, store.path(), ""));
    let bus = connect(&url);
    bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
        .expect("provision");

    let mut acked: BTreeMap<String, PublishAck> = BTreeMap::new();
    let mut publish = |bus: &NatsBus, i: usize| {
        let uid = format!("u{i}");
        let started = Instant::now();
        let result = bus.publish_idempotent("t", "k", &json!({ "i": i }), &uid);
        let took = started.elapsed();
        assert!(took < BOUND, "publish #{i} took {took:?}");
        if let Ok(ack) = &result {
            acked.insert(uid, ack.clone());
        }
        result
    };
    for i in 0..50 {
        publish(&bus, i).expect("publish before the outage");
    }

    // Kill the server while publishing: every call returns an error in time.
    let _ = server.0.kill();
    let _ = server.0.wait();
    let mut failures = 0;
    let mut i = 50;
    while failures < 3 {
        if publish(&bus, i).is_err() {
            failures += 1;
        }
        i += 1;
        assert!(
            i < 1_000,
            "publishes kept succeeding with the server killed"
        );
    }
    let started = Instant::now();
    assert!(bus.fetch("t", 0, 0, 10).is_err(), "fetch during the outage");
    assert!(
        bus.find_event_by_uid("t", "k", "u1").is_err(),
        "find during the outage"
    );
    assert!(
        started.elapsed() < BOUND * 2,
        "reads took {:?}",
        started.elapsed()
    );

    // Back on the same port and store: the same bus works again.
    server = Server(start(&binary, port, store.path(), ""));
    let recovered = poll_until("the bus to publish again", Duration::from_secs(60), || {
        let result = publish(&bus, i);
        i += 1;
        result.ok()
    });
    for _ in 0..20 {
        publish(&bus, i).expect("publish after recovery");
        i += 1;
    }
    poll_until("fetch to work again", Duration::from_secs(30), || {
        bus.fetch("t", 0, 0, 100).ok()
    });
    let stored = fetch_all(&bus, "t", 0, 0);
    let by_offset: BTreeMap<u64, &serde_json::Value> = stored
        .iter()
        .map(|event| (event.offset, &event.value))
        .collect();
    for (uid, ack) in &acked {
        let n: usize = uid[1..].parse().expect("uid number");
        assert_eq!(
            by_offset.get(&ack.offset).copied(),
            Some(&json!({ "i": n })),
            "acked {uid} at offset {} is missing",
            ack.offset
        );
        let again = bus
            .publish_idempotent("t", "k", &json!({ "i": n }), uid)
            .expect("retry after recovery");
        assert_eq!(&again, ack, "{uid} must still deduplicate");
    }
    assert!(acked.contains_key(&format!("u{}", i - 1)));
    assert!(recovered.offset >= 50);
    drop(server);
}
