//! Cold retention (C24, #30): whole objects whose newest record is older
//! than the cutoff expire, manifest first; reads below the new start begin
//! at it, as after hot retention; what expired is never archived again, and
//! archiving goes on at the end. Through `ColdBus`, `maintenance` runs it.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

mod common;

use std::sync::Arc;

use bus_cold::{ColdBus, ColdBusOptions, ColdLocation, ColdTier};
use bus_core::{EventBus, Manifest, TopicSpec};
use common::{locations, records, unique};

/// `records` stamps offset `n` at this plus `3 n` ms.
const BASE_MS: u64 = 1_700_000_000_000;

#[test]
fn expired_objects_go_whole_and_archiving_goes_on_at_the_end() {
    for (name, location, dir) in locations("retention") {
        let tier = ColdTier::open(&location).unwrap();
        let topic = unique("ret");
        let all = records(&topic, 0, 0, 500);
        for chunk in all[..300].chunks(100) {
            assert_eq!(
                tier.archive_records(&topic, 0, chunk).unwrap(),
                100,
                "{name}"
            );
        }
        // Nothing is older than a cutoff at the first record.
        assert_eq!(tier.expire(&topic, 0, BASE_MS).unwrap(), 0, "{name}");
        // [0, 100) is newest at 297 ms, [100, 200) at 597 ms: a cutoff at
        // 450 ms takes the first object only (never part of one).
        assert_eq!(
            tier.expire(&topic, 0, BASE_MS + 450).unwrap(),
            100,
            "{name}"
        );
        let manifest = tier.manifest(&topic, 0).unwrap();
        assert_eq!(
            (manifest.start(), manifest.end()),
            (Some(100), 300),
            "{name}"
        );
        let read = tier.read(&topic, 0, 0, 50).unwrap();
        assert_eq!(
            read,
            all[100..150],
            "{name}: a read below the start begins at it"
        );
        if let Some(dir) = &dir {
            // The expired object is gone from the store (local files).
            let objects = std::fs::read_dir(dir.path().join(&topic).join("0/objects"))
                .unwrap()
                .count();
            assert_eq!(objects, 2, "{name}: objects left");
        }
        // Archiving goes on at the end; what expired is not archived again.
        assert_eq!(
            tier.archive_records(&topic, 0, &all[..400]).unwrap(),
            100,
            "{name}"
        );
        // Everything expires: the tier is empty but remembers its end.
        assert_eq!(
            tier.expire(&topic, 0, BASE_MS + 10_000).unwrap(),
            300,
            "{name}"
        );
        let manifest = tier.manifest(&topic, 0).unwrap();
        assert_eq!((manifest.start(), manifest.end()), (None, 400), "{name}");
        assert!(tier.read(&topic, 0, 0, 10).unwrap().is_empty(), "{name}");
        assert_eq!(
            tier.archive_records(&topic, 0, &all[..400]).unwrap(),
            0,
            "{name}"
        );
        let gap = tier.archive_records(&topic, 0, &all[450..]);
        assert!(
            gap.is_err(),
            "{name}: a gap after the expired end is refused"
        );
        assert_eq!(
            tier.archive_records(&topic, 0, &all[400..]).unwrap(),
            100,
            "{name}"
        );
        assert_eq!(tier.read(&topic, 0, 0, 1000).unwrap(), all[400..], "{name}");
        // A second reader that cached the old manifest reads on after expiry.
        let reader = ColdTier::open(&location).unwrap();
        if name != "memory" {
            assert_eq!(
                reader.read(&topic, 0, 0, 1).unwrap(),
                all[400..401],
                "{name}"
            );
        }
    }
}

#[test]
fn maintenance_of_a_cold_bus_expires_cold_history() {
    let tier = Arc::new(ColdTier::open(&ColdLocation::Memory).unwrap());
    let bus = ColdBus::new(
        bus_core::memory::MemoryBus::new(),
        Arc::clone(&tier),
        ColdBusOptions::default()
            .object_records(10)
            .cold_retention_ms(60_000),
    );
    bus.provision(&Manifest::new([TopicSpec::new("audit", 1)]))
        .unwrap();
    for n in 0..30 {
        bus.publish("audit", "k", &serde_json::json!({ "n": n }))
            .unwrap();
    }
    let now = bus_core::now_ms();
    // Archived through the head, nothing old enough to expire.
    bus.maintenance(now).unwrap();
    assert_eq!(tier.manifest("audit", 0).unwrap().end(), 30);
    bus.delete_below("audit", 0, 30).unwrap();
    assert_eq!(bus.fetch("audit", 0, 0, 100).unwrap().len(), 30);
    // A day later every object is past the cold retention.
    bus.maintenance(now + 86_400_000).unwrap();
    let manifest = tier.manifest("audit", 0).unwrap();
    assert_eq!((manifest.start(), manifest.end()), (None, 30));
    assert!(bus.fetch("audit", 0, 0, 100).unwrap().is_empty());
    let ack = bus
        .publish("audit", "k", &serde_json::json!({ "n": 30 }))
        .unwrap();
    assert_eq!(ack.offset, 30);
    assert_eq!(bus.fetch("audit", 0, 0, 100).unwrap()[0].offset, 30);
}
