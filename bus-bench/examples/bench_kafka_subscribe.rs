//! Live subscriptions of bus-kafka beside raw rdkafka consumers.
//!
//! ```text
//! BUS_KAFKA_BROKERS=127.0.0.1:9092 cargo run --release -p bus-bench --features kafka \
//!     --example bench_kafka_subscribe -- [--serial N] [--fanout N] [--subscribers N] [--idle-secs N]
//! ```
//! - latency: one bus subscription and one raw consumer assigned to the same
//!   partition receive the same records in the same run, published one at a
//!   time by a serial publisher; each value carries the time its publish
//!   call started, and each side notes when it received it (p50/p99).
//! - fan-out: N subscribers (bus), then N raw consumers, receive a batch of
//!   records published after they started; total records delivered per
//!   second from the first publish to the last receipt.
//! - idle: this process's CPU time over `--idle-secs` with one idle
//!   subscription (from /proc/self/stat).
//!
//! Both sides fetch with `fetch.min.bytes=1` (the broker answers a Fetch as
//! soon as a record is there) and `fetch.wait.max.ms=1000` (how long it holds
//! an empty one): the bus's subscription consumer uses these, and so does
//! the raw consumer here.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bus_core::{
    BatchRecord, EventBus, Manifest, Selector, StartAt, SubscribeOptions, SubscriptionItem,
    TopicSpec,
};
use bus_kafka::{KafkaBus, KafkaOptions, kafka_topic_name};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::{Value, json};

struct Args {
    brokers: String,
    serial: usize,
    fanout: usize,
    subscribers: usize,
    idle_secs: u64,
}

fn args() -> Args {
    let mut out = Args {
        brokers: std::env::var("BUS_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into()),
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
            "--brokers" => out.brokers = value,
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

/// A raw consumer assigned to partition 0 of `kafka_topic` at `offset`,
/// fetching as the bus's subscriptions do.
fn raw_consumer(brokers: &str, kafka_topic: &str, offset: u64) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "group.id",
            format!("bench-raw-{}", uuid::Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.min.bytes", "1")
        .set("fetch.wait.max.ms", "1000")
        .set("queued.min.messages", "1000")
        .set("queued.max.messages.kbytes", "2048")
        .create()
        .unwrap_or_else(|e| panic!("raw consumer: {e}"));
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(kafka_topic, 0, Offset::Offset(offset as i64))
        .unwrap_or_else(|e| panic!("list: {e}"));
    consumer
        .assign(&list)
        .unwrap_or_else(|e| panic!("assign: {e}"));
    consumer
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

fn provision(bus: &KafkaBus, topic: &str) {
    bus.provision(&Manifest::new([TopicSpec::new(topic, 1)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
}

/// p50/p99 publish-call → receipt in µs, bus then raw.
fn latency(bus: &KafkaBus, brokers: &str, serial: usize) -> ((f64, f64), (f64, f64)) {
    let topic = format!(
        "bench-sub-lat-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    provision(bus, &topic);
    let start = bus.offsets(&topic, 0).expect("offsets").next;
    let base = Instant::now();
    let mut sub = bus
        .subscribe(
            &topic,
            Selector::Partition(0),
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .unwrap_or_else(|e| panic!("subscribe: {e}"));
    let raw = raw_consumer(brokers, &kafka_topic_name(&topic), start);
    let (bus_lat, raw_lat) = std::thread::scope(|scope| {
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
        let raw_side = scope.spawn(|| {
            let mut out = Vec::with_capacity(serial);
            while out.len() < serial {
                match raw.poll(Duration::from_secs(10)) {
                    Some(Ok(message)) => {
                        let now = base.elapsed().as_nanos() as f64;
                        let value: Value =
                            serde_json::from_slice(message.payload().unwrap_or_default())
                                .unwrap_or_else(|e| panic!("raw payload: {e}"));
                        let sent = value["sent_ns"].as_u64().unwrap_or(0) as f64;
                        out.push((now - sent) / 1e3);
                    }
                    Some(Err(e)) => panic!("raw consumer: {e}"),
                    None => {}
                }
            }
            out
        });
        // Let both consumers settle at the end before timing anything.
        std::thread::sleep(Duration::from_millis(500));
        for i in 0..serial {
            let sent = base.elapsed().as_nanos();
            bus.publish(&topic, "k", &event(i, sent))
                .unwrap_or_else(|e| panic!("publish: {e}"));
        }
        (
            bus_side.join().expect("bus side"),
            raw_side.join().expect("raw side"),
        )
    });
    let _ = bus.delete_topics(&[topic]);
    let stats = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (percentile(&v, 0.5), percentile(&v, 0.99))
    };
    (stats(bus_lat), stats(raw_lat))
}

/// Records delivered per second to `subscribers` receivers in total.
fn fanout(bus: &KafkaBus, brokers: &str, subscribers: usize, count: usize, raw: bool) -> f64 {
    let topic = format!(
        "bench-sub-fan-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    provision(bus, &topic);
    let start = bus.offsets(&topic, 0).expect("offsets").next;
    let kafka_topic = kafka_topic_name(&topic);
    let ready = Arc::new(std::sync::Barrier::new(subscribers + 1));
    let stop = AtomicBool::new(false);
    let (elapsed, delivered) = std::thread::scope(|scope| {
        let mut receivers = Vec::new();
        for _ in 0..subscribers {
            let ready = Arc::clone(&ready);
            let (topic, kafka_topic, stop) = (&topic, &kafka_topic, &stop);
            receivers.push(scope.spawn(move || {
                let mut seen = 0;
                if raw {
                    let consumer = raw_consumer(brokers, kafka_topic, start);
                    ready.wait();
                    while seen < count && !stop.load(Ordering::Relaxed) {
                        if let Some(Ok(message)) = consumer.poll(Duration::from_secs(1)) {
                            let value: Value =
                                serde_json::from_slice(message.payload().unwrap_or_default())
                                    .unwrap_or(Value::Null);
                            std::hint::black_box(value);
                            seen += 1;
                        }
                    }
                } else {
                    let mut sub = bus
                        .subscribe(
                            topic,
                            Selector::Partition(0),
                            StartAt::Offset(start),
                            SubscribeOptions::default(),
                        )
                        .unwrap_or_else(|e| panic!("subscribe: {e}"));
                    ready.wait();
                    while seen < count && !stop.load(Ordering::Relaxed) {
                        if let Ok(Some(item)) = sub.recv_timeout(Duration::from_secs(1)) {
                            std::hint::black_box(item);
                            seen += 1;
                        }
                    }
                }
                (seen, Instant::now())
            }));
        }
        ready.wait();
        let started = Instant::now();
        let records: Vec<BatchRecord> = (0..count)
            .map(|i| BatchRecord::new("k", event(i, 0)))
            .collect();
        for chunk in records.chunks(1_000) {
            bus.publish_batch(&topic, chunk)
                .unwrap_or_else(|e| panic!("publish: {e}"));
        }
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut last = started;
        let mut delivered = 0;
        for receiver in receivers {
            while !receiver.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if Instant::now() >= deadline {
                stop.store(true, Ordering::Relaxed);
            }
            let (seen, done) = receiver.join().expect("receiver");
            delivered += seen;
            last = last.max(done);
        }
        (last - started, delivered)
    });
    let _ = bus.delete_topics(&[topic]);
    delivered as f64 / elapsed.as_secs_f64()
}

/// utime + stime of this process, in clock ticks.
fn cpu_ticks() -> u64 {
    stat_ticks("/proc/self/stat")
}

/// utime + stime from a `stat` file of procfs.
fn stat_ticks(path: &str) -> u64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of the file; `after` starts at field 3.
    let utime: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
    let stime: u64 = fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    utime + stime
}

/// Each thread of this process: its name and CPU ticks so far.
fn thread_ticks() -> std::collections::HashMap<String, (String, u64)> {
    let mut out = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let tid = entry.file_name().to_string_lossy().into_owned();
        let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        let ticks = stat_ticks(&format!("/proc/self/task/{tid}/stat"));
        out.insert(tid, (name.trim().to_owned(), ticks));
    }
    out
}

/// This process's CPU share over `secs` with one idle subscription (or
/// none: what the bus's own clients cost idle).
fn idle_cpu(bus: &KafkaBus, secs: u64, subscribed: bool) -> (f64, u64) {
    let topic = format!(
        "bench-sub-idle-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    provision(bus, &topic);
    let _ = bus.offsets(&topic, 0);
    let bus_threads = thread_ticks();
    let mut sub = subscribed.then(|| {
        bus.subscribe(
            &topic,
            Selector::Partition(0),
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .unwrap_or_else(|e| panic!("subscribe: {e}"))
    });
    // Let connections settle first.
    std::thread::sleep(Duration::from_secs(2));
    let before = cpu_ticks();
    let threads_before = thread_ticks();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(secs) {
        let left = Duration::from_secs(secs).saturating_sub(started.elapsed());
        match sub.as_mut() {
            Some(sub) => assert!(matches!(sub.recv_timeout(left), Ok(None))),
            None => std::thread::sleep(left),
        }
    }
    let ticks = cpu_ticks() - before;
    // The subscription's threads are those started by `subscribe`.
    let (mut own, mut others) = (0, 0);
    let mut busy: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for (tid, (name, after)) in thread_ticks() {
        if let Some((_, before)) = threads_before.get(&tid) {
            let spent = after.saturating_sub(*before);
            if bus_threads.contains_key(&tid) {
                others += spent;
                *busy.entry(name).or_default() += spent;
            } else {
                own += spent;
            }
        }
    }
    busy.retain(|_, ticks| *ticks > 0);
    let what = if subscribed {
        "with one subscription"
    } else {
        "without subscriptions"
    };
    println!(
        "idle {secs}s {what}: process {ticks} ticks; the subscription's threads {own}; the bus's and others' {others}, by name {busy:?}"
    );
    drop(sub);
    let _ = bus.delete_topics(&[topic]);
    // Linux reports ticks of 1/100 s.
    (ticks as f64 / (secs as f64 * 100.0) * 100.0, ticks)
}

fn main() {
    let args = args();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let options = KafkaOptions::new(args.brokers.split(',').map(str::to_owned))
        .manifest_topic(format!("bench-sub-manifest-{}", &id[..8]));
    let bus = KafkaBus::connect_with(options).unwrap_or_else(|e| panic!("connect: {e}"));

    let (base_pct, base_ticks) = idle_cpu(&bus, args.idle_secs, false);
    let (idle_pct, idle_ticks) = idle_cpu(&bus, args.idle_secs, true);
    if args.serial == 0 {
        println!(
            "idle {}s: no subscription {base_ticks} ticks, one subscription {idle_ticks} ticks",
            args.idle_secs
        );
        let _ = bus.delete_topics(&bus.topics());
        return;
    }
    let ((bus50, bus99), (raw50, raw99)) = latency(&bus, &args.brokers, args.serial);
    let bus_fan = fanout(&bus, &args.brokers, args.subscribers, args.fanout, false);
    let raw_fan = fanout(&bus, &args.brokers, args.subscribers, args.fanout, true);

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
    let _ = bus.delete_topics(&bus.topics());
}
