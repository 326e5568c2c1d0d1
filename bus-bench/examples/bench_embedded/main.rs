//! Benchmark of the embedded log. Each figure is printed beside the
//! reference it is judged against, measured in the same run on the same disk.
//!
//! ```text
//! cargo run --release -p bus-bench --example bench_embedded -- [--records N] [--json] [--dir DIR]
//! cargo run --release -p bus-bench --example bench_embedded -- --compression [--records N] [--dir DIR]
//! ```
//!
//! `--compression` runs only the compression table: the same batch fill,
//! replay and random fetches on topics stored with each
//! `TopicSpec::compression`, side by side in one run, for the bench's
//! events and for events of varied text.
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    missing_docs
)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bus_core::{BatchRecord, Compression, EventBus, Manifest, TopicSpec};
use bus_embedded::EmbeddedBus;
use serde_json::{Value, json};

mod group_commit;
mod references;
mod workload;

use group_commit::sqlite_group_commit_rate;

use references::{
    bare_append_bandwidth, bare_fsync_rate, parse_rate, serialize_rate, sqlite_reference,
};
use workload::{Latency, Lcg, event, rate, settle, uid, varied_event};

struct Row {
    name: &'static str,
    value: f64,
    unit: &'static str,
    reference: Option<(&'static str, f64)>,
    target: &'static str,
}

impl Row {
    /// The value over the reference's, when there is one.
    fn ratio(&self) -> Option<f64> {
        self.reference.map(|(_, reference)| self.value / reference)
    }
}

fn provision(bus: &dyn EventBus, name: &str) {
    bus.provision(&Manifest::new([TopicSpec::new(name, 1)]))
        .unwrap();
}

fn publish_for(bus: &dyn EventBus, topic: &str, budget: Duration, from: u64) -> u64 {
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed() < budget {
        bus.publish(topic, "k", &event(from + n)).unwrap();
        n += 1;
    }
    n
}

/// Mean bytes of the bench's first `records` values as stored (JSON).
fn payload_bytes(records: u64) -> f64 {
    let sample = records.min(10_000);
    let step = (records / sample).max(1);
    let total: usize = (0..sample)
        .map(|i| serde_json::to_vec(&event(i * step)).unwrap().len())
        .sum();
    total as f64 / sample as f64
}

/// Publishes `records` in batches of 1000; returns the time spent in
/// `publish_batch` only (building the values is the caller's cost).
fn fill(bus: &dyn EventBus, topic: &str, records: u64) -> Duration {
    fill_with(bus, topic, records, event)
}

/// [`fill`] with the events `make` makes.
fn fill_with(bus: &dyn EventBus, topic: &str, records: u64, make: fn(u64) -> Value) -> Duration {
    let mut spent = Duration::ZERO;
    let mut i = 0;
    while i < records {
        let batch: Vec<BatchRecord> = (i..(i + 1000).min(records))
            .map(|j| BatchRecord::new("k", make(j)).with_uid(uid(j)))
            .collect();
        i += batch.len() as u64;
        let start = Instant::now();
        bus.publish_batch(topic, &batch).unwrap();
        spent += start.elapsed();
        if stages() && i % 1_000_000 == 0 {
            eprintln!(
                "stage: {i} records written: RssAnon {:.1} MiB, VmRSS {:.1} MiB",
                status_mib("RssAnon"),
                status_mib("VmRSS")
            );
        }
    }
    spent
}

/// `BENCH_STAGES=1`: RssAnon and VmRSS on stderr at stages of the run.
fn stages() -> bool {
    std::env::var_os("BENCH_STAGES").is_some()
}

fn stage(what: &str) {
    if stages() {
        eprintln!(
            "stage: {what}: RssAnon {:.1} MiB, VmRSS {:.1} MiB",
            status_mib("RssAnon"),
            status_mib("VmRSS")
        );
    }
}

fn latencies(bus: &dyn EventBus, topic: &str, records: u64) -> (Latency, Latency) {
    let mut rng = Lcg(records);
    let samples = 2000;
    let fetches = (0..samples)
        .map(|_| {
            let offset = rng.below(records);
            let start = Instant::now();
            let got = bus.fetch(topic, 0, offset, 1).unwrap();
            let took = start.elapsed();
            assert_eq!(got[0].offset, offset);
            took
        })
        .collect();
    let finds = (0..samples)
        .map(|_| {
            let i = rng.below(records);
            let wanted = uid(i);
            let start = Instant::now();
            let got = bus.find_event_by_uid(topic, "k", &wanted).unwrap();
            let took = start.elapsed();
            assert_eq!(got.map(|a| a.offset), Some(i));
            took
        })
        .collect();
    (Latency::of(fetches), Latency::of(finds))
}

/// A field of `/proc/self/status` (`VmRSS`, `RssAnon`) in MiB.
fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// Child mode: open the bus, publish a little, say so, wait to be killed.
fn hold(dir: &str) {
    let bus = EmbeddedBus::open(dir).unwrap();
    for i in 0..10 {
        bus.publish("big", "k", &event(u64::MAX - i)).unwrap();
    }
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

fn open_after_kill(dir: &Path) -> Duration {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--hold", dir.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "READY");
    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    let bus = EmbeddedBus::open(dir).unwrap();
    let took = start.elapsed();
    drop(bus);
    took
}

/// Bytes of the files under `dir` (recursively) whose name ends in `ext`,
/// or of every file when `ext` is empty.
fn dir_bytes(dir: &Path, ext: &str) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                dir_bytes(&path, ext)
            } else if ext.is_empty() || path.extension().is_some_and(|e| e == ext) {
                entry.metadata().unwrap().len()
            } else {
                0
            }
        })
        .sum()
}

fn replay_rate(bus: &dyn EventBus, topic: &str, records: u64) -> f64 {
    let start = Instant::now();
    let mut offset = 0;
    loop {
        let page = bus.fetch(topic, 0, offset, 1000).unwrap();
        let Some(last) = page.last() else { break };
        offset = last.offset + 1;
    }
    assert_eq!(offset, records);
    rate(records, start.elapsed())
}

/// `--compression`: for each kind of event, topics stored with no
/// compression, lz4 and zstd filled, replayed and read at random in the
/// same run; every figure beside the uncompressed topic's.
fn compression_bench(dir: &Path, records: u64) {
    const KINDS: [Compression; 3] = [Compression::None, Compression::Lz4, Compression::Zstd];
    type Make = fn(u64) -> Value;
    let shapes: [(&str, Make); 2] = [("bench events", event), ("varied events", varied_event)];
    println!("N = {records} records, dir {}", dir.display());
    for (shape, make) in shapes {
        let payload = (0..1000)
            .map(|i| {
                serde_json::to_vec(&make(i * (records / 1000).max(1)))
                    .unwrap()
                    .len()
            })
            .sum::<usize>() as f64
            / 1000.0;
        let topic = |kind: Compression| format!("{}-{kind}", shape.split(' ').next().unwrap());
        let bus = EmbeddedBus::open(dir).unwrap();
        // The first fill of a run paid for warming up (allocator, page
        // cache) and flattered the codecs after it.
        let warm = format!("warm-{}", topic(Compression::None));
        provision(&bus, &warm);
        fill_with(&bus, &warm, records.min(100_000), make);
        let mut batch = Vec::new();
        for kind in KINDS {
            bus.provision(&Manifest::new([
                TopicSpec::new(topic(kind), 1).with_compression(kind)
            ]))
            .unwrap();
            batch.push(rate(records, fill_with(&bus, &topic(kind), records, make)));
        }
        // Sizes after a clean close (no zeros written ahead).
        drop(bus);
        let topic_dir = |kind| dir.join("topics").join(topic(kind));
        let log: Vec<f64> = KINDS
            .iter()
            .map(|&k| dir_bytes(&topic_dir(k), "log") as f64 / records as f64)
            .collect();
        let all: Vec<f64> = KINDS
            .iter()
            .map(|&k| dir_bytes(&topic_dir(k), "") as f64 / records as f64)
            .collect();
        let bus = EmbeddedBus::open(dir).unwrap();
        let replay: Vec<f64> = KINDS
            .iter()
            .map(|&k| replay_rate(&bus, &topic(k), records))
            .collect();
        let (fetch, find): (Vec<f64>, Vec<f64>) = KINDS
            .iter()
            .map(|&k| {
                let (fetch, find) = latencies(&bus, &topic(k), records);
                (fetch.p50, find.p50)
            })
            .unzip();
        drop(bus);
        println!("\n{shape}: ~{payload:.0} B of JSON per record");
        println!(
            "{:<36} {:>12} {:>12} {:>7} {:>12} {:>7}",
            "measure", "none", "lz4", "÷ none", "zstd", "÷ none"
        );
        for (name, values) in [
            ("segment bytes on disk / record", &log),
            ("all topic files on disk / record", &all),
            ("batch publish 1000/call rec/s", &batch),
            ("replay fetch(max=1000) rec/s", &replay),
            ("fetch(random, 1) p50 us", &fetch),
            ("find_event_by_uid p50 us", &find),
        ] {
            println!(
                "{:<36} {:>12.1} {:>12.1} {:>7.2} {:>12.1} {:>7.2}",
                name,
                values[0],
                values[1],
                values[1] / values[0],
                values[2],
                values[2] / values[0]
            );
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().position(|a| a == name).map(|i| i + 1);
    if let Some(i) = flag("--hold") {
        return hold(&args[i]);
    }
    let records: u64 = flag("--records").map_or(1_000_000, |i| args[i].parse().unwrap());
    let json_out = flag("--json").is_some();
    let parent = flag("--dir").map_or_else(std::env::temp_dir, |i| PathBuf::from(&args[i]));
    std::fs::create_dir_all(&parent).unwrap();
    let tmp = tempfile::tempdir_in(parent).unwrap();
    let dir = tmp.path();
    if flag("--compression").is_some() {
        return compression_bench(dir, records);
    }
    let budget = Duration::from_secs(2);
    let mut rows = Vec::new();

    stage("start");
    if std::env::var_os("BENCH_REPLAY_ONLY").is_some() {
        // For a profiler: the fill, then replays and parses only.
        let bus = EmbeddedBus::open(dir).unwrap();
        provision(&bus, "big");
        fill(&bus, "big", records);
        let mut ratios = Vec::new();
        for _ in 0..5 {
            let start = Instant::now();
            let mut offset = 0;
            loop {
                let page = bus.fetch("big", 0, offset, 1000).unwrap();
                let Some(last) = page.last() else { break };
                offset = last.offset + 1;
            }
            let replay = rate(records, start.elapsed());
            let parse = parse_rate(Duration::from_millis(500));
            println!(
                "replay {replay:.0} rec/s, parse {parse:.0} rec/s, ratio {:.2}",
                replay / parse
            );
            ratios.push(replay / parse);
        }
        ratios.sort_by(f64::total_cmp);
        println!("median ratio {:.2}", ratios[ratios.len() / 2]);
        return;
    }
    let bus = EmbeddedBus::open(dir).unwrap();
    let fsync = bare_fsync_rate(dir, budget);
    provision(&bus, "one");
    let n = publish_for(&bus, "one", budget, 0);
    let one = rate(n, budget);
    rows.push(Row {
        name: "1 publisher, Sync",
        value: one,
        unit: "rec/s",
        reference: Some(("bare write+fdatasync", fsync)),
        target: ">= 0.7",
    });

    stage("after 1 publisher");
    provision(&bus, "many");
    let start = Instant::now();
    let total: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..16)
            .map(|t| {
                let bus = &bus;
                scope.spawn(move || publish_for(bus, "many", budget, t * 1_000_000_000))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let many = rate(total, start.elapsed());
    rows.push(Row {
        name: "16 publishers, 1 partition, Sync",
        value: many,
        unit: "rec/s",
        reference: Some(("1 publisher", one)),
        target: ">= 8",
    });
    let group_commit = sqlite_group_commit_rate(dir, 16, budget);
    rows.push(Row {
        name: "16 publishers, 1 partition, Sync",
        value: many,
        unit: "rec/s",
        reference: Some(("SQLite group commit, 16", group_commit)),
        target: ">= 3",
    });

    stage("after 16 publishers");
    provision(&bus, "small");
    fill(&bus, "small", 1_000);
    let append = bare_append_bandwidth(dir, budget);
    stage("before the big fill");
    provision(&bus, "big");
    let took = fill(&bus, "big", records);
    let rss = status_mib("VmRSS");
    let rss_anon = status_mib("RssAnon");
    if std::env::var_os("BENCH_EXIT_AFTER_FILL").is_some() {
        // What is still allocated here shows as leaked in a heap profiler.
        stage("after the big fill");
        std::process::exit(0);
    }
    let (sqlite_insert, sqlite_replay, sqlite_fetch, sqlite_find) = sqlite_reference(dir, records);
    let batch = rate(records, took);
    rows.push(Row {
        name: "batch publish 1000/call, Sync",
        value: batch,
        unit: "rec/s",
        reference: Some(("SQLite 1000/transaction", sqlite_insert)),
        target: ">= 200000",
    });
    let serialize = serialize_rate(budget);
    rows.push(Row {
        name: "batch publish 1000/call, Sync",
        value: batch,
        unit: "rec/s",
        reference: Some(("serde_json Value to bytes", serialize)),
        target: "-",
    });
    rows.push(Row {
        name: "serde_json serialize payload",
        value: serialize * payload_bytes(records) / 1e6,
        unit: "MB/s",
        reference: Some(("1 MiB write+fdatasync", append)),
        target: "-",
    });
    let payload = batch * payload_bytes(records) / 1e6;
    rows.push(Row {
        name: "batch publish payload, Sync",
        value: payload,
        unit: "MB/s",
        reference: Some(("1 MiB write+fdatasync", append)),
        target: ">= 0.5",
    });

    let start = Instant::now();
    let mut offset = 0;
    loop {
        let page = bus.fetch("big", 0, offset, 1000).unwrap();
        let Some(last) = page.last() else { break };
        offset = last.offset + 1;
    }
    assert_eq!(offset, records);
    let replay = rate(records, start.elapsed());
    let parse = parse_rate(budget);
    rows.push(Row {
        name: "sequential replay fetch(max=1000)",
        value: replay,
        unit: "rec/s",
        reference: Some(("SQLite 1000/query", sqlite_replay)),
        target: ">= 500000",
    });
    rows.push(Row {
        name: "sequential replay fetch(max=1000)",
        value: replay,
        unit: "rec/s",
        reference: Some(("serde_json parse to Value", parse)),
        target: ">= 0.8",
    });

    settle();
    let (fetch_small, find_small) = latencies(&bus, "small", 1_000);
    let (fetch_big, find_big) = latencies(&bus, "big", records);
    if stages() {
        eprintln!(
            "stage: after fetch and find: RssAnon {:.1} MiB, VmRSS {:.1} MiB",
            status_mib("RssAnon"),
            status_mib("VmRSS")
        );
    }
    rows.push(Row {
        name: "fetch(random, 1) median at N records",
        value: fetch_big.p50,
        unit: "us",
        reference: Some(("at 1,000 records", fetch_small.p50)),
        target: "<= 2",
    });
    rows.push(Row {
        name: "fetch(random, 1) median at N records",
        value: fetch_big.p50,
        unit: "us",
        reference: Some(("SQLite by rowid at N", sqlite_fetch.p50)),
        target: "<= 1",
    });
    rows.push(Row {
        name: "fetch(random, 1) p99 at N records",
        value: fetch_big.p99,
        unit: "us",
        reference: Some(("SQLite by rowid at N", sqlite_fetch.p99)),
        target: "<= 1",
    });
    rows.push(Row {
        name: "find_event_by_uid median at N records",
        value: find_big.p50,
        unit: "us",
        reference: Some(("at 1,000 records", find_small.p50)),
        target: "<= 2",
    });
    rows.push(Row {
        name: "find_event_by_uid median at N records",
        value: find_big.p50,
        unit: "us",
        reference: Some(("SQLite indexed uid at N", sqlite_find.p50)),
        target: "<= 0.2",
    });
    rows.push(Row {
        name: "find_event_by_uid p99 at N records",
        value: find_big.p99,
        unit: "us",
        reference: Some(("SQLite indexed uid at N", sqlite_find.p99)),
        target: "<= 1",
    });
    rows.push(Row {
        name: "RssAnon after writing N records",
        value: rss_anon,
        unit: "MiB",
        reference: Some(("total RSS", rss)),
        target: "<= 64 MiB",
    });
    drop(bus);

    let start = Instant::now();
    drop(EmbeddedBus::open(dir).unwrap());
    rows.push(Row {
        name: "open after clean close, N records",
        value: start.elapsed().as_secs_f64() * 1e3,
        unit: "ms",
        reference: None,
        target: "<= 50 ms",
    });
    let killed = open_after_kill(dir);
    rows.push(Row {
        name: "open after kill -9, N records",
        value: killed.as_secs_f64() * 1e3,
        unit: "ms",
        reference: None,
        target: "",
    });

    if json_out {
        let rows: Vec<Value> = rows
            .iter()
            .map(|r| json!({"name": r.name, "value": r.value, "unit": r.unit, "reference": r.reference.map(|(n, v)| json!({"name": n, "value": v})), "ratio": r.ratio(), "target": r.target}))
            .collect();
        println!("{}", json!({"records": records, "results": rows}));
        return;
    }
    println!(
        "N = {records} records of ~200 B JSON, dir {}",
        dir.display()
    );
    println!(
        "{:<40} {:>14} {:<6} {:<26} {:>12} {:>8} {:<8}",
        "measure", "value", "unit", "reference", "ref value", "ratio", "target"
    );
    for r in &rows {
        let (rn, rv) = r
            .reference
            .map_or(("", String::new()), |(n, v)| (n, format!("{v:.1}")));
        let ratio = r.ratio().map_or(String::new(), |x| format!("{x:.2}"));
        println!(
            "{:<40} {:>14.1} {:<6} {:<26} {:>12} {:>8} {:<8}",
            r.name, r.value, r.unit, rn, rv, ratio, r.target
        );
    }
}
