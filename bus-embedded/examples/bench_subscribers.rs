//! Benchmark: what live subscribers cost the publisher (issue #26, item 8).
//!
//! ```text
//! cargo run --release -p bus-embedded --example bench_subscribers -- [--scale F] [--dir DIR]
//! ```
//!
//! For the memory bus and the embedded writer (`Durability::Interval` and
//! `Durability::Sync`): one topic of one partition, 0, 16 and 256
//! subscribers (`StartAt::Now`, one thread each, receiving every record),
//! then one thread publishing N records one by one. Printed per row:
//!
//! - publish/s: N over the publisher's wall time, and its ratio to the
//!   row with no subscriber;
//! - cpu/publish: the publisher thread's own CPU time per publish
//!   (`/proc/thread-self/schedstat`), the cost of the publish path itself,
//!   and its ratio;
//! - delivered/s: records received by all subscribers together, per second
//!   from the first publish to the last receipt.
//!
//! The machine's cores are shared by the publisher and the subscribers:
//! with 256 subscribers each record is decoded 256 times, so when the
//! cores are few the publisher's wall rate falls with its share of them
//! even though its own cost per publish stays put (the cpu column).
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    clippy::cast_sign_loss,
    missing_docs
)]

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use bus_core::memory::MemoryBus;
use bus_core::{EventBus, Manifest, Selector, StartAt, SubscribeOptions, TopicSpec};
use bus_embedded::{Durability, EmbeddedBus, Options};
use serde_json::json;

/// Nanoseconds the calling thread has run on a CPU.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[derive(Clone, Copy)]
struct Row {
    rate: f64,
    cpu_ns: f64,
    delivered: f64,
}

fn run(bus: &dyn EventBus, subscribers: usize, records: usize) -> Row {
    let ready = Arc::new(Barrier::new(subscribers + 1));
    let threads: Vec<_> = (0..subscribers)
        .map(|_| {
            let mut sub = bus
                .subscribe(
                    "t",
                    Selector::Topic,
                    StartAt::Now,
                    SubscribeOptions::default(),
                )
                .unwrap();
            let ready = Arc::clone(&ready);
            std::thread::spawn(move || {
                ready.wait();
                let mut got = 0;
                while got < records {
                    match sub.recv_timeout(Duration::from_secs(60)).unwrap() {
                        Some(item) if item.event().is_some() => got += 1,
                        Some(other) => panic!("unexpected {other:?}"),
                        None => panic!("no record within 60 s ({got} of {records})"),
                    }
                }
                Instant::now()
            })
        })
        .collect();
    ready.wait();
    let start = Instant::now();
    let cpu = thread_cpu_ns();
    for i in 0..records {
        bus.publish("t", "k", &json!({"i": i})).unwrap();
    }
    let cpu = thread_cpu_ns() - cpu;
    let published = start.elapsed();
    let last = threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .max()
        .unwrap_or(start + published);
    Row {
        rate: records as f64 / published.as_secs_f64(),
        cpu_ns: cpu as f64 / records as f64,
        delivered: (records * subscribers) as f64 / (last - start).as_secs_f64(),
    }
}

fn main() {
    let mut scale = 1.0f64;
    let mut dir: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--scale" => scale = args.next().unwrap().parse().unwrap(),
            "--dir" => dir = Some(args.next().unwrap().into()),
            other => panic!("unknown argument {other}"),
        }
    }
    let base = match &dir {
        Some(dir) => tempfile::tempdir_in(dir).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    println!("{cores} cores; one topic of one partition; each subscriber on its own thread\n");
    println!(
        "{:<22} {:>5} {:>8} {:>12} {:>6} {:>12} {:>6} {:>14}",
        "backend", "subs", "records", "publish/s", "ratio", "cpu/publish", "ratio", "delivered/s"
    );
    let configs: [(&str, usize); 3] = [
        ("memory", 50_000),
        ("embedded Interval(5)", 20_000),
        ("embedded Sync", 1_000),
    ];
    for (index, (name, records)) in configs.into_iter().enumerate() {
        let records = ((records as f64 * scale) as usize).max(10);
        let mut first: Option<Row> = None;
        for subscribers in [0, 16, 256] {
            let bus: Box<dyn EventBus> = match index {
                0 => Box::new(MemoryBus::new()),
                _ => {
                    let durability = if index == 1 {
                        Durability::Interval(5)
                    } else {
                        Durability::Sync
                    };
                    let path = base.path().join(format!("{index}-{subscribers}"));
                    Box::new(
                        EmbeddedBus::open_with(&path, Options::default().durability(durability))
                            .unwrap(),
                    )
                }
            };
            bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
                .unwrap();
            let row = run(bus.as_ref(), subscribers, records);
            let zero = *first.get_or_insert(row);
            println!(
                "{:<22} {:>5} {:>8} {:>12.0} {:>6.2} {:>10.2}µs {:>6.2} {:>14.0}",
                name,
                subscribers,
                records,
                row.rate,
                row.rate / zero.rate,
                row.cpu_ns / 1e3,
                row.cpu_ns / zero.cpu_ns,
                row.delivered
            );
        }
    }
}
