//! Benchmark: durable consumers of bus-nats beside the raw async-nats
//! client doing the same with a JetStream durable pull consumer (issue #28).
//!
//! ```text
//! BUS_NATS_URL=nats://127.0.0.1:4222 cargo run --release -p bus-bench --features nats \
//!     --example bench_consumer_nats -- [--records N]
//! ```
//!
//! One topic of one partition (one stream) holding N records of ~120 bytes,
//! published once; then, per row, a fresh consumer reads all N from the
//! beginning:
//!
//! - bus: `consume` with `ack_every(1)` (each ack a KV compare-and-set the
//!   server acknowledged before `ack` returns), `ack_every(100)` and
//!   `ack_every(1000)` (an ack per record, a durable write per 100 / 1,000,
//!   then `flush`);
//! - raw: a durable pull consumer on the same stream. Per record:
//!   `AckPolicy::Explicit`, each message acked with `double_ack` (the
//!   server confirms the ack, the same promise as the bus's durable ack).
//!   Per batch: `AckPolicy::All`, the last message of each batch of 100 /
//!   1,000 acked with `double_ack`.
//!
//! - the bus's durable write alone: N KV compare-and-set updates by the
//!   raw client, one after the other (what `ack_every(1)` adds per record);
//! - reading only, for reference: the bus's subscription under a consumer
//!   that never acks, beside a raw consumer with `AckPolicy::None`.
//!
//! The raw side decodes each payload as JSON (the bus hands out decoded
//! values). Not the same promise, which the numbers show: the bus's durable
//! write is a KV publish the server stores (fsynced before its ack under
//! `sync_interval: always`); a JetStream ack updates the consumer's state,
//! which the server does not fsync per ack.
//!
//! Printed per row: records/s for the bus and for the raw client, and the
//! ratio bus/raw (issue target ≥ 0.9). Speed is printed, never asserted.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    missing_docs
)]

use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{AckPolicy, pull};
use bus_core::consumer::{ConsumeOptions, DurableConsumers};
use bus_core::{BatchRecord, EventBus, Manifest, Selector, StartAt, TopicSpec};
use bus_nats::naming::stream_name;
use bus_nats::{NatsBus, NatsOptions};
use futures::StreamExt;
use serde_json::json;

const TOPIC: &str = "jobs";

fn bus_consume(bus: &NatsBus, records: u64, every: u32) -> Duration {
    let name = format!("bus-{every}");
    let options = ConsumeOptions::default().ack_every(every.max(1));
    let mut consumer = bus
        .consume(TOPIC, &name, Selector::Topic, StartAt::Beginning, options)
        .unwrap();
    let started = Instant::now();
    for _ in 0..records {
        let delivery = consumer
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .expect("a record within 10 s");
        if every > 0 {
            consumer.ack(&delivery).unwrap();
        }
    }
    consumer.flush().unwrap();
    let took = started.elapsed();
    drop(consumer);
    bus.delete_consumer(TOPIC, &name).unwrap();
    took
}

async fn raw_consume(
    js: &async_nats::jetstream::Context,
    stream: &str,
    records: u64,
    every: u64,
) -> Duration {
    let name = format!("raw-{every}");
    let stream = js.get_stream(stream).await.unwrap();
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(name.clone()),
            ack_policy: match every {
                0 => AckPolicy::None,
                1 => AckPolicy::Explicit,
                _ => AckPolicy::All,
            },
            ..pull::Config::default()
        })
        .await
        .unwrap();
    let started = Instant::now();
    let mut messages = consumer.messages().await.unwrap();
    let mut seen = 0u64;
    while seen < records {
        let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("a record within 10 s")
            .unwrap()
            .unwrap();
        seen += 1;
        // Decoded as the bus decodes every record, so both sides hand the
        // caller a value.
        let value: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
        std::hint::black_box(value);
        if every > 0 && (seen.is_multiple_of(every) || seen == records) {
            message.double_ack().await.unwrap();
        }
    }
    let took = started.elapsed();
    drop(messages);
    stream.delete_consumer(&name).await.unwrap();
    took
}

/// The bus's durable write alone, by the raw client: `records` KV
/// compare-and-set updates of one key, one after the other.
async fn raw_kv_updates(
    js: &async_nats::jetstream::Context,
    prefix: &str,
    records: u64,
) -> Duration {
    let bucket = format!("{prefix}_rawkv");
    let kv = js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: bucket.clone(),
            history: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    let value = vec![b'x'; 200];
    let mut revision = kv.put("cursor", value.clone().into()).await.unwrap();
    let started = Instant::now();
    for _ in 0..records {
        revision = kv
            .update("cursor", value.clone().into(), revision)
            .await
            .unwrap();
    }
    let took = started.elapsed();
    js.delete_key_value(&bucket).await.unwrap();
    took
}

fn main() {
    let mut records: u64 = 2_000;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--records" => records = args.next().unwrap().parse().unwrap(),
            other => panic!("unknown argument {other}"),
        }
    }
    let url = std::env::var("BUS_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let prefix = format!("bcn{}", std::process::id());
    let options = NatsOptions::from_url(&url).unwrap().prefix(prefix.clone());
    let servers = options.servers.clone();
    let bus = NatsBus::connect_with(options).unwrap();
    bus.provision(&Manifest::new([TopicSpec::new(TOPIC, 1)]))
        .unwrap();
    let batch: Vec<BatchRecord> = (0..records)
        .map(|i| BatchRecord::new("k", json!({"i": i, "pad": "x".repeat(100)})))
        .collect();
    for chunk in batch.chunks(500) {
        bus.publish_batch(TOPIC, chunk).unwrap();
    }
    let stream = stream_name(&prefix, TOPIC, 0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let js = runtime.block_on(async {
        async_nats::jetstream::new(async_nats::connect(servers).await.unwrap())
    });

    let mut rows = Vec::new();
    for (label, every) in [
        ("ack per record", 1u32),
        ("durable ack per 100", 100),
        ("durable ack per 1,000", 1_000),
        ("no ack (reading only)", 0),
    ] {
        let bus_took = bus_consume(&bus, records, every);
        let raw_took = runtime.block_on(raw_consume(&js, &stream, records, u64::from(every)));
        rows.push((label, bus_took, raw_took));
    }

    let kv_took = runtime.block_on(raw_kv_updates(&js, &prefix, records));
    println!(
        "nats, {records} records of ~120 bytes, one partition, consumed from the beginning; \
         raw = async-nats durable pull consumer, double_ack"
    );
    println!(
        "{:<24} {:>12} {:>12} {:>10}",
        "acknowledgement", "bus rec/s", "raw rec/s", "bus/raw"
    );
    for (label, bus_took, raw_took) in rows {
        let bus_rate = records as f64 / bus_took.as_secs_f64();
        let raw_rate = records as f64 / raw_took.as_secs_f64();
        println!(
            "{label:<24} {bus_rate:>12.0} {raw_rate:>12.0} {:>10.2}",
            bus_rate / raw_rate
        );
    }
    println!(
        "the bus's durable write alone (raw KV compare-and-set, one after the other): {:.0}/s",
        records as f64 / kv_took.as_secs_f64()
    );

    runtime.block_on(async {
        let mut names = js.stream_names();
        let mut ours = Vec::new();
        while let Some(Ok(name)) = names.next().await {
            if name.starts_with(&format!("{prefix}_"))
                || name == format!("KV_{}", bus_nats::naming::consumer_bucket(&prefix))
            {
                ours.push(name);
            }
        }
        for name in ours {
            let _ = js.delete_stream(&name).await;
        }
    });
}
