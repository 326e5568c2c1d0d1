//! bus-postgres beside a raw tokio-postgres client running the bus's own SQL
//! (`bus_bench::postgres`) in the same run: serial and 16-thread
//! publish, batch publish, replay, find by UID and subscription delivery
//! latency.
//!
//! ```text
//! BUS_POSTGRES_URL=postgres://bus:bus@127.0.0.1:5433/bus \
//!   cargo run --release -p bus-bench --features postgres --example bench_postgres [RECORDS]
//! ```
//!
//! Every phase writes to one-partition topics, so concurrent publishers meet
//! on one counter row: the bus shares one transaction among them (group
//! commit); the raw reference commits each record on its own.

#![allow(clippy::unwrap_used, clippy::cast_precision_loss)]

use std::time::{Duration, Instant};

use bus_bench::postgres::RawConn;
use bus_core::{
    BatchRecord, EventBus, EventBusExt, Manifest, Selector, StartAt, SubscribeOptions, TopicSpec,
};
use bus_postgres::{PostgresBus, PostgresOptions};
use futures::StreamExt;
use serde_json::json;
use tokio_postgres::{AsyncMessage, NoTls};

const THREADS: usize = 16;
const BATCH: usize = 100;

fn value(n: usize) -> serde_json::Value {
    json!({"n": n, "agent": "agent-1", "kind": "audit", "pad": "x".repeat(100)})
}

fn record(n: usize, prefix: &str) -> (String, Option<String>, serde_json::Value) {
    (format!("k{n}"), Some(format!("{prefix}-{n}")), value(n))
}

struct Row {
    phase: &'static str,
    unit: &'static str,
    bus: f64,
    raw: f64,
}

fn per_s(count: usize, took: Duration) -> f64 {
    count as f64 / took.as_secs_f64().max(1e-9)
}

fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort_unstable();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

fn main() {
    let url = std::env::var("BUS_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://bus:bus@127.0.0.1:5433/bus".to_owned());
    let records: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    let schema = format!("bench_{}", std::process::id());
    let options = PostgresOptions::from_url(&url).unwrap().schema(&schema);
    let bus = PostgresBus::connect_with(options.clone()).unwrap();
    let names = [
        "serial",
        "concurrent",
        "batch",
        "raw-serial",
        "raw-concurrent",
        "raw-batch",
    ];
    bus.provision(&Manifest::new(names.map(|n| TopicSpec::new(n, 1))))
        .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let conn = |topic: &str| runtime.block_on(RawConn::connect(&options, topic)).unwrap();
    let mut rows = Vec::new();

    // Serial publish.
    let started = Instant::now();
    for n in 0..records {
        bus.publish_idempotent("serial", &format!("k{n}"), &value(n), &format!("s-{n}"))
            .unwrap();
    }
    let bus_serial = per_s(records, started.elapsed());
    let mut raw = conn("raw-serial");
    let raw_serial = runtime.block_on(async {
        let started = Instant::now();
        for n in 0..records {
            raw.append(&[record(n, "s")], "bench_raw").await.unwrap();
        }
        per_s(records, started.elapsed())
    });
    rows.push(Row {
        phase: "serial publish",
        unit: "rec/s",
        bus: bus_serial,
        raw: raw_serial,
    });

    // 16 threads publishing to one partition.
    let per_thread = records / THREADS;
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let bus = &bus;
            scope.spawn(move || {
                for i in 0..per_thread {
                    let n = t * per_thread + i;
                    bus.publish_idempotent(
                        "concurrent",
                        &format!("k{n}"),
                        &value(n),
                        &format!("c-{n}"),
                    )
                    .unwrap();
                }
            });
        }
    });
    let bus_concurrent = per_s(per_thread * THREADS, started.elapsed());
    let conns: Vec<RawConn> = (0..THREADS).map(|_| conn("raw-concurrent")).collect();
    let raw_concurrent = runtime.block_on(async {
        let started = Instant::now();
        let tasks: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(t, mut raw)| {
                tokio::spawn(async move {
                    for i in 0..per_thread {
                        raw.append(&[record(t * per_thread + i, "c")], "bench_raw")
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        per_s(per_thread * THREADS, started.elapsed())
    });
    rows.push(Row {
        phase: "16-thread publish",
        unit: "rec/s",
        bus: bus_concurrent,
        raw: raw_concurrent,
    });

    // Batches of 100.
    let batches = records / BATCH;
    let started = Instant::now();
    for b in 0..batches {
        let batch: Vec<_> = (b * BATCH..(b + 1) * BATCH)
            .map(|n| BatchRecord::new(format!("k{n}"), value(n)).with_uid(format!("b-{n}")))
            .collect();
        bus.publish_batch("batch", &batch).unwrap();
    }
    let bus_batch = per_s(batches * BATCH, started.elapsed());
    let mut raw = conn("raw-batch");
    let raw_batch = runtime.block_on(async {
        let started = Instant::now();
        for b in 0..batches {
            let batch: Vec<_> = (b * BATCH..(b + 1) * BATCH)
                .map(|n| record(n, "b"))
                .collect();
            raw.append(&batch, "bench_raw").await.unwrap();
        }
        per_s(batches * BATCH, started.elapsed())
    });
    rows.push(Row {
        phase: "batch publish (100)",
        unit: "rec/s",
        bus: bus_batch,
        raw: raw_batch,
    });

    // Replay of the serial topic, pages of 500.
    let started = Instant::now();
    let replayed = bus.fetch_all("serial", 0, 0, 500).unwrap().len();
    let bus_replay = per_s(replayed, started.elapsed());
    let mut raw = conn("serial");
    let raw_replay = runtime.block_on(async {
        let started = Instant::now();
        let (mut from, mut total) = (0, 0);
        loop {
            let (next, count) = raw.fetch(from, 500).await.unwrap();
            if count == 0 {
                break;
            }
            (from, total) = (next, total + count);
        }
        per_s(total, started.elapsed())
    });
    rows.push(Row {
        phase: "replay (pages of 500)",
        unit: "rec/s",
        bus: bus_replay,
        raw: raw_replay,
    });

    // Find by UID.
    let lookups = records.min(1_000);
    let started = Instant::now();
    for n in 0..lookups {
        let found = bus
            .find_event_by_uid("serial", &format!("k{n}"), &format!("s-{n}"))
            .unwrap();
        assert!(found.is_some());
    }
    let bus_find = per_s(lookups, started.elapsed());
    let raw_find = runtime.block_on(async {
        let started = Instant::now();
        for n in 0..lookups {
            assert!(raw.find(&format!("s-{n}")).await.unwrap());
        }
        per_s(lookups, started.elapsed())
    });
    rows.push(Row {
        phase: "find by UID",
        unit: "lookups/s",
        bus: bus_find,
        raw: raw_find,
    });

    // Delivery latency: another bus publishes, the subscriber's recv returns it.
    let samples = 200;
    let mut subscription = bus
        .subscribe(
            "batch",
            Selector::Partition(0),
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .unwrap();
    let publisher = PostgresBus::connect_with(options.clone()).unwrap();
    let mut latencies = Vec::new();
    for n in 0..samples {
        let started = Instant::now();
        publisher.publish("batch", "lat", &value(n)).unwrap();
        let item = subscription.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(item.is_some());
        latencies.push(started.elapsed());
    }
    let bus_latency = median(latencies);
    let mut writer = conn("raw-batch");
    let mut reader = conn("raw-batch");
    let raw_latency = runtime.block_on(async {
        let (listener, mut connection) = options.config.connect(NoTls).await.unwrap();
        let (notes, mut received) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(_) = message {
                    let _ = notes.send(());
                }
            }
        });
        listener
            .batch_execute("LISTEN bench_latency")
            .await
            .unwrap();
        let mut latencies = Vec::new();
        for n in 0..samples {
            let started = Instant::now();
            let offset = writer
                .append(&[record(1_000_000 + n, "l")], "bench_latency")
                .await
                .unwrap();
            received.recv().await.unwrap();
            // Like the bus: the notification is a wake-up; read the record.
            let (_, count) = reader.fetch(offset, 500).await.unwrap();
            assert!(count > 0);
            latencies.push(started.elapsed());
        }
        drop(listener);
        median(latencies)
    });
    rows.push(Row {
        phase: "subscription delivery p50",
        unit: "us",
        bus: bus_latency,
        raw: raw_latency,
    });

    println!(
        "bus-postgres vs raw tokio-postgres, same SQL, same run ({records} records, one partition, {THREADS} threads)"
    );
    println!("| phase | unit | bus-postgres | raw tokio-postgres | bus / raw |");
    println!("|---|---|---:|---:|---:|");
    for row in &rows {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.2} |",
            row.phase,
            row.unit,
            row.bus,
            row.raw,
            row.bus / row.raw
        );
    }
    println!(
        "16-thread / serial publish on bus-postgres: {:.1}x (raw: {:.1}x)",
        bus_concurrent / bus_serial,
        raw_concurrent / raw_serial
    );
    drop(subscription);
    drop(publisher);
    drop(bus);
    runtime.block_on(async {
        let (client, connection) = options.config.connect(NoTls).await.unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .await
            .unwrap();
    });
}
