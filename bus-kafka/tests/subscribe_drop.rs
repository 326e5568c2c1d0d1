//! C17 for Kafka subscriptions, by the process's own threads and file
//! descriptors: the subscriptions of a bus share one consumer, so a
//! thousand of them cost what one does; dropping them and subscribing and
//! dropping in a loop leaks nothing; dropping the bus releases the rest.
//! One test alone in this binary, so the counts move only with it.

mod common;

use std::time::{Duration, Instant};

use bus_conformance::util::publish_n;
use bus_core::{EventBus, Manifest, Selector, StartAt, SubscribeOptions, Subscription, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions};

/// Live subscriptions held at once.
const MANY: usize = 1_000;
/// Subscribe/drop iterations.
const LOOP: usize = 10_000;
const WAIT: Duration = Duration::from_secs(30);
/// Connections librdkafka may open or close on its own meanwhile.
const SOCKETS: usize = 2;

/// Publishes one record and checks every subscription in `subs` gets it.
fn receive_next(bus: &KafkaBus, topic: &str, subs: &mut [Subscription]) {
    let acks = publish_n(bus, topic, "k", 1);
    for sub in subs {
        let item = sub
            .recv_timeout(WAIT)
            .unwrap_or_else(|e| panic!("recv: {e}"))
            .unwrap_or_else(|| panic!("no record within {WAIT:?}"));
        let event = item
            .event()
            .unwrap_or_else(|| panic!("not a record: {item:?}"));
        assert_eq!(
            (event.partition, event.offset),
            (acks[0].partition, acks[0].offset)
        );
    }
}

/// Threads of this process, from `/proc/self/task`.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count)
}

/// Open file descriptors of this process, from `/proc/self/fd`.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

/// What the open file descriptors are (for a failure's message).
fn fd_targets() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let target = std::fs::read_link(entry.ok()?.path()).ok()?;
        Some(target.display().to_string())
    })
    .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Usage {
    threads: usize,
    fds: usize,
}

impl Usage {
    /// This, give or take the connections librdkafka opens and closes on
    /// its own.
    fn plus_sockets(self) -> Self {
        Self {
            threads: self.threads,
            fds: self.fds + SOCKETS,
        }
    }
}

fn usage() -> Usage {
    Usage {
        threads: threads(),
        fds: fds(),
    }
}

/// Waits until the usage is at most `limit` (threads end and sockets close
/// a little after the call that ends them returns).
fn settles_to(what: &str, limit: Usage) -> Usage {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut pause = Duration::from_millis(1);
    loop {
        let now = usage();
        if now.threads <= limit.threads && now.fds <= limit.fds {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: still {now:?} after 10 s, want at most {limit:?}; fds: {:?}",
            fd_targets()
        );
        pause = (pause * 2).min(Duration::from_millis(50));
        std::thread::park_timeout(pause);
    }
}

#[test]
fn subscriptions_share_one_consumer_and_leak_nothing() {
    let test = "subscriptions_share_one_consumer_and_leak_nothing";
    let brokers = match common::brokers() {
        Ok(brokers) => brokers,
        Err(why) => return common::skip(test, &why),
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let manifest = format!("bus-test-manifest-{}", &id[..16]);
    let options =
        KafkaOptions::new(brokers.split(',').map(str::to_owned)).manifest_topic(manifest.clone());
    let bus = KafkaBus::connect_with(options).unwrap_or_else(|e| panic!("connect: {e}"));
    let topic = "sub-drop";
    bus.provision(&Manifest::new([TopicSpec::new(topic, 2)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    publish_n(&bus, topic, "k", 3);
    // Warm the bus's own clients (query consumer, producer) first.
    let _ = bus.offsets(topic, 0);
    let subscribe = || {
        bus.subscribe(
            topic,
            Selector::Topic,
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .unwrap_or_else(|e| panic!("subscribe: {e}"))
    };
    let zero = usage();

    // The first subscription starts the bus's shared consumer; once it has
    // had a record, that consumer's connections are up.
    let mut first = subscribe();
    receive_next(&bus, topic, std::slice::from_mut(&mut first));
    let one = usage();

    let started = Instant::now();
    let mut subs: Vec<_> = (1..MANY).map(|_| subscribe()).collect();
    subs.push(first);
    let subscribed_in = started.elapsed();
    let many = usage();
    let started = Instant::now();
    receive_next(&bus, topic, &mut subs);
    let received_in = started.elapsed();
    let busy = usage();
    assert!(
        busy.threads <= one.threads && busy.fds <= one.fds + SOCKETS,
        "resources grow with subscriptions: {one:?} with one, {busy:?} with {MANY}"
    );
    let started = Instant::now();
    drop(subs);
    let dropped_in = started.elapsed();
    let none = settles_to("the subscriptions' resources to go", one.plus_sockets());

    let started = Instant::now();
    for _ in 0..LOOP {
        drop(subscribe());
    }
    let looped_in = started.elapsed();
    // The shared consumer still serves after as many assignments and
    // unassignments.
    let mut last = subscribe();
    receive_next(&bus, topic, std::slice::from_mut(&mut last));
    drop(last);
    let after_loop = settles_to("the loop's resources to go", one.plus_sockets());

    let _ = bus.delete_topics(&bus.topics());
    drop(bus);
    let closed = settles_to("the bus's threads to end", zero);

    println!("kafka subscriptions, threads/fds of the process:");
    println!("  0 subscriptions (bus warm):  {zero:?}");
    println!("  1 subscription:              {one:?}");
    println!(
        "  {MANY} subscriptions:         {many:?} (subscribed in {subscribed_in:?}), {busy:?} after each received a record ({received_in:?})"
    );
    println!("  0 again:                     {none:?} (dropped in {dropped_in:?})");
    println!("  after {LOOP} subscribe/drop:  {after_loop:?} ({looped_in:?})");
    println!("  bus dropped:                 {closed:?}");
    common::delete_raw_topics(&brokers, &[manifest]);
}
