//! bus-nats against the raw async-nats client, same server, same work:
//!
//! ```text
//! BUS_NATS_URL=nats://127.0.0.1:4222 cargo run --release -p bus-bench --features nats --example bench_nats -- \
//!     [--records 1000000] [--serial 5000] [--batch 100000] [--server-pid PID]
//! ```
//!
//! Prints a table (and one JSON line) of: serial publish with ack, pipelined
//! batch publish, sequential replay, find_event_by_uid and end-of-stream
//! fetch latency, and the server's resident memory after `--records` stored
//! records with UIDs (one subject per UID). Bus and raw client take turns
//! (every 50 serial publishes, every batch of 1,000, every whole replay) and
//! each side's times are summed, so both see the same machine.

use std::time::{Duration, Instant};

use async_nats::jetstream;
use bus_bench::nats::RawNats;
use bus_conformance::util::steal_ticks;
use bus_core::{BatchRecord, EventBus, EventBusExt, Manifest, TopicSpec};
use bus_nats::{NatsBus, NatsOptions};
use futures::StreamExt;
use serde_json::{Value, json};

struct Args {
    records: usize,
    serial: usize,
    batch: usize,
    server_pid: Option<u32>,
}

fn args() -> Args {
    let mut parsed = Args {
        records: 1_000_000,
        serial: 5_000,
        batch: 100_000,
        server_pid: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let raw = it.next().unwrap_or_else(|| panic!("{flag} needs a number"));
        let number = || -> usize {
            raw.parse()
                .unwrap_or_else(|_| panic!("{flag} needs a number, not {raw:?}"))
        };
        match flag.as_str() {
            "--records" => parsed.records = number(),
            "--serial" => parsed.serial = number(),
            "--batch" => parsed.batch = number(),
            "--server-pid" => parsed.server_pid = u32::try_from(number()).ok(),
            other => panic!("unknown flag {other}"),
        }
    }
    parsed
}

fn value(i: usize) -> Value {
    json!({ "i": i, "agent": "agent-7", "kind": "bench", "payload": "x".repeat(150) })
}

/// Bus and raw client take turns every this many serial publishes, and
/// every batch of 1,000, so that both see the same machine: its speed
/// drifts by tens of percent within seconds on a shared 2-vCPU VM.
const SERIAL_TURN: usize = 50;
const BATCH: usize = 1_000;
/// Whole-partition replays per side, alternating.
const REPLAYS: usize = 5;

fn rate(count: usize, took: Duration) -> f64 {
    count as f64 / took.as_secs_f64()
}

fn median(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let p99 = samples[(samples.len() * 99 / 100).min(samples.len() - 1)];
    (samples[samples.len() / 2], p99)
}

/// VmRSS in KiB of `pid`, or of the nats-server listening on `port`.
fn server_rss(pid: Option<u32>, port: &str) -> Option<(u32, u64)> {
    let pid = pid.or_else(|| {
        std::fs::read_dir("/proc")
            .ok()?
            .filter_map(Result::ok)
            .find_map(|entry| {
                let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
                let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
                let args: Vec<String> = cmdline
                    .split(|b| *b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                let is_server = args.first()?.ends_with("nats-server");
                let on_port = args
                    .windows(2)
                    .any(|w| (w[0] == "-p" || w[0] == "--port") && w[1] == port);
                (is_server && on_port).then_some(pid)
            })
    })?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    Some((pid, line.split_whitespace().nth(1)?.parse().ok()?))
}

fn main() {
    let args = args();
    let url = std::env::var("BUS_NATS_URL").expect("set BUS_NATS_URL");
    let port = url
        .rsplit(':')
        .next()
        .unwrap_or("4222")
        .trim_end_matches('/')
        .to_owned();
    let prefix = format!("bench-{}", std::process::id());
    let options = NatsOptions::from_url(&url)
        .expect("url")
        .prefix(prefix.clone());
    let bus = NatsBus::connect_with(options.clone()).expect("bus");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let js = runtime.block_on(async {
        jetstream::new(
            async_nats::connect(options.servers.clone())
                .await
                .expect("raw connect"),
        )
    });
    let raw_prefix = format!("{prefix}-raw");
    let mut rows: Vec<(String, String, String, String, String)> = Vec::new();
    let mut row = |name: &str, bus: String, raw: String, ratio: String, target: &str| {
        println!("{name:<34} {bus:>14} {raw:>14} {ratio:>7} {target:>8}");
        rows.push((name.into(), bus, raw, ratio, target.into()));
    };
    println!(
        "{:<34} {:>14} {:>14} {:>7} {:>8}",
        "measure", "bus-nats", "raw", "ratio", "target"
    );

    // Serial publish, each awaiting its PubAck.
    bus.provision(&Manifest::new([
        TopicSpec::new("serial", 1),
        TopicSpec::new("batch", 1),
    ]))
    .expect("provision");
    let payloads: Vec<Value> = (0..args.serial.max(args.batch)).map(value).collect();
    let raw = RawNats::new(&options.servers, &format!("{raw_prefix}-ref")).expect("raw stream");
    let (mut bus_took, mut raw_took) = (Duration::ZERO, Duration::ZERO);
    let steal_before = steal_ticks();
    for slice in payloads[..args.serial].chunks(SERIAL_TURN) {
        let started = Instant::now();
        for v in slice {
            bus.publish("serial", "k", v).expect("publish");
        }
        bus_took += started.elapsed();
        let started = Instant::now();
        raw.serial(slice).expect("raw serial");
        raw_took += started.elapsed();
    }
    let (bus_serial, raw_serial) = (rate(args.serial, bus_took), rate(args.serial, raw_took));
    row(
        "serial publish (msg/s)",
        format!("{bus_serial:.0}"),
        format!("{raw_serial:.0}"),
        format!("{:.2}", bus_serial / raw_serial),
        ">= 0.9",
    );
    let stolen = steal_before
        .zip(steal_ticks())
        .map_or("-".to_owned(), |(before, after)| {
            (after - before).to_string()
        });
    row(
        "  CPU steal during it (ticks)",
        stolen,
        "-".into(),
        "-".into(),
        "-",
    );

    // Pipelined batch publish: 1,000 sent, then their acks awaited.
    let records: Vec<BatchRecord> = payloads[..args.batch]
        .iter()
        .map(|v| BatchRecord::new("k", v.clone()))
        .collect();
    let raw_batch_stream =
        RawNats::new(&options.servers, &format!("{raw_prefix}-batch")).expect("raw stream");
    let (mut bus_took, mut raw_took) = (Duration::ZERO, Duration::ZERO);
    for (chunk, payload_chunk) in records
        .chunks(BATCH)
        .zip(payloads[..args.batch].chunks(BATCH))
    {
        let started = Instant::now();
        bus.publish_batch("batch", chunk).expect("batch");
        bus_took += started.elapsed();
        let started = Instant::now();
        raw_batch_stream.batch(payload_chunk).expect("raw batch");
        raw_took += started.elapsed();
    }
    let (bus_batch, raw_batch) = (rate(args.batch, bus_took), rate(args.batch, raw_took));
    row(
        "batch publish (msg/s)",
        format!("{bus_batch:.0}"),
        format!("{raw_batch:.0}"),
        format!("{:.2}", bus_batch / raw_batch),
        ">= 0.8",
    );

    // Sequential replay of the whole batch partition, taking turns.
    let (mut bus_took, mut raw_took, mut replayed, mut raw_replayed) =
        (Duration::ZERO, Duration::ZERO, 0, 0);
    for _ in 0..REPLAYS {
        let started = Instant::now();
        let got = bus.fetch_all("batch", 0, 0, 1_000).expect("replay").len();
        bus_took += started.elapsed();
        assert_eq!(got, args.batch);
        replayed += got;
        let started = Instant::now();
        raw_replayed += raw_batch_stream.replay().expect("raw replay");
        raw_took += started.elapsed();
    }
    let (bus_replay, raw_replay) = (rate(replayed, bus_took), rate(raw_replayed, raw_took));
    row(
        "sequential replay (msg/s)",
        format!("{bus_replay:.0}"),
        format!("{raw_replay:.0}"),
        format!("{:.2}", bus_replay / raw_replay),
        ">= 0.8",
    );
    let replayed = args.batch;

    // End-of-stream fetch latency.
    let end = replayed as u64;
    let samples: Vec<Duration> = (0..1_000)
        .map(|_| {
            let started = Instant::now();
            assert!(bus.fetch("batch", 0, end, 100).expect("fetch").is_empty());
            started.elapsed()
        })
        .collect();
    let (p50, p99) = median(samples);
    row(
        "fetch at end p50 / p99 (us)",
        format!("{} / {}", p50.as_micros(), p99.as_micros()),
        "-".into(),
        "-".into(),
        "< 5 ms",
    );

    // Memory after `records` stored records with UIDs, then find by UID.
    bus.provision(&Manifest::new([TopicSpec::new("uids", 1)]))
        .expect("provision");
    let before = server_rss(args.server_pid, &port);
    let started = Instant::now();
    let mut batch = Vec::with_capacity(1_000);
    for i in 0..args.records {
        batch.push(BatchRecord::new("k", value(i)).with_uid(format!("evt-{i:09}")));
        if batch.len() == 1_000 || i + 1 == args.records {
            bus.publish_batch("uids", &batch).expect("uid batch");
            batch.clear();
        }
    }
    let uid_rate = rate(args.records, started.elapsed());
    let after = server_rss(args.server_pid, &port);
    row(
        "batch publish with UIDs (msg/s)",
        format!("{uid_rate:.0}"),
        "-".into(),
        "-".into(),
        "-",
    );
    let step = (args.records / 1_000).max(1);
    let samples: Vec<Duration> = (0..args.records)
        .step_by(step)
        .map(|i| {
            let uid = format!("evt-{i:09}");
            let started = Instant::now();
            assert!(
                bus.find_event_by_uid("uids", "k", &uid)
                    .expect("find")
                    .is_some()
            );
            started.elapsed()
        })
        .collect();
    let (p50, p99) = median(samples);
    row(
        "find_event_by_uid p50 / p99 (us)",
        format!("{} / {}", p50.as_micros(), p99.as_micros()),
        "-".into(),
        "-".into(),
        "-",
    );
    let show = |rss: Option<(u32, u64)>| {
        rss.map_or("unknown".to_owned(), |(pid, kib)| {
            format!("{} MiB (pid {pid})", kib / 1024)
        })
    };
    row(
        &format!("server VmRSS before {} records", args.records),
        show(before),
        "-".into(),
        "-".into(),
        "-",
    );
    row(
        &format!("server VmRSS after {} records", args.records),
        show(after),
        "-".into(),
        "-".into(),
        "-",
    );

    let json: Vec<Value> = rows
        .iter()
        .map(|(m, b, r, x, t)| json!({"measure": m, "bus": b, "raw": r, "ratio": x, "target": t}))
        .collect();
    println!("{}", Value::Array(json));

    // Leave the server as found.
    drop(bus);
    runtime.block_on(async {
        let names: Vec<String> = js
            .stream_names()
            .filter_map(|n| async move { n.ok() })
            .collect()
            .await;
        for name in names
            .into_iter()
            .filter(|n| n.starts_with(&format!("{prefix}_")) || n.starts_with(&raw_prefix))
        {
            let _ = js.delete_stream(&name).await;
        }
    });
}
