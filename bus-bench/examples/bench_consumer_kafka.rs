//! Benchmark: durable consumers on Kafka beside the raw rdkafka client
//! doing the same work (issue #28).
//!
//! ```text
//! BUS_KAFKA_BROKERS=127.0.0.1:9092 cargo run --release -p bus-bench --features kafka \
//!     --example bench_consumer_kafka -- [--records N]
//! ```
//!
//! One topic of one partition, N records published first. Per row, both
//! sides consume all N records from the start and acknowledge them:
//!
//! - bus: `consume` with `ack_every(n)` (n = 1, 100, 1,000), `ack` per
//!   record, `flush` at the end: each durable write is one transaction of
//!   the consumer's transactional producer on the cursor topic;
//! - raw: a `BaseConsumer` of a fresh group, assigned the partition, and a
//!   synchronous `commit` of the next offset every n records (the group
//!   offset commit a plain Kafka consumer would use; no fencing, no
//!   out-of-order acks, no delivery counts).
//!
//! Opening the consumer (for the bus: taking ownership, reading the cursor
//! topic) and waiting for the first record are outside the timed part on
//! both sides: the clock starts when the first record is in hand. Printed: records/s per
//! side and the ratio bus/raw (wall time).
#![allow(clippy::unwrap_used, clippy::cast_precision_loss, missing_docs)]

use std::time::{Duration, Instant};

use bus_core::consumer::{ConsumeOptions, DurableConsumers};
use bus_core::{EventBus, Manifest, Selector, StartAt, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions, kafka_topic_name};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::json;

fn main() {
    let mut records: u64 = 2_000;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--records" => records = args.next().unwrap().parse().unwrap(),
            other => panic!("unknown argument {other}"),
        }
    }
    let brokers = std::env::var("BUS_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let manifest = format!("bus-bench-consumer-{}", uuid::Uuid::new_v4().simple());
    let options =
        KafkaOptions::new(brokers.split(',').map(str::to_owned)).manifest_topic(manifest.clone());
    let bus = KafkaBus::connect_with(options).unwrap();
    // A topic name of this run's own: a bus topic is the Kafka topic of the
    // same name whatever the manifest, so a fixed name would be shared with
    // (and deleted under) any other run on the broker.
    let topic = format!("bench-jobs-{}", uuid::Uuid::new_v4().simple());
    let topic = topic.as_str();
    bus.provision(&Manifest::new([TopicSpec::new(topic, 1)]))
        .unwrap();
    let batch: Vec<bus_core::BatchRecord> = (0..records)
        .map(|i| bus_core::BatchRecord {
            key: "k".to_owned(),
            value: json!({"i": i, "pad": "x".repeat(100)}),
            uid: None,
        })
        .collect();
    for chunk in batch.chunks(500) {
        bus.publish_batch(topic, chunk).unwrap();
    }

    println!("kafka, {records} records of ~120 bytes, one partition, broker {brokers}");
    println!(
        "{:<26} {:>12} {:>12} {:>12} {:>10}",
        "ack", "bus rec/s", "raw rec/s", "bus µs/rec", "bus/raw"
    );
    for every in [1u32, 100, 1_000] {
        let bus_took = bus_side(&bus, topic, every, records);
        let raw_took = raw_side(&brokers, &kafka_topic_name(topic), every, records);
        let bus_rate = records as f64 / bus_took.as_secs_f64();
        let raw_rate = records as f64 / raw_took.as_secs_f64();
        let label = if every == 1 {
            "durable per record".to_owned()
        } else {
            format!("durable per {every} records")
        };
        println!(
            "{label:<26} {bus_rate:>12.0} {raw_rate:>12.0} {:>12.1} {:>10.2}",
            bus_took.as_secs_f64() * 1e6 / records as f64,
            bus_rate / raw_rate
        );
    }
    let _ = bus.delete_topics(&bus.topics());
    let raw = [manifest, bus.cursor_topic()];
    delete_raw(&brokers, &raw);
}

fn bus_side(bus: &KafkaBus, topic: &str, every: u32, records: u64) -> Duration {
    let options = ConsumeOptions::default().ack_every(every);
    let name = format!("bench-{every}");
    let mut consumer = bus
        .consume(topic, &name, Selector::Topic, StartAt::Beginning, options)
        .unwrap();
    // The clock starts at the first record on both sides, so neither
    // side's start-up (connecting, the first fetch) is counted.
    let mut delivery = consumer
        .recv_timeout(Duration::from_secs(30))
        .unwrap()
        .unwrap();
    let started = Instant::now();
    for n in 0..records {
        consumer.ack(&delivery).unwrap();
        if n + 1 < records {
            delivery = consumer
                .recv_timeout(Duration::from_secs(30))
                .unwrap()
                .unwrap();
        }
    }
    consumer.flush().unwrap();
    started.elapsed()
}

fn raw_side(brokers: &str, kafka_topic: &str, every: u32, records: u64) -> Duration {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "group.id",
            format!("bench-raw-{}", uuid::Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("fetch.wait.max.ms", "10")
        .create()
        .unwrap();
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(kafka_topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&list).unwrap();
    let mut first = Some(
        consumer
            .poll(Duration::from_secs(30))
            .expect("raw consumer: no first record in 30 s")
            .unwrap()
            .offset(),
    );
    let started = Instant::now();
    let mut seen = 0u64;
    let mut since = 0u32;
    let mut last = 0i64;
    while seen < records {
        last = match first.take() {
            Some(offset) => offset,
            None => {
                let Some(message) = consumer.poll(Duration::from_secs(30)) else {
                    panic!("raw consumer: nothing for 30 s at {seen}");
                };
                message.unwrap().offset()
            }
        };
        seen += 1;
        since += 1;
        if since >= every {
            commit(&consumer, kafka_topic, last);
            since = 0;
        }
    }
    if since > 0 {
        commit(&consumer, kafka_topic, last);
    }
    started.elapsed()
}

fn commit(consumer: &BaseConsumer, kafka_topic: &str, offset: i64) {
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(kafka_topic, 0, Offset::Offset(offset + 1))
        .unwrap();
    consumer.commit(&list, CommitMode::Sync).unwrap();
}

fn delete_raw(brokers: &str, topics: &[String]) {
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()
            .unwrap();
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _ = runtime.block_on(admin.delete_topics(&names, &rdkafka::admin::AdminOptions::new()));
}
