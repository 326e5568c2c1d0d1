//! Dropping a read-only open's subscription ends its watcher thread
//! (contract C17). One test in this binary, so the thread count of the
//! process is this test's own.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use bus_core::{EventBus, Manifest, Selector, StartAt, SubscribeOptions, TopicSpec};
use bus_embedded::EmbeddedBus;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Waits (by yielding, up to a deadline) until the thread count is `n`.
fn until_threads(n: usize) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if threads() == n {
            return true;
        }
        std::thread::yield_now();
    }
    false
}

#[test]
fn dropping_a_read_only_subscription_ends_its_watcher_thread() {
    let dir = tempfile::tempdir().unwrap();
    let writer = EmbeddedBus::open(dir.path()).unwrap();
    writer
        .provision(&Manifest::new([TopicSpec::new("t", 4)]))
        .unwrap();
    let reader = EmbeddedBus::open_read_only(dir.path()).unwrap();
    let baseline = threads();
    let subscribe = || {
        reader
            .subscribe(
                "t",
                Selector::Topic,
                StartAt::Now,
                SubscribeOptions::default(),
            )
            .unwrap()
    };
    let first = subscribe();
    let second = subscribe();
    let with_two = threads();
    assert!(with_two > baseline, "a watcher thread per subscription");
    drop(first);
    assert!(
        until_threads(with_two - (with_two - baseline) / 2),
        "one watcher ended"
    );
    drop(second);
    assert!(until_threads(baseline), "every watcher ended");
}
