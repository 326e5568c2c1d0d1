//! Benchmark of live subscriptions on the embedded log: delivery latency
//! beside the publish ack latency of the same run, fan-out to 64
//! subscribers, and the CPU an idle subscription uses.
//!
//! ```text
//! cargo run --release -p bus-bench --example bench_subscribe -- [--records N] [--samples N] [--idle-secs S] [--dir DIR]
//! ```
//!
//! - latency: one subscriber (`StartAt::Now`) on its own thread, one serial
//!   publisher (`Durability::Sync`); per record, the time from the publish
//!   call to the subscriber's receipt, and from the call to the ack. Once
//!   for a subscriber of the writing bus, once for a read-only open of the
//!   same directory (woken through inotify).
//! - fan-out: N records are published first (batches of 1000), then 64
//!   subscribers (`StartAt::Beginning`, one thread each) read them all;
//!   records delivered per second in total.
//! - acked-end store: what a `Sync` writer adds per round so readers in
//!   other processes see only acked records (one 24-byte `pwrite`).
//! - idle: the process's CPU ticks (`/proc/self/stat`) over S seconds while
//!   one subscription of the writer and one of a read-only open wait.
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    clippy::cast_sign_loss,
    missing_docs
)]

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bus_core::{
    BatchRecord, EventBus, Manifest, Selector, StartAt, SubscribeOptions, Subscription,
    SubscriptionItem, TopicSpec,
};
use bus_embedded::EmbeddedBus;
use serde_json::json;

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at].as_secs_f64() * 1e6
}

fn subscribe(bus: &dyn EventBus, topic: &str, start: StartAt) -> Subscription {
    bus.subscribe(topic, Selector::Topic, start, SubscribeOptions::default())
        .unwrap()
}

/// Receives `n` records; returns when each arrived, by its `i`.
fn receive_all(mut sub: Subscription, n: usize) -> Vec<Instant> {
    let mut at = vec![None; n];
    let mut got = 0;
    while got < n {
        match sub.recv_timeout(Duration::from_secs(30)).unwrap() {
            Some(SubscriptionItem::Record { event, .. }) => {
                let i = event.value["i"].as_u64().unwrap() as usize;
                at[i] = Some(Instant::now());
                got += 1;
            }
            Some(other) => panic!("unexpected {other:?}"),
            None => panic!("no record within 30 s ({got} of {n})"),
        }
    }
    at.into_iter().map(Option::unwrap).collect()
}

struct Latency {
    delivery_p50: f64,
    delivery_p99: f64,
    ack_p50: f64,
    ack_p99: f64,
}

/// Serial publishes onto `topic` of `writer`, received through `sub`.
fn latency(writer: &EmbeddedBus, topic: &str, sub: Subscription, samples: usize) -> Latency {
    let receiver = std::thread::spawn(move || receive_all(sub, samples));
    let mut calls = Vec::with_capacity(samples);
    let mut acks = Vec::with_capacity(samples);
    for i in 0..samples {
        let value = json!({ "i": i, "payload": "x".repeat(180) });
        let start = Instant::now();
        writer.publish(topic, "k", &value).unwrap();
        acks.push(start.elapsed());
        calls.push(start);
    }
    let received = receiver.join().unwrap();
    let mut delivery: Vec<Duration> = received
        .iter()
        .zip(&calls)
        .map(|(got, call)| got.saturating_duration_since(*call))
        .collect();
    delivery.sort();
    acks.sort();
    Latency {
        delivery_p50: percentile(&delivery, 0.5),
        delivery_p99: percentile(&delivery, 0.99),
        ack_p50: percentile(&acks, 0.5),
        ack_p99: percentile(&acks, 0.99),
    }
}

/// User + system CPU ticks of this process.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command name, which ends with the last ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// `USER_HZ` on Linux: the unit of `/proc/self/stat` times.
const HZ: f64 = 100.0;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().position(|a| a == name).map(|i| i + 1);
    let records: u64 = flag("--records").map_or(100_000, |i| args[i].parse().unwrap());
    let samples: usize = flag("--samples").map_or(2_000, |i| args[i].parse().unwrap());
    let idle_secs: u64 = flag("--idle-secs").map_or(10, |i| args[i].parse().unwrap());
    let tmp = tempfile::tempdir_in(
        flag("--dir").map_or_else(std::env::temp_dir, |i| PathBuf::from(&args[i])),
    )
    .unwrap();
    let dir = tmp.path();
    let writer = EmbeddedBus::open(dir).unwrap();
    let reader = EmbeddedBus::open_read_only(dir).unwrap();
    writer
        .provision(&Manifest::new([
            TopicSpec::new("lat", 1),
            TopicSpec::new("lat-ro", 1),
            TopicSpec::new("fan", 1),
            TopicSpec::new("idle", 1),
        ]))
        .unwrap();

    let own = latency(
        &writer,
        "lat",
        subscribe(&writer, "lat", StartAt::Now),
        samples,
    );
    let read_only = latency(
        &writer,
        "lat-ro",
        subscribe(&reader, "lat-ro", StartAt::Now),
        samples,
    );

    let mut i = 0;
    while i < records {
        let batch: Vec<BatchRecord> = (i..(i + 1000).min(records))
            .map(|j| BatchRecord::new("k", json!({ "i": j, "payload": "x".repeat(180) })))
            .collect();
        i += batch.len() as u64;
        writer.publish_batch("fan", &batch).unwrap();
    }
    let subscribers = 64;
    let subs: Vec<Subscription> = (0..subscribers)
        .map(|_| subscribe(&writer, "fan", StartAt::Beginning))
        .collect();
    let (start, ticks_before) = (Instant::now(), cpu_ticks());
    let threads: Vec<_> = subs
        .into_iter()
        .map(|sub| std::thread::spawn(move || receive_all(sub, records as usize).len()))
        .collect();
    let delivered: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let fan_out = delivered as f64 / start.elapsed().as_secs_f64();
    let fan_out_cpu = delivered as f64 / ((cpu_ticks() - ticks_before) as f64 / HZ);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    // What a Sync writer adds per round for readers in other processes:
    // the acked-end store (one 24-byte pwrite).
    let probe = std::fs::File::create(dir.join("acked-probe")).unwrap();
    let stores = 100_000u32;
    let store_start = Instant::now();
    for i in 0..u64::from(stores) {
        probe.write_all_at(&[i as u8; 24], 0).unwrap();
    }
    let store_us = store_start.elapsed().as_secs_f64() * 1e6 / f64::from(stores);

    let idle_writer = subscribe(&writer, "idle", StartAt::Now);
    let idle_reader = subscribe(&reader, "idle", StartAt::Now);
    let waiters: Vec<_> = [idle_writer, idle_reader]
        .into_iter()
        .map(|mut sub| {
            std::thread::spawn(move || {
                assert!(
                    sub.recv_timeout(Duration::from_secs(idle_secs + 5))
                        .unwrap()
                        .is_none()
                );
            })
        })
        .collect();
    let ticks_before = cpu_ticks();
    std::thread::sleep(Duration::from_secs(idle_secs));
    let idle_ticks = cpu_ticks() - ticks_before;
    drop(writer);
    drop(reader);
    for waiter in waiters {
        waiter.join().unwrap();
    }

    println!("load average while running: {}", load.trim());
    println!(
        "dir {}; latency: {samples} serial publishes (Sync, ~200 B); fan-out: {records} records published first, then read by {subscribers} subscribers",
        dir.display()
    );
    println!(
        "{:<48} {:>12} {:<6} {:<28} {:>12} {:>7} {:<10}",
        "measure", "value", "unit", "reference", "ref value", "ratio", "target"
    );
    let row = |name: &str, value: f64, unit: &str, reference: &str, rv: f64, target: &str| {
        let ratio = if rv > 0.0 {
            format!("{:.2}", value / rv)
        } else {
            String::new()
        };
        let rv = if rv > 0.0 {
            format!("{rv:.1}")
        } else {
            String::new()
        };
        println!(
            "{name:<48} {value:>12.1} {unit:<6} {reference:<28} {rv:>12} {ratio:>7} {target:<10}"
        );
    };
    for (name, l) in [
        ("writer's subscriber", &own),
        ("read-only open's subscriber", &read_only),
    ] {
        row(
            &format!("delivery p50, {name}"),
            l.delivery_p50,
            "us",
            "publish ack p50",
            l.ack_p50,
            "<= 2",
        );
        row(
            &format!("delivery p99, {name}"),
            l.delivery_p99,
            "us",
            "publish ack p99",
            l.ack_p99,
            "",
        );
    }
    row(
        "fan-out, 64 subscribers, total",
        fan_out,
        "rec/s",
        "",
        0.0,
        ">= 500000",
    );
    row(
        "fan-out, 64 subscribers, per CPU second",
        fan_out_cpu,
        "rec/s",
        "",
        0.0,
        "",
    );
    row(
        "acked-end store (24 B pwrite), per Sync round",
        store_us,
        "us",
        "publish ack p50",
        own.ack_p50,
        "",
    );
    row(
        &format!("CPU while 2 subscriptions idle {idle_secs} s"),
        idle_ticks as f64 / HZ / idle_secs as f64 * 100.0,
        "%",
        "",
        0.0,
        "0",
    );
}
