//! The Kafka publish rate with 0, 16 and 256 live subscribers of the same
//! bus, as ratios to the rate with none, in one run (#26, item 8).
//!
//! ```text
//! BUS_KAFKA_BROKERS=127.0.0.1:9092 cargo run --release -p bus-kafka \
//!     --example publish_with_subscribers -- [--records N] [--counts 0,16,256]
//! ```
//! Each round publishes N records one at a time (each waits for its ack)
//! onto a 1-partition topic, with that many subscriptions of the topic
//! started at "now": first held idle (the publish path's own cost of them),
//! then each received by a thread of its own (every subscriber gets every
//! record while the publisher runs). Also prints the process's threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bus_core::{EventBus, Manifest, Selector, StartAt, SubscribeOptions, Subscription, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions};
use serde_json::json;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count)
}

fn subscribe(bus: &KafkaBus, topic: &str) -> Subscription {
    bus.subscribe(
        topic,
        Selector::Topic,
        StartAt::Now,
        SubscribeOptions::default(),
    )
    .unwrap_or_else(|e| panic!("subscribe: {e}"))
}

/// Records per second of `records` serial publishes.
fn publish_rate(bus: &KafkaBus, topic: &str, records: usize) -> f64 {
    let started = Instant::now();
    for n in 0..records {
        bus.publish(topic, "k", &json!({ "n": n, "body": "x".repeat(140) }))
            .unwrap_or_else(|e| panic!("publish: {e}"));
    }
    records as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let mut records = 2_000;
    let mut counts = vec![0, 16, 256];
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_default();
        match flag.as_str() {
            "--records" => records = value.parse().unwrap_or(records),
            "--counts" => counts = value.split(',').filter_map(|n| n.parse().ok()).collect(),
            other => panic!("unknown flag {other}"),
        }
    }
    let brokers = std::env::var("BUS_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let id = uuid::Uuid::new_v4().simple().to_string();
    let options = KafkaOptions::new(brokers.split(',').map(str::to_owned));
    let bus = KafkaBus::connect_with(options).unwrap_or_else(|e| panic!("connect: {e}"));
    let topic = format!("bench-pub-{}", &id[..8]);
    bus.provision(&Manifest::new([TopicSpec::new(topic.clone(), 1)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    // Warm up the producer, the connection and the broker's page cache.
    publish_rate(&bus, &topic, records / 4);

    let mut idle = Vec::new();
    let mut receiving = Vec::new();
    for &count in &counts {
        let subs: Vec<Subscription> = (0..count).map(|_| subscribe(&bus, &topic)).collect();
        let rate = publish_rate(&bus, &topic, records);
        idle.push((count, rate, threads()));
        drop(subs);

        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (0..count)
            .map(|_| {
                let mut sub = subscribe(&bus, &topic);
                let (stop, received) = (Arc::clone(&stop), Arc::clone(&received));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(Some(_)) = sub.recv_timeout(Duration::from_millis(100)) {
                            received.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        let started = Instant::now();
        let rate = publish_rate(&bus, &topic, records);
        let during = threads();
        // Every subscriber gets every record before the next round.
        let all = u64::try_from(count * records).unwrap_or(u64::MAX);
        let deadline = Instant::now() + Duration::from_secs(60);
        while received.load(Ordering::Relaxed) < all && Instant::now() < deadline {
            std::thread::park_timeout(Duration::from_millis(10));
        }
        let delivered_in = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        for worker in workers {
            let _ = worker.join();
        }
        receiving.push((
            count,
            rate,
            during,
            received.load(Ordering::Relaxed),
            delivered_in,
        ));
    }

    println!("kafka publish rate, {records} serial publishes per round:");
    let base = idle.first().map_or(1.0, |&(_, rate, _)| rate);
    for &(count, rate, threads) in &idle {
        println!(
            "  {count:>4} idle subscribers:      {rate:>8.0}/s  ratio {:.2}  threads {threads}",
            rate / base
        );
    }
    let base = receiving.first().map_or(1.0, |&(_, rate, _, _, _)| rate);
    for &(count, rate, threads, received, took) in &receiving {
        println!(
            "  {count:>4} receiving subscribers: {rate:>8.0}/s  ratio {:.2}  threads {threads} (subscriber threads included)  received {received} in {took:.1?}",
            rate / base
        );
    }
    let _ = bus.delete_topics(&bus.topics());
}
