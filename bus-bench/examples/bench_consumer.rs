//! Benchmark: what a durable acknowledgement costs on the embedded log
//! beside a publish (issue #28).
//!
//! ```text
//! cargo run --release -p bus-bench --example bench_consumer -- [--records N] [--dir DIR]
//! ```
//!
//! One topic of one partition under `Durability::Sync` (the default). Rows:
//!
//! - publish: N records published one by one (each fsynced before its ack);
//! - consume, ack per record (`ack_every(1)`, the default: each ack's cursor
//!   file replaced and fsynced before `ack` returns);
//! - consume, a durable write per 100 and per 1,000 acks (`ack_every(n)`,
//!   then `flush`);
//! - consume, no ack at all: the subscription's own cost, for reference.
//!
//! Printed per row: records/s and microseconds per record (wall time).
#![allow(clippy::unwrap_used, clippy::cast_precision_loss, missing_docs)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bus_core::consumer::{ConsumeOptions, DurableConsumers};
use bus_core::{EventBus, Manifest, Selector, StartAt, TopicSpec};
use bus_embedded::EmbeddedBus;
use serde_json::json;

fn main() {
    let mut records: u64 = 2_000;
    let mut dir: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--records" => records = args.next().unwrap().parse().unwrap(),
            "--dir" => dir = Some(args.next().unwrap().into()),
            other => panic!("unknown argument {other}"),
        }
    }
    let temp = tempfile::tempdir_in(dir.unwrap_or_else(std::env::temp_dir)).unwrap();
    let bus = EmbeddedBus::open(temp.path()).unwrap();
    bus.provision(&Manifest::new([TopicSpec::new("jobs", 1)]))
        .unwrap();

    let started = Instant::now();
    for i in 0..records {
        bus.publish("jobs", "k", &json!({"i": i, "pad": "x".repeat(100)}))
            .unwrap();
    }
    let mut rows = vec![("publish (fsync per record)".to_owned(), started.elapsed())];

    for (label, every, ack) in [
        ("consume, ack per record (durable each)", 1, true),
        ("consume, durable write per 100 acks", 100, true),
        ("consume, durable write per 1,000 acks", 1_000, true),
        ("consume, no ack (subscription only)", 1, false),
    ] {
        let name = format!("c{every}{ack}");
        let options = ConsumeOptions::default().ack_every(every);
        let mut consumer = bus
            .consume("jobs", &name, Selector::Topic, StartAt::Beginning, options)
            .unwrap();
        let started = Instant::now();
        for _ in 0..records {
            let delivery = consumer
                .recv_timeout(Duration::from_secs(10))
                .unwrap()
                .unwrap();
            if ack {
                consumer.ack(&delivery).unwrap();
            }
        }
        consumer.flush().unwrap();
        rows.push((label.to_owned(), started.elapsed()));
    }

    println!("embedded, Durability::Sync, {records} records of ~120 bytes, one partition");
    println!(
        "{:<42} {:>12} {:>14}",
        "operation", "records/s", "µs/record"
    );
    for (label, took) in rows {
        let per = took.as_secs_f64() * 1e6 / records as f64;
        let rate = records as f64 / took.as_secs_f64();
        println!("{label:<42} {rate:>12.0} {per:>14.1}");
    }
}
