//! Kafka's positioned read and lone-record publish, the bus beside raw
//! rdkafka in the same run (issue #32).
//!
//! ```text
//! cargo run --release -p bus-bench --features kafka --example bench_kafka_point -- \
//!     [--brokers H:P] [--records N] [--reads N] [--serial N] [--rounds N]
//! ```
//! - `fetch(offset, 1)` at random offsets of a filled partition: the bus,
//!   and one raw consumer assigned once that seeks and polls per read;
//!   blocks of reads alternate between the two; p50 / p99 of each.
//! - serial publish (one record, wait for its ack): the bus and raw
//!   rdkafka at `linger.ms` 0 and 1, and the bus's batch of 10,000 at
//!   both; rounds alternating, the best round counts.
//!
//! Experiments: `BENCH_BUS_KAFKA_SET` and `BENCH_RAW_KAFKA_SET` hold
//! librdkafka settings (`name=value,...`) for the bus's clients and the raw
//! point reader.
//!
//! The broker comes from `--brokers`, else `BUS_KAFKA_BROKERS`, else
//! 127.0.0.1:9092. Prints the load average before and after (the machine
//! may be shared: read the ratios, not the rates).

use std::time::{Duration, Instant};

use bus_bench::kafka::{RawKafka, RawPointReader};
use bus_core::{BatchRecord, EventBus, Manifest, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions};
use serde_json::{Value, json};

struct Args {
    brokers: String,
    records: usize,
    reads: usize,
    serial: usize,
    rounds: usize,
}

fn args() -> Args {
    let mut out = Args {
        brokers: std::env::var("BUS_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into()),
        records: 20_000,
        reads: 1_000,
        serial: 300,
        rounds: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_default();
        let number = |default: usize| value.parse().unwrap_or(default);
        match flag.as_str() {
            "--brokers" => out.brokers = value,
            "--records" => out.records = number(out.records).max(1),
            "--reads" => out.reads = number(out.reads).max(100),
            "--serial" => out.serial = number(out.serial),
            "--rounds" => out.rounds = number(out.rounds).max(1),
            other => panic!("unknown flag {other}"),
        }
    }
    out
}

fn event(i: usize) -> Value {
    json!({"seq": i, "agent": "agent-1", "kind": "heartbeat", "body": "x".repeat(140)})
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// A small LCG: the same offsets on every run.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

fn percentile(sorted: &[Duration], p: usize) -> f64 {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)].as_secs_f64() * 1e6
}

fn main() {
    let args = args();
    println!("load average at start: {}", load());
    let id = uuid::Uuid::new_v4().simple().to_string();
    let manifest_topic = format!("bus-bench-manifest-{}", &id[..8]);
    let mut options =
        KafkaOptions::new([args.brokers.clone()]).manifest_topic(manifest_topic.clone());
    // Experiments: librdkafka settings for the bus's clients, `name=value,...`.
    for pair in std::env::var("BENCH_BUS_KAFKA_SET")
        .unwrap_or_default()
        .split(',')
    {
        if let Some((name, value)) = pair.split_once('=') {
            options = options.rdkafka(name, value);
        }
    }
    let bus = KafkaBus::connect_with(options.clone()).unwrap_or_else(|e| panic!("connect: {e}"));
    let (read_topic, serial_topic) = (
        format!("point-{}", &id[..8]),
        format!("serial-{}", &id[..8]),
    );
    bus.provision(&Manifest::new([
        TopicSpec::new(read_topic.clone(), 1),
        TopicSpec::new(serial_topic.clone(), 1),
    ]))
    .unwrap_or_else(|e| panic!("provision: {e}"));

    // Positioned reads.
    let records: Vec<BatchRecord> = (0..args.records)
        .map(|i| BatchRecord::new("agent-1", event(i)))
        .collect();
    for chunk in records.chunks(10_000) {
        bus.publish_batch(&read_topic, chunk)
            .unwrap_or_else(|e| panic!("fill: {e}"));
    }
    let raw_reader = RawPointReader::new(&args.brokers, &read_topic)
        .unwrap_or_else(|e| panic!("raw reader: {e}"));
    let n = u64::try_from(args.records).unwrap_or(u64::MAX);
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut rng = Lcg(42);
    // Warm-up of both (uncounted): connections, metadata, first fetch.
    for _ in 0..20 {
        let at = rng.below(n);
        bus.fetch(&read_topic, 0, at, 1)
            .unwrap_or_else(|e| panic!("fetch: {e}"));
        raw_reader
            .read(at)
            .unwrap_or_else(|e| panic!("raw read: {e}"));
    }
    for _ in 0..args.reads / 50 {
        for _ in 0..50 {
            let at = rng.below(n);
            let started = Instant::now();
            let got = bus
                .fetch(&read_topic, 0, at, 1)
                .unwrap_or_else(|e| panic!("fetch: {e}"));
            ours.push(started.elapsed());
            assert_eq!(got.len(), 1, "one record at {at}");
            assert_eq!(got[0].offset, at);
        }
        for _ in 0..50 {
            let at = rng.below(n);
            let started = Instant::now();
            let value = raw_reader
                .read(at)
                .unwrap_or_else(|e| panic!("raw read: {e}"));
            theirs.push(started.elapsed());
            std::hint::black_box(value);
        }
    }
    ours.sort();
    theirs.sort();
    println!();
    println!(
        "{:<44} {:>10} {:>10} {:>7}",
        "fetch(offset, 1), random offset", "p50 µs", "p99 µs", "reads"
    );
    let rows = [
        ("bus-kafka", &ours),
        ("raw rdkafka (assigned once, seek + poll)", &theirs),
    ];
    for (name, sorted) in rows {
        println!(
            "{name:<44} {:>10.0} {:>10.0} {:>7}",
            percentile(sorted, 50),
            percentile(sorted, 99),
            sorted.len()
        );
    }
    println!(
        "{:<44} {:>10.2} {:>10.2}",
        "ratio bus / raw",
        percentile(&ours, 50) / percentile(&theirs, 50),
        percentile(&ours, 99) / percentile(&theirs, 99)
    );

    // Serial publish: the bus and raw rdkafka, each at linger.ms 0 and 1;
    // and the bus's batch publish at both (a linger must not cost batches).
    let lingers = [0u32, 1];
    let buses: Vec<KafkaBus> = lingers
        .iter()
        .map(|&ms| {
            KafkaBus::connect_with(options.clone().linger(Duration::from_millis(u64::from(ms))))
                .unwrap_or_else(|e| panic!("connect: {e}"))
        })
        .collect();
    let raw: Vec<RawKafka> = lingers
        .iter()
        .map(|&ms| {
            RawKafka::with_linger(&args.brokers, &serial_topic, ms)
                .unwrap_or_else(|e| panic!("raw: {e}"))
        })
        .collect();
    let events: Vec<Value> = (0..args.serial).map(event).collect();
    let batch: Vec<BatchRecord> = (0..10_000)
        .map(|i| BatchRecord::new("agent-1", event(i)))
        .collect();
    // bus 0, bus 1, raw 0, raw 1, bus batch 0, bus batch 1
    let mut best = [0f64; 6];
    let per_s = |n: usize, started: Instant| n as f64 / started.elapsed().as_secs_f64();
    for _ in 0..args.rounds {
        for (i, bus) in buses.iter().enumerate() {
            let started = Instant::now();
            for value in &events {
                bus.publish(&serial_topic, "agent-1", value)
                    .unwrap_or_else(|e| panic!("publish: {e}"));
            }
            best[i] = best[i].max(per_s(args.serial, started));
        }
        for (i, raw) in raw.iter().enumerate() {
            let started = Instant::now();
            raw.serial(&events)
                .unwrap_or_else(|e| panic!("raw serial: {e}"));
            best[2 + i] = best[2 + i].max(per_s(args.serial, started));
        }
        for (i, bus) in buses.iter().enumerate() {
            let started = Instant::now();
            bus.publish_batch(&serial_topic, &batch)
                .unwrap_or_else(|e| panic!("batch: {e}"));
            best[4 + i] = best[4 + i].max(per_s(batch.len(), started));
        }
    }
    println!();
    println!(
        "{:<44} {:>10} {:>10}",
        "publish (best of rounds)", "rec/s", "µs/rec"
    );
    for (name, rate) in [
        ("serial: bus-kafka linger.ms=0", best[0]),
        ("serial: bus-kafka linger.ms=1", best[1]),
        ("serial: raw rdkafka linger.ms=0", best[2]),
        ("serial: raw rdkafka linger.ms=1", best[3]),
        ("batch of 10,000: bus-kafka linger.ms=0", best[4]),
        ("batch of 10,000: bus-kafka linger.ms=1", best[5]),
    ] {
        println!("{name:<44} {rate:>10.0} {:>10.1}", 1e6 / rate);
    }
    println!();
    println!("load average at end: {}", load());
    println!(
        "{}",
        json!({
            "point_read_us": {
                "bus": {"p50": percentile(&ours, 50), "p99": percentile(&ours, 99)},
                "raw": {"p50": percentile(&theirs, 50), "p99": percentile(&theirs, 99)},
            },
            "serial": {"bus_linger0": best[0], "bus_linger1": best[1],
                       "raw_linger0": best[2], "raw_linger1": best[3]},
            "batch": {"bus_linger0": best[4], "bus_linger1": best[5]},
        })
    );
    let _ = bus.delete_topics(&[read_topic, serial_topic]);
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &args.brokers)
            .create()
            .unwrap_or_else(|e| panic!("admin: {e}"));
    let _ = raw[0].block_on(admin.delete_topics(
        &[manifest_topic.as_str()],
        &rdkafka::admin::AdminOptions::new(),
    ));
}
