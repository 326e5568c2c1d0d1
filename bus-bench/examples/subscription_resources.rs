//! What live subscriptions cost a NATS or PostgreSQL bus (issue 26): the
//! process's threads and open files at 0, 1,000 and 0 again subscriptions,
//! after a subscribe/drop loop, and the serial publish rate with 0, 16 and
//! 256 subscribers receiving (ratios to none, in one run). A program that
//! prints a table, not a timed test.
//!
//! ```sh
//! BUS_NATS_URL=nats://127.0.0.1:4222 cargo run --release -p bus-bench --features nats,postgres --example subscription_resources
//! BUS_POSTGRES_URL=postgres://bus:bus@127.0.0.1:5433/bus cargo run --release -p bus-bench --features nats,postgres --example subscription_resources
//! ```
//! `LOOP=N` sets the subscribe/drop iterations (10,000), `PUBLISHES=N` the
//! publishes per rate (2,000).

use std::time::{Duration, Instant};

use bus_core::{
    EventBus, Manifest, Selector, StartAt, SubscribeOptions, Subscription, SubscriptionItem,
    TopicSpec,
};
use serde_json::json;

const TOPIC: &str = "resources";

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count)
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn subscribe(bus: &dyn EventBus) -> Subscription {
    bus.subscribe(
        TOPIC,
        Selector::Topic,
        StartAt::Now,
        SubscribeOptions::default(),
    )
    .expect("subscribe")
}

/// Threads and fds once they stop falling (dropped subscriptions release
/// what they hold before `drop` returns; client libraries may lag).
fn settled() -> (usize, usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = (threads(), fds());
    while Instant::now() < deadline {
        std::thread::yield_now();
        let now = (threads(), fds());
        if now == last {
            break;
        }
        last = now;
    }
    last
}

fn publish_rate(bus: &dyn EventBus, subscribers: usize, publishes: usize) -> f64 {
    let mut subs: Vec<Subscription> = (0..subscribers).map(|_| subscribe(bus)).collect();
    std::thread::scope(|scope| {
        for sub in &mut subs {
            scope.spawn(move || {
                let mut got = 0;
                while got < publishes {
                    match sub.recv_timeout(Duration::from_secs(30)) {
                        Ok(Some(SubscriptionItem::Record { .. })) => got += 1,
                        Ok(Some(SubscriptionItem::Lagged { skipped, .. })) => {
                            got += usize::try_from(skipped).unwrap_or(usize::MAX);
                        }
                        Ok(None) => panic!("a subscriber stopped receiving at {got}"),
                        Err(error) => panic!("subscriber: {error}"),
                    }
                }
            });
        }
        let started = Instant::now();
        for n in 0..publishes {
            bus.publish(TOPIC, "k", &json!({ "n": n }))
                .expect("publish");
        }
        publishes as f64 / started.elapsed().as_secs_f64()
    })
}

fn measure(name: &str, bus: &dyn EventBus) {
    let iterations = env_usize("LOOP", 10_000);
    let publishes = env_usize("PUBLISHES", 2_000);
    bus.provision(&Manifest::new([TopicSpec::new(TOPIC, 1)]))
        .expect("provision");
    // The bus's own machinery (connector, pools) is up before the baseline.
    drop(subscribe(bus));
    let zero = settled();
    let started = Instant::now();
    let mut subs: Vec<Subscription> = (0..1_000).map(|_| subscribe(bus)).collect();
    let subscribed = started.elapsed();
    let thousand = settled();
    bus.publish(TOPIC, "k", &json!({"n": -1})).expect("publish");
    let received = subs
        .iter_mut()
        .map(|sub| sub.recv_timeout(Duration::from_secs(30)))
        .filter(|item| matches!(item, Ok(Some(SubscriptionItem::Record { .. }))))
        .count();
    let started = Instant::now();
    drop(subs);
    let dropped = started.elapsed();
    let again = settled();
    let started = Instant::now();
    for _ in 0..iterations {
        drop(subscribe(bus));
    }
    let looped = started.elapsed();
    let after = settled();
    println!("{name}: threads / fds");
    println!("  0 subscriptions        {:>5} / {:>5}", zero.0, zero.1);
    println!(
        "  1,000 subscriptions    {:>5} / {:>5}   (subscribed in {subscribed:.2?}; {received} of 1,000 received a record)",
        thousand.0, thousand.1
    );
    println!(
        "  0 again                {:>5} / {:>5}   (dropped in {dropped:.2?})",
        again.0, again.1
    );
    println!(
        "  after {iterations} subscribe/drop {:>5} / {:>5}   ({looped:.2?})",
        after.0, after.1
    );
    let none = publish_rate(bus, 0, publishes);
    println!("{name}: serial publish rate with subscribers receiving ({publishes} publishes each)");
    println!("  {:>4} subscribers {:>10.0} /s  1.00", 0, none);
    for subscribers in [16, 256] {
        let rate = publish_rate(bus, subscribers, publishes);
        println!(
            "  {subscribers:>4} subscribers {rate:>10.0} /s  {:.2}",
            rate / none
        );
    }
}

fn main() {
    let id = std::process::id();
    if let Ok(url) = std::env::var("BUS_NATS_URL") {
        let prefix = format!("res-{id}");
        let options = bus_nats::NatsOptions::from_url(&url)
            .expect("BUS_NATS_URL")
            .prefix(prefix.clone());
        let bus = bus_nats::NatsBus::connect_with(options).expect("connect");
        measure("nats", &bus);
        drop(bus);
        bus_bench::nats::delete_streams(url.trim_start_matches("nats://"), &prefix);
    }
    if let Ok(url) = std::env::var("BUS_POSTGRES_URL") {
        let schema = format!("res_{id}");
        let options = bus_postgres::PostgresOptions::from_url(&url)
            .expect("BUS_POSTGRES_URL")
            .schema(&schema);
        let bus = bus_postgres::PostgresBus::connect_with(options).expect("connect");
        measure("postgres", &bus);
        println!("(schema {schema} left in place: drop it with DROP SCHEMA {schema} CASCADE)");
    }
}
