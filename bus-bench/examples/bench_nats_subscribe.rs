//! Live subscriptions of bus-nats beside raw async-nats ordered push
//! consumers, same server, same run.
//!
//! ```text
//! BUS_NATS_URL=nats://127.0.0.1:4222 cargo run --release -p bus-bench --features nats \
//!     --example bench_nats_subscribe -- [--serial N] [--fanout N] [--subscribers N] [--idle-secs N]
//! ```
//! - latency: one bus subscription and one raw ordered push consumer of the
//!   same stream receive the same records, published one at a time by a
//!   serial publisher (each awaiting its ack); each value carries the time
//!   its publish call started, and each side notes when it received it
//!   (p50/p99 in µs).
//! - fan-out: N bus subscriptions (one thread each), then N raw ordered push
//!   consumers (tasks on one connection), receive a batch of records
//!   published after they started; records delivered per second in total,
//!   from the first publish to the last receipt.
//! - idle: this process's CPU time over `--idle-secs` with no subscription,
//!   then with one idle subscription (from /proc/self/stat).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bus_bench::nats::spawn_push_readers;
use bus_core::{
    BatchRecord, EventBus, Manifest, Selector, StartAt, SubscribeOptions, SubscriptionItem,
    TopicSpec,
};
use bus_nats::naming::stream_name;
use bus_nats::{NatsBus, NatsOptions};
use serde_json::{Value, json};

struct Args {
    url: String,
    serial: usize,
    fanout: usize,
    subscribers: usize,
    idle_secs: u64,
}

fn args() -> Args {
    let mut out = Args {
        url: std::env::var("BUS_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into()),
        serial: 2_000,
        fanout: 20_000,
        subscribers: 64,
        idle_secs: 10,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_default();
        let number = |default: usize| value.parse().unwrap_or(default);
        match flag.as_str() {
            "--url" => out.url = value,
            "--serial" => out.serial = number(out.serial),
            "--fanout" => out.fanout = number(out.fanout),
            "--subscribers" => out.subscribers = number(out.subscribers).max(1),
            "--idle-secs" => out.idle_secs = value.parse().unwrap_or(out.idle_secs),
            other => panic!("unknown flag {other}"),
        }
    }
    out
}

fn event(i: usize, sent_ns: u128) -> Value {
    let sent_ns = u64::try_from(sent_ns).unwrap_or(u64::MAX);
    json!({"seq": i, "sent_ns": sent_ns, "agent": "agent-1", "body": "x".repeat(140)})
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let last = sorted.len() - 1;
    let rank = (0..=last)
        .find(|&rank| rank as f64 >= last as f64 * p)
        .unwrap_or(last);
    sorted[rank]
}

fn fresh_topic(bus: &NatsBus, phase: &str) -> String {
    let topic = format!(
        "bench-sub-{phase}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    bus.provision(&Manifest::new([TopicSpec::new(topic.clone(), 1)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    topic
}

/// p50/p99 publish call → receipt in µs, bus then raw.
fn latency(bus: &NatsBus, servers: &[String], serial: usize) -> ((f64, f64), (f64, f64)) {
    let topic = fresh_topic(bus, "lat");
    let next = bus.offsets(&topic, 0).expect("offsets").next;
    let base = Instant::now();
    let mut sub = bus
        .subscribe(
            &topic,
            Selector::Partition(0),
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .unwrap_or_else(|e| panic!("subscribe: {e}"));
    let raw_lat = Arc::new(Mutex::new(Vec::with_capacity(serial)));
    let noted = Arc::clone(&raw_lat);
    let raw = spawn_push_readers(
        servers,
        &stream_name(bus.prefix(), &topic, 0),
        next + 1,
        1,
        serial,
        Arc::new(move |_, payload: &[u8]| {
            let now = base.elapsed().as_nanos() as f64;
            let value: Value = serde_json::from_slice(payload).unwrap_or(Value::Null);
            let sent = value["sent_ns"].as_u64().unwrap_or(0) as f64;
            noted.lock().expect("lock").push((now - sent) / 1e3);
        }),
    )
    .unwrap_or_else(|e| panic!("raw reader: {e}"));
    let bus_lat = std::thread::scope(|scope| {
        let bus_side = scope.spawn(|| {
            let mut out = Vec::with_capacity(serial);
            while out.len() < serial {
                match sub.recv_timeout(Duration::from_secs(10)) {
                    Ok(Some(SubscriptionItem::Record { event, .. })) => {
                        let now = base.elapsed().as_nanos() as f64;
                        let sent = event.value["sent_ns"].as_u64().unwrap_or(0) as f64;
                        out.push((now - sent) / 1e3);
                    }
                    Ok(_) => {}
                    Err(e) => panic!("bus subscription: {e}"),
                }
            }
            out
        });
        // Let both sides settle at the end before timing anything.
        std::thread::sleep(Duration::from_millis(500));
        for i in 0..serial {
            let sent = base.elapsed().as_nanos();
            bus.publish(&topic, "k", &event(i, sent))
                .unwrap_or_else(|e| panic!("publish: {e}"));
        }
        bus_side.join().expect("bus side")
    });
    raw.join()
        .expect("raw thread")
        .unwrap_or_else(|e| panic!("raw reader: {e}"));
    let raw_lat = std::mem::take(&mut *raw_lat.lock().expect("lock"));
    let stats = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (percentile(&v, 0.5), percentile(&v, 0.99))
    };
    (stats(bus_lat), stats(raw_lat))
}

fn publish_batch(bus: &NatsBus, topic: &str, count: usize) -> Instant {
    let records: Vec<BatchRecord> = (0..count)
        .map(|i| BatchRecord::new("k", event(i, 0)))
        .collect();
    let started = Instant::now();
    for chunk in records.chunks(1_000) {
        bus.publish_batch(topic, chunk)
            .unwrap_or_else(|e| panic!("publish: {e}"));
    }
    started
}

/// Records delivered per second to `subscribers` bus subscriptions in total.
fn fanout_bus(bus: &NatsBus, subscribers: usize, count: usize) -> f64 {
    let topic = fresh_topic(bus, "fan");
    let subs: Vec<_> = (0..subscribers)
        .map(|_| {
            bus.subscribe(
                &topic,
                Selector::Partition(0),
                StartAt::Now,
                SubscribeOptions::default(),
            )
            .unwrap_or_else(|e| panic!("subscribe: {e}"))
        })
        .collect();
    let (started, last) = std::thread::scope(|scope| {
        let receivers: Vec<_> = subs
            .into_iter()
            .map(|mut sub| {
                scope.spawn(move || {
                    let mut seen = 0;
                    while seen < count {
                        match sub.recv_timeout(Duration::from_secs(60)) {
                            Ok(Some(item)) => {
                                std::hint::black_box(item);
                                seen += 1;
                            }
                            Ok(None) => panic!("bus fan-out stalled at {seen}"),
                            Err(e) => panic!("bus fan-out: {e}"),
                        }
                    }
                    Instant::now()
                })
            })
            .collect();
        let started = publish_batch(bus, &topic, count);
        let last = receivers
            .into_iter()
            .map(|r| r.join().expect("receiver"))
            .max()
            .unwrap_or(started);
        (started, last)
    });
    (subscribers * count) as f64 / (last - started).as_secs_f64()
}

/// Records delivered per second to `subscribers` raw push consumers in total.
fn fanout_raw(bus: &NatsBus, servers: &[String], subscribers: usize, count: usize) -> f64 {
    let topic = fresh_topic(bus, "fanraw");
    let next = bus.offsets(&topic, 0).expect("offsets").next;
    let raw = spawn_push_readers(
        servers,
        &stream_name(bus.prefix(), &topic, 0),
        next + 1,
        subscribers,
        count,
        Arc::new(|_, payload: &[u8]| {
            let value: Value = serde_json::from_slice(payload).unwrap_or(Value::Null);
            std::hint::black_box(value);
        }),
    )
    .unwrap_or_else(|e| panic!("raw readers: {e}"));
    let started = publish_batch(bus, &topic, count);
    let finished = raw
        .join()
        .expect("raw thread")
        .unwrap_or_else(|e| panic!("raw readers: {e}"));
    let last = finished.into_iter().max().unwrap_or(started);
    (subscribers * count) as f64 / (last - started).as_secs_f64()
}

/// utime + stime of this process, in clock ticks (1/100 s).
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of the file; `after` starts at field 3.
    let utime: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
    let stime: u64 = fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    utime + stime
}

/// This process's CPU share (%) and ticks over `secs`, with one idle
/// subscription waiting in `recv_timeout` or none.
fn idle_cpu(bus: &NatsBus, secs: u64, subscribed: bool) -> (f64, u64) {
    let topic = fresh_topic(bus, "idle");
    let mut sub = subscribed.then(|| {
        bus.subscribe(
            &topic,
            Selector::Partition(0),
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .unwrap_or_else(|e| panic!("subscribe: {e}"))
    });
    std::thread::sleep(Duration::from_secs(1));
    let before = cpu_ticks();
    let started = Instant::now();
    let window = Duration::from_secs(secs);
    while started.elapsed() < window {
        let left = window.saturating_sub(started.elapsed());
        match sub.as_mut() {
            Some(sub) => assert!(matches!(sub.recv_timeout(left), Ok(None))),
            None => std::thread::sleep(left),
        }
    }
    let ticks = cpu_ticks() - before;
    drop(sub);
    (ticks as f64 / (secs as f64 * 100.0) * 100.0, ticks)
}

fn main() {
    let args = args();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let options = NatsOptions::from_url(&args.url)
        .unwrap_or_else(|e| panic!("url: {e}"))
        .prefix(format!("bench-sub-{}", &id[..8]));
    let servers = options.servers.clone();
    let bus = NatsBus::connect_with(options).unwrap_or_else(|e| panic!("connect: {e}"));

    let (base_pct, base_ticks) = idle_cpu(&bus, args.idle_secs, false);
    let (idle_pct, idle_ticks) = idle_cpu(&bus, args.idle_secs, true);
    let ((bus50, bus99), (raw50, raw99)) = latency(&bus, &servers, args.serial);
    let bus_fan = fanout_bus(&bus, args.subscribers, args.fanout);
    let raw_fan = fanout_raw(&bus, &servers, args.subscribers, args.fanout);

    println!("| measure                                   |        bus |        raw | bus/raw |");
    println!("|-------------------------------------------|-----------:|-----------:|--------:|");
    println!(
        "| latency p50 publish call -> receipt (µs)  | {bus50:>10.0} | {raw50:>10.0} | {:>7.2} |",
        bus50 / raw50
    );
    println!(
        "| latency p99 publish call -> receipt (µs)  | {bus99:>10.0} | {raw99:>10.0} | {:>7.2} |",
        bus99 / raw99
    );
    println!(
        "| fan-out {:>3} subscribers, records/s total  | {bus_fan:>10.0} | {raw_fan:>10.0} | {:>7.2} |",
        args.subscribers,
        bus_fan / raw_fan
    );
    println!(
        "idle {}s: process CPU with no subscription {base_ticks} ticks = {base_pct:.2}%, with one idle subscription {idle_ticks} ticks = {idle_pct:.2}%",
        args.idle_secs
    );
    println!(
        "{}",
        json!({
            "serial": args.serial, "fanout_records": args.fanout, "subscribers": args.subscribers,
            "latency_us": {"bus": {"p50": bus50, "p99": bus99}, "raw": {"p50": raw50, "p99": raw99}},
            "fanout_records_per_s": {"bus": bus_fan, "raw": raw_fan},
            "idle_cpu_pct": {"no_subscription": base_pct, "one_subscription": idle_pct},
        })
    );
    let prefix = bus.prefix().to_owned();
    drop(bus);
    bus_bench::nats::delete_streams(&servers.join(","), &prefix);
}
