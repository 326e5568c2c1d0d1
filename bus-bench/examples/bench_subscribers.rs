//! Benchmark: what live subscribers cost the publisher (issue #26, item 8).
//!
//! ```text
//! cargo run --release -p bus-bench --example bench_subscribers -- [--scale F] [--dir DIR] [--subs 0,16,256]
//! ```
//!
//! For the memory bus and the embedded writer (`Durability::Interval(5)`
//! and `Durability::Sync`): one topic of one partition, 0, 16 and 256
//! subscribers (`StartAt::Now`), one thread publishing N records one by
//! one. Two tables, each from this one run:
//!
//! (a) receiving: each subscriber on its own thread, receiving every
//!     record. publish/s is N over the publisher's wall time; e2e/s is N
//!     over the time until the last subscriber had the last record. The
//!     publisher and the subscribers share the machine's cores, so with
//!     256 subscribers the wall rates fall with the publisher's share of
//!     them. What bounds them is printed: the process's CPU per published
//!     record (all threads), the subscribers' CPU per delivered record,
//!     and `ceiling/s` = cores / (process CPU per record), the best rate
//!     at which every subscriber can keep up on this machine.
//! (b) idle: the subscribers subscribed but not in `recv` (no thread).
//!
//! In both, `pub cpu` is the publisher thread's own CPU per publish
//! (`CLOCK_THREAD_CPUTIME_ID`, through rustix): the cost of the publish path itself, which
//! must not grow with the subscribers.
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    clippy::cast_sign_loss,
    missing_docs
)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use bus_core::memory::MemoryBus;
use bus_core::{EventBus, Manifest, Selector, StartAt, SubscribeOptions, TopicSpec};
use bus_embedded::{Durability, EmbeddedBus, Options};
use serde_json::json;

/// Nanoseconds the calling thread has run on a CPU.
fn thread_cpu_ns() -> u64 {
    cpu_ns(rustix::time::ClockId::ThreadCPUTime)
}

/// Nanoseconds all threads of the process have run on a CPU.
fn process_cpu_ns() -> u64 {
    cpu_ns(rustix::time::ClockId::ProcessCPUTime)
}

fn cpu_ns(clock: rustix::time::ClockId) -> u64 {
    let now = rustix::time::clock_gettime(clock);
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

#[derive(Clone, Copy, Default)]
struct Row {
    /// Published records per second of the publisher's wall time.
    rate: f64,
    /// The publisher thread's CPU per publish, ns.
    pub_ns: f64,
    /// All threads' CPU per published record, ns, to the last receipt.
    process_ns: f64,
    /// The subscribers' CPU per delivered record, ns.
    sub_ns: f64,
    /// Records per second until the last subscriber had them all.
    e2e: f64,
}

fn subscribe(bus: &dyn EventBus) -> bus_core::Subscription {
    bus.subscribe(
        "t",
        Selector::Topic,
        StartAt::Now,
        SubscribeOptions::default(),
    )
    .unwrap()
}

fn publish(bus: &dyn EventBus, records: usize) -> (Instant, Duration, u64) {
    let start = Instant::now();
    let cpu = thread_cpu_ns();
    for i in 0..records {
        bus.publish("t", "k", &json!({"i": i, "payload": "0123456789abcdef"}))
            .unwrap();
    }
    (start, start.elapsed(), thread_cpu_ns() - cpu)
}

/// (a): every subscriber receives every record on its own thread. A
/// first record, before the clocks start, has every subscriber running
/// and back in `recv` (woken threads, not threads still being created).
fn receiving(bus: &dyn EventBus, subscribers: usize, records: usize) -> Row {
    let (ready, warm) = std::sync::mpsc::channel();
    let threads: Vec<_> = (0..subscribers)
        .map(|_| {
            let mut sub = subscribe(bus);
            let ready = ready.clone();
            std::thread::spawn(move || {
                let first = sub.recv_timeout(Duration::from_secs(120)).unwrap();
                assert!(first.is_some_and(|item| item.event().is_some()));
                let cpu = thread_cpu_ns();
                ready.send(()).unwrap();
                let mut got = 0;
                while got < records {
                    match sub.recv_timeout(Duration::from_secs(120)).unwrap() {
                        Some(item) if item.event().is_some() => got += 1,
                        Some(other) => panic!("unexpected {other:?}"),
                        None => panic!("no record within 120 s ({got} of {records})"),
                    }
                }
                (Instant::now(), thread_cpu_ns() - cpu)
            })
        })
        .collect();
    bus.publish("t", "k", &json!({"warm-up": true})).unwrap();
    for _ in 0..subscribers {
        warm.recv_timeout(Duration::from_secs(120)).unwrap();
    }
    let process = process_cpu_ns();
    let (start, published, pub_cpu) = publish(bus, records);
    let mut last = start + published;
    let mut sub_cpu = 0;
    for thread in threads {
        let (done, cpu) = thread.join().unwrap();
        last = last.max(done);
        sub_cpu += cpu;
    }
    let process = process_cpu_ns() - process;
    let deliveries = (records * subscribers).max(1) as f64;
    Row {
        rate: records as f64 / published.as_secs_f64(),
        pub_ns: pub_cpu as f64 / records as f64,
        process_ns: process as f64 / records as f64,
        sub_ns: sub_cpu as f64 / deliveries,
        e2e: records as f64 / (last - start).as_secs_f64(),
    }
}

/// The control for (a): no subscriber, but `threads` threads busy with
/// the kind of work a subscriber does per record (cloning a decoded value)
/// while the publisher publishes. What the publisher's CPU per publish
/// gains here comes from sharing the cores and caches with that many
/// runnable threads, not from the bus.
fn busy(bus: &dyn EventBus, threads: usize, records: usize) -> Row {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ready = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (stop, ready) = (Arc::clone(&stop), Arc::clone(&ready));
            std::thread::spawn(move || {
                let value = json!({"i": 1, "payload": "0123456789abcdef"});
                ready.wait();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::black_box(value.clone());
                }
            })
        })
        .collect();
    ready.wait();
    let process = process_cpu_ns();
    let (_, published, pub_cpu) = publish(bus, records);
    let process = process_cpu_ns() - process;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for worker in workers {
        worker.join().unwrap();
    }
    Row {
        rate: records as f64 / published.as_secs_f64(),
        pub_ns: pub_cpu as f64 / records as f64,
        process_ns: process as f64 / records as f64,
        ..Row::default()
    }
}

/// (b): the subscribers are subscribed but nobody receives.
fn idle(bus: &dyn EventBus, subscribers: usize, records: usize) -> Row {
    let subs: Vec<_> = (0..subscribers).map(|_| subscribe(bus)).collect();
    let (_, published, pub_cpu) = publish(bus, records);
    drop(subs);
    Row {
        rate: records as f64 / published.as_secs_f64(),
        pub_ns: pub_cpu as f64 / records as f64,
        ..Row::default()
    }
}

fn open(index: usize, base: &Path, name: &str) -> Box<dyn EventBus> {
    let bus: Box<dyn EventBus> = match index {
        0 => Box::new(MemoryBus::new()),
        _ => {
            let durability = if index == 1 {
                Durability::Interval(5)
            } else {
                Durability::Sync
            };
            let path = base.join(name);
            Box::new(
                EmbeddedBus::open_with(&path, Options::default().durability(durability)).unwrap(),
            )
        }
    };
    bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
        .unwrap();
    bus
}

const CONFIGS: [(&str, usize); 3] = [
    ("memory", 50_000),
    ("embedded Interval(5)", 20_000),
    ("embedded Sync", 1_000),
];
/// The subscriber counts measured unless `--subs` says otherwise (the
/// first is the row the ratios compare with).
const SUBSCRIBERS: [usize; 3] = [0, 16, 256];

fn main() {
    let mut scale = 1.0f64;
    let mut dir: Option<PathBuf> = None;
    let mut counts = SUBSCRIBERS.to_vec();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--scale" => scale = args.next().unwrap().parse().unwrap(),
            "--dir" => dir = Some(args.next().unwrap().into()),
            "--subs" => {
                counts = args
                    .next()
                    .unwrap()
                    .split(',')
                    .map(|n| n.parse().unwrap())
                    .collect();
            }
            other => panic!("unknown argument {other}"),
        }
    }
    let base = match &dir {
        Some(dir) => tempfile::tempdir_in(dir).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{cores} cores (load average at start: {}); one topic of one partition\n",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut rows = Vec::new();
    let mut controls = Vec::new();
    for (index, (name, records)) in CONFIGS.into_iter().enumerate() {
        let records = ((records as f64 * scale) as usize).max(10);
        for &subscribers in &counts {
            let bus = open(index, base.path(), &format!("{index}-{subscribers}-a"));
            let a = receiving(bus.as_ref(), subscribers, records);
            drop(bus);
            let bus = open(index, base.path(), &format!("{index}-{subscribers}-b"));
            let b = idle(bus.as_ref(), subscribers, records);
            rows.push((name, subscribers, records, a, b));
        }
        if index < 2 {
            let bus = open(index, base.path(), &format!("{index}-busy"));
            controls.push((name, records, busy(bus.as_ref(), 256, records)));
        }
    }
    println!("(a) subscribers receiving every record, each on its own thread");
    println!(
        "{:<21} {:>4} {:>7} {:>10} {:>5} {:>9} {:>5} {:>10} {:>9} {:>10} {:>10}",
        "backend",
        "subs",
        "records",
        "publish/s",
        "ratio",
        "pub cpu",
        "ratio",
        "proc cpu/r",
        "sub cpu/d",
        "e2e/s",
        "ceiling/s"
    );
    let zero = |name: &str, pick: fn(&(&str, usize, usize, Row, Row)) -> Row| {
        rows.iter().find(|row| row.0 == name).map(pick).unwrap()
    };
    for (name, subs, records, a, _) in &rows {
        let z = zero(name, |row| row.3);
        println!(
            "{:<21} {:>4} {:>7} {:>10.0} {:>5.2} {:>7.2}µs {:>5.2} {:>8.2}µs {:>7.3}µs {:>10.0} {:>10.0}",
            name,
            subs,
            records,
            a.rate,
            a.rate / z.rate,
            a.pub_ns / 1e3,
            a.pub_ns / z.pub_ns,
            a.process_ns / 1e3,
            a.sub_ns / 1e3,
            a.e2e,
            cores as f64 * 1e9 / a.process_ns,
        );
    }
    println!("\n(a') control: no subscriber, 256 threads busy cloning a decoded value (no bus)");
    println!(
        "{:<21} {:>4} {:>7} {:>10} {:>5} {:>9} {:>5} {:>10}",
        "backend", "busy", "records", "publish/s", "ratio", "pub cpu", "ratio", "proc cpu/r"
    );
    for (name, records, c) in &controls {
        let z = zero(name, |row| row.3);
        println!(
            "{:<21} {:>4} {:>7} {:>10.0} {:>5.2} {:>7.2}µs {:>5.2} {:>8.2}µs",
            name,
            256,
            records,
            c.rate,
            c.rate / z.rate,
            c.pub_ns / 1e3,
            c.pub_ns / z.pub_ns,
            c.process_ns / 1e3,
        );
    }
    println!("\n(b) subscribers subscribed but idle (not in recv)");
    println!(
        "{:<21} {:>4} {:>7} {:>10} {:>5} {:>9} {:>5}",
        "backend", "subs", "records", "publish/s", "ratio", "pub cpu", "ratio"
    );
    for (name, subs, records, _, b) in &rows {
        let z = zero(name, |row| row.4);
        println!(
            "{:<21} {:>4} {:>7} {:>10.0} {:>5.2} {:>7.2}µs {:>5.2}",
            name,
            subs,
            records,
            b.rate,
            b.rate / z.rate,
            b.pub_ns / 1e3,
            b.pub_ns / z.pub_ns,
        );
    }
    println!(
        "\npub cpu: the publisher thread's CPU per publish. proc cpu/r: all threads' CPU per\n\
         published record, to the last receipt. sub cpu/d: a subscriber's CPU per delivered\n\
         record. ceiling/s: {cores} cores / proc cpu/r, the fastest publish rate every\n\
         subscriber can keep up with here (subs x sub cpu/d is the part that grows)."
    );
}
