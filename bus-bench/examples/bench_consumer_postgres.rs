//! Benchmark: a durable consumer on PostgreSQL beside the raw tokio-postgres
//! client doing the same work (issue #28).
//!
//! ```text
//! BUS_POSTGRES_URL=postgres://bus:bus@127.0.0.1:5433/bus \
//!   cargo run --release -p bus-bench --features postgres --example bench_consumer_postgres -- \
//!   [--records N] [--runs R]
//! ```
//!
//! One topic of one partition holding N records (default 5,000). Each row
//! consumes all of them from the start under a new name, with a durable
//! cursor write per record, per 100 and per 1,000 records:
//!
//! - bus: `consume` with `ack_every(n)`, `ack` per delivery, `flush` at the
//!   end (the cursor row is a compare-and-set on its owner, C23);
//! - raw: one tokio-postgres connection running the bus's own fetch
//!   statement in pages of 100 (the records decoded, as the bus does) and,
//!   per n records, `UPDATE cursor SET next = $1 WHERE name = $2 AND owner =
//!   $3` (the same compare-and-set on a bigint, not a JSON state).
//!
//! Each pair runs R times (default 3), bus and raw alternating, and the
//! best of each is printed: records/s and the ratio bus/raw (target ≥ 0.9).

#![allow(clippy::unwrap_used, clippy::cast_precision_loss, missing_docs)]

use std::time::{Duration, Instant};

use bus_bench::postgres::RawConn;
use bus_core::consumer::{ConsumeOptions, DurableConsumers};
use bus_core::{EventBus, Manifest, Selector, StartAt, TopicSpec};
use bus_postgres::{PostgresBus, PostgresOptions};
use serde_json::json;

const TOPIC: &str = "jobs";
const PAGE: i64 = 100;

fn bus_consume(bus: &PostgresBus, name: &str, records: u64, every: u32) -> Duration {
    let started = Instant::now();
    let options = ConsumeOptions::default().ack_every(every);
    let mut consumer = bus
        .consume(TOPIC, name, Selector::Topic, StartAt::Beginning, options)
        .unwrap();
    for _ in 0..records {
        let delivery = consumer
            .recv_timeout(Duration::from_secs(30))
            .unwrap()
            .expect("a delivery");
        consumer.ack(&delivery).unwrap();
    }
    consumer.flush().unwrap();
    let took = started.elapsed();
    assert_eq!(consumer.cursor(), vec![(0, records)]);
    took
}

async fn raw_consume(
    raw: &mut RawConn,
    table: &str,
    name: &str,
    records: u64,
    every: u64,
) -> Duration {
    let started = Instant::now();
    let owner: i64 = 7;
    raw.client()
        .execute(
            &format!("INSERT INTO {table} (name, next, owner) VALUES ($1, 0, $2)"),
            &[&name, &owner],
        )
        .await
        .unwrap();
    let update = raw
        .client()
        .prepare(&format!(
            "UPDATE {table} SET next = $1 WHERE name = $2 AND owner = $3"
        ))
        .await
        .unwrap();
    let (mut from, mut done, mut since) = (0i64, 0u64, 0u64);
    while done < records {
        let (next, count) = raw.fetch(from, PAGE).await.unwrap();
        assert!(count > 0, "the raw reader ran out at {from}");
        for offset in from..next {
            since += 1;
            if since == every {
                let cursor = offset + 1;
                let updated = raw
                    .client()
                    .execute(&update, &[&cursor, &name, &owner])
                    .await
                    .unwrap();
                assert_eq!(updated, 1);
                since = 0;
            }
        }
        (from, done) = (next, done + count as u64);
    }
    if since > 0 {
        raw.client()
            .execute(&update, &[&from, &name, &owner])
            .await
            .unwrap();
    }
    started.elapsed()
}

fn main() {
    let mut records: u64 = 5_000;
    let mut runs = 3;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--records" => records = args.next().unwrap().parse().unwrap(),
            "--runs" => runs = args.next().unwrap().parse().unwrap(),
            other => panic!("unknown argument {other}"),
        }
    }
    let url = std::env::var("BUS_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://bus:bus@127.0.0.1:5433/bus".to_owned());
    let schema = format!("bench_consumer_{}", std::process::id());
    let options = PostgresOptions::from_url(&url).unwrap().schema(&schema);
    let bus = PostgresBus::connect_with(options.clone()).unwrap();
    bus.provision(&Manifest::new([TopicSpec::new(TOPIC, 1)]))
        .unwrap();
    let values: Vec<_> = (0..records)
        .map(|i| {
            (
                "k".to_owned(),
                None,
                json!({"i": i, "agent": "agent-1", "kind": "audit", "pad": "x".repeat(100)}),
            )
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let table = format!("\"{schema}\".raw_cursors");
    let mut raw = runtime.block_on(async {
        let raw = RawConn::connect(&options, TOPIC).await.unwrap();
        raw.client()
            .batch_execute(&format!(
                "CREATE TABLE {table} (name text PRIMARY KEY, next bigint NOT NULL, owner bigint)"
            ))
            .await
            .unwrap();
        raw
    });
    for chunk in values.chunks(1_000) {
        let batch: Vec<_> = chunk
            .iter()
            .map(|(key, uid, value)| bus_core::BatchRecord {
                key: key.clone(),
                uid: uid.clone(),
                value: value.clone(),
            })
            .collect();
        bus.publish_batch(TOPIC, &batch).unwrap();
    }

    println!(
        "durable consumer on PostgreSQL, {records} records of one partition, best of {runs} runs"
    );
    println!();
    println!("| durable cursor write | bus records/s | raw records/s | bus / raw |");
    println!("|---|---|---|---|");
    for every in [1u32, 100, 1_000] {
        let (mut bus_best, mut raw_best) = (Duration::MAX, Duration::MAX);
        for run in 0..runs {
            let bus_took = bus_consume(&bus, &format!("bus-{every}-{run}"), records, every);
            let raw_took = runtime.block_on(raw_consume(
                &mut raw,
                &table,
                &format!("raw-{every}-{run}"),
                records,
                u64::from(every),
            ));
            bus_best = bus_best.min(bus_took);
            raw_best = raw_best.min(raw_took);
        }
        let rate = |took: Duration| records as f64 / took.as_secs_f64();
        let label = match every {
            1 => "per record".to_owned(),
            n => format!("per {n} records"),
        };
        println!(
            "| {label} | {:.0} | {:.0} | {:.2} |",
            rate(bus_best),
            rate(raw_best),
            rate(bus_best) / rate(raw_best)
        );
    }
    let _ = runtime.block_on(async {
        raw.client()
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .await
    });
}
