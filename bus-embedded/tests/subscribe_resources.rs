//! What live subscriptions hold (contract C17): threads, file descriptors
//! and inotify instances of the process with none, 1,000 and none again,
//! for the memory bus, the embedded writer and a read-only embedded open;
//! and a 10,000-iteration subscribe/drop loop that leaks nothing. One test
//! in this binary, so the process's counts are this test's own.
//!
//! The figures are printed (`--nocapture`) for the record.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use bus_core::memory::MemoryBus;
use bus_core::{EventBus, Manifest, Selector, StartAt, SubscribeOptions, TopicSpec};
use bus_embedded::EmbeddedBus;
use serde_json::json;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Usage {
    threads: usize,
    fds: usize,
    inotify: usize,
    /// Directories watched through those instances.
    watches: usize,
}

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "threads {:>3}  fds {:>3}  inotify {:>2} ({} watches)",
            self.threads, self.fds, self.inotify, self.watches
        )
    }
}

fn usage() -> Usage {
    let threads = std::fs::read_dir("/proc/self/task").unwrap().count();
    let (mut fds, mut inotify, mut watches) = (0, 0, 0);
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let entry = entry.unwrap();
        // The listing's own fd is gone by the time it is read: skip it.
        let Ok(link) = std::fs::read_link(entry.path()) else {
            continue;
        };
        fds += 1;
        if link.to_string_lossy() == "anon_inode:inotify" {
            inotify += 1;
            let info = format!("/proc/self/fdinfo/{}", entry.file_name().to_string_lossy());
            let info = std::fs::read_to_string(info).unwrap_or_default();
            watches += info
                .lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count();
        }
    }
    Usage {
        threads,
        fds,
        inotify,
        watches,
    }
}

/// Waits (by yielding, up to a deadline) until the usage is `want`; what
/// it is at the end otherwise. Only the drop of a whole read-only open
/// needs it: its watcher's thread exits just after.
fn until(want: Usage) -> Usage {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = usage();
        if now == want || Instant::now() >= deadline {
            return now;
        }
        std::thread::yield_now();
    }
}

fn subscribe(bus: &dyn EventBus) -> bus_core::Subscription {
    bus.subscribe(
        "t",
        Selector::Topic,
        StartAt::Beginning,
        SubscribeOptions::default(),
    )
    .unwrap()
}

/// 0, 1,000 and 0 again subscriptions of `bus`, each having received the
/// topic's one record; then 10,000 subscribe/receive/drop. Returns the
/// usage at 1,000.
fn cycle(name: &str, bus: &dyn EventBus) -> Usage {
    // One subscription first: what a bus keeps for the life of the open
    // once a subscription has read (a read-only open's one watcher, the
    // open segment files) is its baseline, not a subscription's.
    let mut first = subscribe(bus);
    assert!(
        first
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .is_some()
    );
    drop(first);
    let zero = usage();
    let mut subs: Vec<_> = (0..1000).map(|_| subscribe(bus)).collect();
    for sub in &mut subs {
        assert!(sub.recv_timeout(Duration::from_secs(10)).unwrap().is_some());
    }
    let thousand = usage();
    drop(subs);
    let again = usage();
    for _ in 0..10_000 {
        let mut sub = subscribe(bus);
        assert!(sub.try_recv().unwrap().is_some());
    }
    let looped = usage();
    println!(
        "{name:<20} 0: {zero} | 1000: {thousand} | 0 again: {again} | after 10,000 subscribe/drop: {looped}"
    );
    assert_eq!(again, zero, "{name}: 1,000 subscriptions dropped");
    assert_eq!(looped, zero, "{name}: 10,000 subscribe/drop");
    assert_eq!(
        zero.watches, 0,
        "{name}: no directory watched without subscriptions"
    );
    assert_eq!(
        thousand.threads, zero.threads,
        "{name}: no thread per subscription"
    );
    assert_eq!(
        thousand.inotify, zero.inotify,
        "{name}: no inotify instance per subscription"
    );
    assert_eq!(thousand.fds, zero.fds, "{name}: no fd per subscription");
    thousand
}

#[test]
fn subscriptions_hold_no_thread_fd_or_inotify_instance_of_their_own() {
    let start = usage();
    println!("process at start     {start}");

    let memory = MemoryBus::new();
    memory
        .provision(&Manifest::new([TopicSpec::new("t", 4)]))
        .unwrap();
    memory.publish("t", "k", &json!({"n": 1})).unwrap();
    cycle("memory", &memory);
    drop(memory);

    let dir = tempfile::tempdir().unwrap();
    let writer = EmbeddedBus::open(dir.path()).unwrap();
    writer
        .provision(&Manifest::new([TopicSpec::new("t", 4)]))
        .unwrap();
    writer.publish("t", "k", &json!({"n": 1})).unwrap();
    cycle("embedded writer", &writer);

    let before_reader = usage();
    let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
    let opened = usage();
    println!("read-only open, no subscription yet: {opened}");
    let thousand = cycle("embedded read-only", &reader);
    assert_eq!(
        thousand.inotify,
        opened.inotify + 1,
        "one inotify instance for the whole open"
    );
    assert!(thousand.threads <= opened.threads + 1, "one watcher thread");
    assert_eq!(thousand.watches, 4, "each partition directory watched once");
    drop(reader);
    let closed = until(before_reader);
    println!("read-only open dropped: {closed}");
    assert_eq!(closed, before_reader, "the open's watcher went with it");
}
