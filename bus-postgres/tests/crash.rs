//! `kill -9` of a publishing client process: the records it had acked are
//! stored, nothing half-written is visible, and the offsets have no hole (an
//! interrupted transaction rolls back with its offsets).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use bus_conformance::util::{assert_contiguous, fetch_all};
use bus_core::{BatchRecord, EventBus, Manifest, TopicSpec};
use bus_postgres::PostgresBus;
use common::Server;
use serde_json::json;

const CHILD_URL: &str = "BUS_POSTGRES_CRASH_CHILD_URL";
const KEY: [u8; 32] = [0x5a; 32];
const TOPIC: &str = "crash";
const PARTITIONS: u32 = 2;

/// The child: publishes from 4 threads (singles and batches) and prints each
/// ack as `partition offset n` until it is killed.
#[test]
fn child_publisher_process() {
    let Ok(url) = std::env::var(CHILD_URL) else {
        return;
    };
    let bus = PostgresBus::connect(&url).expect("child connect");
    bus.set_control_key(KEY).expect("key");
    std::thread::scope(|scope| {
        for worker in 0..4u64 {
            let bus = &bus;
            scope.spawn(move || {
                for n in 0u64.. {
                    let acks = if worker % 2 == 0 {
                        let value = json!({"w": worker, "n": n, "pad": "x".repeat(200)});
                        vec![(
                            bus.publish(TOPIC, &format!("k{n}"), &value)
                                .expect("publish"),
                            n,
                        )]
                    } else {
                        let batch: Vec<_> = (0..20)
                            .map(|i| {
                                BatchRecord::new(
                                    format!("b{i}"),
                                    json!({"w": worker, "n": n * 100 + i}),
                                )
                            })
                            .collect();
                        let acks = bus.publish_batch(TOPIC, &batch).expect("batch");
                        acks.into_iter()
                            .zip(0..)
                            .map(|(ack, i)| (ack, n * 100 + i))
                            .collect()
                    };
                    for (ack, n) in acks {
                        println!("{} {} {worker} {n}", ack.partition, ack.offset);
                    }
                }
            });
        }
    });
}

#[test]
fn kill_9_of_a_publisher_leaves_no_partial_record_and_no_hole() {
    let Some(server) = Server::start_or_skip("kill_9_of_a_publisher") else {
        return;
    };
    let url = format!("{}?schema=crash", server.url);
    let bus = PostgresBus::connect(&url).expect("connect");
    bus.set_control_key(KEY).expect("key");
    bus.provision(&Manifest::new([TopicSpec::new(TOPIC, PARTITIONS)]))
        .expect("provision");

    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "child_publisher_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_URL, &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child");
    let stdout = child.stdout.take().expect("stdout");
    let mut acked = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("child output");
        let fields: Vec<u64> = line.split(' ').filter_map(|f| f.parse().ok()).collect();
        if let [partition, offset, worker, n] = fields[..] {
            acked.push((partition, offset, worker, n));
        }
        if acked.len() >= 2_000 {
            // Mid-stream: rounds are in flight right now.
            let _ = child.kill();
            break;
        }
    }
    let _ = child.wait();
    assert!(acked.len() >= 2_000, "the child acked only {}", acked.len());

    for partition in 0..PARTITIONS {
        let stored = fetch_all(&bus, TOPIC, partition, 0);
        assert_contiguous(&stored);
        let next = bus.offsets(TOPIC, partition).expect("offsets").next;
        assert_eq!(
            stored.len() as u64,
            next,
            "partition {partition}: {} records readable but the counter says {next}",
            stored.len()
        );
        for (p, offset, worker, n) in acked.iter().filter(|a| a.0 == u64::from(partition)) {
            let event = stored
                .get(usize::try_from(*offset).expect("offset"))
                .unwrap_or_else(|| panic!("acked {p}/{offset} is missing"));
            assert_eq!(event.value["w"], json!(worker), "acked {p}/{offset}");
            assert_eq!(event.value["n"], json!(n), "acked {p}/{offset}");
        }
    }
    // The same partitions take new records right after the last one.
    let ack = bus
        .publish(TOPIC, "k0", &json!({"after": true}))
        .expect("publish after");
    let stored = fetch_all(&bus, TOPIC, ack.partition, 0);
    assert_eq!(stored.last().map(|e| e.offset), Some(ack.offset));
    assert_contiguous(&stored);
}
