//! C3, C8 and C10 when the bus's TCP connections are reset over and over
//! (`ss -K`, as a flaky network or a proxy would) while 64 threads publish
//! to a broker of the test's own. librdkafka then retries produce requests
//! and reports some records stored without an offset (read back by the
//! bus, `bus-kafka/src/locate.rs`), and admin requests fail with transport
//! errors. Every publish and provision must end in success or a transient
//! error (a provision once failed at once with `BackendFailure`), and every
//! acknowledged record must read back at its offset with its value: an ack
//! at a wrong offset, or a lost acked record, fails the test. CI once saw
//! C9's sixty-four threads fail this way on the shared broker.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bus_core::{EventBus, Manifest, PublishAck, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions};
use common::own::{self, Listener};
use serde_json::{Value, json};

const THREADS: usize = 64;
const PER_THREAD: usize = 4;
const PARTITIONS: u32 = 2;

/// Resets every TCP connection to `port`; how many it reset.
fn cut(port: u16) -> usize {
    let Ok(out) = Command::new("ss")
        .args(["-K", "-H", "-t", "dst", &format!("127.0.0.1:{port}")])
        .output()
    else {
        return 0;
    };
    if !out.status.success() {
        return 0;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| !line.trim().is_empty())
        .count()
}

#[test]
fn acked_records_read_back_while_connections_are_cut() {
    let test = "acked_records_read_back_while_connections_are_cut";
    let Some(broker) = own::started(test, &Listener::Plaintext) else {
        return;
    };
    let port = broker.port();
    let options = KafkaOptions::new([broker.address()]);
    let bus = own::serving(&options);
    let topic = "cuts";
    bus.provision(&Manifest::new([TopicSpec::new(topic, PARTITIONS)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));

    let stop = AtomicBool::new(false);
    let cuts = AtomicUsize::new(0);
    let acks: Mutex<Vec<(PublishAck, Value)>> = Mutex::new(Vec::new());
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                cuts.fetch_add(cut(port), Ordering::SeqCst);
                std::thread::park_timeout(Duration::from_millis(15));
            }
        });
        // Topics created while connections drop: a transport failure is
        // an outage (tried again until the deadline), never a hard error.
        let provisioner = scope.spawn(|| {
            for n in 0..5 {
                let spec = TopicSpec::new(format!("cuts-{n}"), 1);
                match bus.provision(&Manifest::new([spec])) {
                    Ok(()) => {}
                    Err(error) if error.is_transient() => {}
                    Err(error) => failures
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(format!("provision cuts-{n}: {error}")),
                }
            }
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (bus, acks, failures) = (&bus, &acks, &failures);
                scope.spawn(move || {
                    for i in 0..PER_THREAD {
                        let value = json!({ "thread": t, "i": i });
                        match bus.publish(topic, &format!("k{t}"), &value) {
                            Ok(ack) => acks
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push((ack, value)),
                            // A retryable outcome is the contract's answer
                            // to an outage (C10); anything else is not.
                            Err(error) if error.is_transient() => {}
                            Err(error) => failures
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(format!("thread {t} record {i}: {error}")),
                        }
                    }
                })
            })
            .collect();
        provisioner
            .join()
            .unwrap_or_else(|_| panic!("the provisioner panicked"));
        for worker in workers {
            worker
                .join()
                .unwrap_or_else(|_| panic!("a publisher panicked"));
        }
        stop.store(true, Ordering::SeqCst);
    });
    let failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    assert!(failures.is_empty(), "non-transient errors: {failures:#?}");
    assert!(
        cuts.load(Ordering::SeqCst) > 0,
        "ss -K reset no connection (it needs root and a kernel with INET_DIAG_DESTROY)"
    );
    let acks = acks.into_inner().unwrap_or_else(|e| e.into_inner());
    assert!(!acks.is_empty(), "no publish was acknowledged");

    // Read back with a fresh bus, connections left alone.
    let reader = KafkaBus::connect_with(options).unwrap_or_else(|e| panic!("connect: {e}"));
    let mut stored: HashMap<(u32, u64), Value> = HashMap::new();
    for partition in 0..PARTITIONS {
        let mut from = 0;
        loop {
            let page = reader
                .fetch(topic, partition, from, 1_000)
                .unwrap_or_else(|e| panic!("fetch: {e}"));
            let Some(last) = page.last() else { break };
            from = last.offset + 1;
            stored.extend(page.into_iter().map(|e| ((partition, e.offset), e.value)));
        }
    }
    let mut seen = HashMap::new();
    for (ack, value) in &acks {
        let at = (ack.partition, ack.offset);
        assert_eq!(
            stored.get(&at),
            Some(value),
            "acked at partition {} offset {}",
            ack.partition,
            ack.offset
        );
        assert!(
            seen.insert(at, value).is_none(),
            "two acks name offset {at:?}"
        );
    }
    eprintln!(
        "{test}: {} of {} publishes acked, {} connections reset, {} records stored",
        acks.len(),
        THREADS * PER_THREAD,
        cuts.load(Ordering::SeqCst),
        stored.len()
    );
}
