//! bus-kafka against raw rdkafka doing the same work on the same broker.
//!
//! ```text
//! cargo run --release -p bus-bench --features kafka --example bench_kafka -- \
//!     [--brokers H:P] [--serial N] [--batch N] [--rounds N] [--broker-pid PID] [--flush]
//! ```
//! Each workload runs `--rounds` times, bus and raw interleaved, and the
//! best round of each side counts (the machine may be shared). Prints a
//! table and one JSON line. The broker comes from `--brokers`, else
//! `BUS_KAFKA_BROKERS`, else 127.0.0.1:9092. `--flush` adds a bus with
//! `flush_each_message` (its topic created with `flush.messages=1`: an
//! fsync per produce request before the ack) to the same rounds, and a
//! second table: its serial and batch rates beside the default bus's.

use std::time::{Duration, Instant};

use bus_bench::kafka::RawKafka;
use bus_conformance::util::steal_ticks;
use bus_core::{BatchRecord, EventBus, Manifest, StoredEvent, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions};
use serde_json::{Value, json};

const PAGE: usize = 1_000;

struct Args {
    brokers: String,
    serial: usize,
    batch: usize,
    rounds: usize,
    broker_pid: Option<u32>,
    flush: bool,
}

fn args() -> Args {
    let mut out = Args {
        brokers: std::env::var("BUS_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into()),
        serial: 1_000,
        batch: 30_000,
        rounds: 3,
        broker_pid: None,
        flush: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--flush" {
            out.flush = true;
            continue;
        }
        let value = it.next().unwrap_or_default();
        let number = |default: usize| value.parse().unwrap_or(default);
        match flag.as_str() {
            "--brokers" => out.brokers = value,
            "--serial" => out.serial = number(out.serial),
            "--batch" => out.batch = number(out.batch),
            "--rounds" => out.rounds = number(out.rounds).max(1),
            "--broker-pid" => out.broker_pid = value.parse().ok(),
            other => panic!("unknown flag {other}"),
        }
    }
    out
}

fn event(i: usize) -> Value {
    json!({"seq": i, "agent": "agent-1", "kind": "heartbeat", "body": "x".repeat(140)})
}

fn rate(count: usize, took: Duration) -> f64 {
    count as f64 / took.as_secs_f64()
}

fn timed(count: usize, work: impl FnOnce()) -> f64 {
    let started = Instant::now();
    work();
    rate(count, started.elapsed())
}

fn bus_replay(bus: &KafkaBus, topic: &str) -> usize {
    let (mut offset, mut seen) = (0, 0);
    loop {
        let page: Vec<StoredEvent> = bus
            .fetch(topic, 0, offset, PAGE)
            .unwrap_or_else(|e| panic!("fetch: {e}"));
        let Some(last) = page.last() else {
            return seen;
        };
        offset = last.offset + 1;
        seen += page.len();
        std::hint::black_box(page);
    }
}

fn broker_rss_kib(pid: Option<u32>) -> Option<(u32, u64)> {
    // Without --broker-pid, the one `kafka.Kafka` process on the machine;
    // with several (a CI run beside a bench broker) the figure would be
    // another broker's, so none is printed.
    let pid = pid.or_else(|| {
        let brokers: Vec<u32> = std::fs::read_dir("/proc")
            .ok()?
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
                let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
                String::from_utf8_lossy(&cmdline)
                    .contains("kafka.Kafka")
                    .then_some(pid)
            })
            .collect();
        match brokers[..] {
            [pid] => Some(pid),
            _ => None,
        }
    })?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some((pid, kib))
}

fn main() {
    let args = args();
    let steal_before = steal_ticks();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let manifest_topic = format!("bus-bench-manifest-{}", &id[..8]);
    let bus = KafkaBus::connect_with(
        KafkaOptions::new([args.brokers.clone()]).manifest_topic(manifest_topic.clone()),
    )
    .unwrap_or_else(|e| panic!("connect: {e}"));
    let (bus_topic, raw_topic) = (
        format!("bench-bus-{}", &id[..8]),
        format!("bench-raw-{}", &id[..8]),
    );
    // The raw client writes into a topic the bus provisioned (same configs).
    bus.provision(&Manifest::new([
        TopicSpec::new(bus_topic.clone(), 1),
        TopicSpec::new(raw_topic.clone(), 1),
    ]))
    .unwrap_or_else(|e| panic!("provision: {e}"));
    let raw =
        RawKafka::new(&args.brokers, &raw_topic).unwrap_or_else(|e| panic!("raw client: {e}"));
    // The bus that flushes each message, on a manifest and topic of its own.
    let flushed = args.flush.then(|| {
        let manifest = format!("bus-bench-flushed-manifest-{}", &id[..8]);
        let topic = format!("bench-flushed-{}", &id[..8]);
        let bus = KafkaBus::connect_with(
            KafkaOptions::new([args.brokers.clone()])
                .manifest_topic(manifest.clone())
                .flush_each_message(true),
        )
        .unwrap_or_else(|e| panic!("connect flushed: {e}"));
        bus.provision(&Manifest::new([TopicSpec::new(topic.clone(), 1)]))
            .unwrap_or_else(|e| panic!("provision flushed: {e}"));
        (bus, topic, manifest)
    });
    let serial_events: Vec<Value> = (0..args.serial).map(event).collect();
    let batch_events: Vec<Value> = (0..args.batch).map(event).collect();
    let batch_records: Vec<BatchRecord> = batch_events
        .iter()
        .map(|value| BatchRecord::new("agent-1", value.clone()))
        .collect();

    // Warm-up (uncounted), so neither side pays for the broker's JIT.
    let warm = &batch_records[..args.batch.min(5_000)];
    bus.publish_batch(&bus_topic, warm)
        .unwrap_or_else(|e| panic!("warm-up: {e}"));
    raw.batch(&batch_events[..warm.len()])
        .unwrap_or_else(|e| panic!("raw batch: {e}"));

    if let Some((bus, topic, _)) = &flushed {
        bus.publish_batch(topic, warm)
            .unwrap_or_else(|e| panic!("warm-up flushed: {e}"));
    }
    let (mut serial, mut batch, mut replay) = ([0f64; 2], [0f64; 2], [0f64; 2]);
    // Serial and batch rates of the bus that flushes each message.
    let mut flushed_rates = [0f64; 2];
    let best = |slot: &mut f64, value: f64| *slot = slot.max(value);
    for _ in 0..args.rounds {
        best(
            &mut serial[0],
            timed(args.serial, || {
                for value in &serial_events {
                    bus.publish(&bus_topic, "agent-1", value)
                        .unwrap_or_else(|e| panic!("publish: {e}"));
                }
            }),
        );
        best(
            &mut serial[1],
            timed(args.serial, || {
                raw.serial(&serial_events)
                    .unwrap_or_else(|e| panic!("raw serial: {e}"));
            }),
        );
        best(
            &mut batch[0],
            timed(args.batch, || {
                for chunk in batch_records.chunks(10_000) {
                    bus.publish_batch(&bus_topic, chunk)
                        .unwrap_or_else(|e| panic!("batch: {e}"));
                }
            }),
        );
        best(
            &mut batch[1],
            timed(args.batch, || {
                for chunk in batch_events.chunks(10_000) {
                    raw.batch(chunk)
                        .unwrap_or_else(|e| panic!("raw batch: {e}"));
                }
            }),
        );
        if let Some((bus, topic, _)) = &flushed {
            best(
                &mut flushed_rates[0],
                timed(args.serial, || {
                    for value in &serial_events {
                        bus.publish(topic, "agent-1", value)
                            .unwrap_or_else(|e| panic!("publish flushed: {e}"));
                    }
                }),
            );
            best(
                &mut flushed_rates[1],
                timed(args.batch, || {
                    for chunk in batch_records.chunks(10_000) {
                        bus.publish_batch(topic, chunk)
                            .unwrap_or_else(|e| panic!("batch flushed: {e}"));
                    }
                }),
            );
        }
    }
    let total = warm.len() + args.rounds * (args.serial + args.batch);
    for _ in 0..args.rounds {
        let started = Instant::now();
        let seen = bus_replay(&bus, &bus_topic);
        assert_eq!(seen, total, "bus replay count");
        best(&mut replay[0], rate(seen, started.elapsed()));
        let started = Instant::now();
        let seen = raw.replay().unwrap_or_else(|e| panic!("raw replay: {e}"));
        assert_eq!(seen, total, "raw replay count");
        best(&mut replay[1], rate(seen, started.elapsed()));
    }

    let end = u64::try_from(total).unwrap_or(0);
    let mut latencies: Vec<Duration> = (0..200)
        .map(|_| {
            let started = Instant::now();
            let got = bus
                .fetch(&bus_topic, 0, end, 100)
                .unwrap_or_else(|e| panic!("fetch: {e}"));
            assert!(got.is_empty());
            started.elapsed()
        })
        .collect();
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (p50, p99) = (
        ms(latencies[latencies.len() / 2]),
        ms(latencies[latencies.len() * 99 / 100]),
    );
    let rss = broker_rss_kib(args.broker_pid);

    println!(
        "{:<28} {:>12} {:>12} {:>7} {:>7}",
        "workload (msg/s, best of)", "bus-kafka", "rdkafka", "ratio", "target"
    );
    for (name, [ours, theirs], target) in [
        ("serial publish", serial, 0.9),
        ("batch publish", batch, 0.8),
        ("sequential replay", replay, 0.8),
    ] {
        println!(
            "{name:<28} {ours:>12.0} {theirs:>12.0} {:>7.2} {target:>7.2}",
            ours / theirs
        );
    }
    println!(
        "{:<28} {p50:>9.2} ms p50 {p99:>7.2} ms p99 (target < 50 ms)",
        "fetch at the end"
    );
    if flushed.is_some() {
        println!(
            "\n{:<28} {:>12} {:>12} {:>7}",
            "bus-kafka (msg/s, best of)", "defaults", "flushed", "ratio"
        );
        for (name, ours, flushed) in [
            ("serial publish", serial[0], flushed_rates[0]),
            ("batch publish", batch[0], flushed_rates[1]),
        ] {
            println!(
                "{name:<28} {ours:>12.0} {flushed:>12.0} {:>7.2}",
                flushed / ours
            );
        }
    }
    match rss {
        Some((pid, kib)) => println!("{:<28} {:>9} MiB (pid {pid})", "broker RSS", kib / 1024),
        None => println!("{:<28} unknown (pass --broker-pid)", "broker RSS"),
    }
    // Runs the host disturbed lose more on the bus side (more threads).
    match steal_before.zip(steal_ticks()) {
        Some((before, after)) => println!(
            "{:<28} {:>9} ticks",
            "CPU steal during the run",
            after - before
        ),
        None => println!("{:<28} unknown", "CPU steal during the run"),
    }
    println!(
        "{}",
        json!({
            "serial": {"bus": serial[0], "raw": serial[1]},
            "batch": {"bus": batch[0], "raw": batch[1]},
            "replay": {"bus": replay[0], "raw": replay[1]},
            "end_fetch_ms": {"p50": p50, "p99": p99},
            "broker_rss_kib": rss.map(|(_, kib)| kib),
            "flushed": args.flush.then(|| json!({"serial": flushed_rates[0], "batch": flushed_rates[1]})),
            "counts": {"serial": args.serial, "batch": args.batch, "rounds": args.rounds},
        })
    );
    let _ = bus.delete_topics(&[bus_topic, raw_topic]);
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &args.brokers)
            .create()
            .unwrap_or_else(|e| panic!("admin: {e}"));
    let mut manifests = vec![manifest_topic];
    if let Some((bus, topic, manifest)) = flushed {
        let _ = bus.delete_topics(&[topic]);
        manifests.push(manifest);
    }
    let manifests: Vec<&str> = manifests.iter().map(String::as_str).collect();
    let _ = raw.block_on(admin.delete_topics(&manifests, &rdkafka::admin::AdminOptions::new()));
}
