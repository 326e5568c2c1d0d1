//! A fetch racing retention never returns a page with a hole in it (C5,
//! C11).
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bus_core::{EventBus, Manifest, TopicSpec};
use bus_embedded::{EmbeddedBus, Options};
use serde_json::json;

use crate::support::TOPIC;

#[test]
fn fetch_across_retention_has_no_hole() {
    let dir = tempfile::tempdir().unwrap();
    let bus = EmbeddedBus::open_with(dir.path(), Options::default().segment_bytes(300)).unwrap();
    bus.provision(&Manifest::new([
        TopicSpec::new(TOPIC, 1).with_retention_ms(1)
    ]))
    .unwrap();
    for i in 0..200 {
        bus.publish(TOPIC, "k", &json!({ "i": i })).unwrap();
    }
    let done = AtomicBool::new(false);
    let (fetches, holes) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 200..3000 {
                bus.publish(TOPIC, "k", &json!({ "i": i })).unwrap();
                if i % 20 == 0 {
                    bus.maintenance(bus_core::now_ms().saturating_sub(2))
                        .unwrap();
                }
            }
            done.store(true, Ordering::SeqCst);
        });
        s.spawn(|| {
            while !done.load(Ordering::SeqCst) {
                let Ok(page) = bus.fetch(TOPIC, 0, 0, 100_000) else {
                    continue;
                };
                fetches.fetch_add(1, Ordering::Relaxed);
                let gaps = page.windows(2).filter(|w| w[1].offset != w[0].offset + 1);
                holes.fetch_add(gaps.count() as u64, Ordering::Relaxed);
            }
        });
    });
    assert!(fetches.load(Ordering::Relaxed) > 0);
    assert_eq!(
        holes.load(Ordering::Relaxed),
        0,
        "a fetch result had a hole"
    );
}
