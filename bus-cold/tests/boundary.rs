//! `ColdBus` at the hot/cold boundary (C24): reads racing an archiver that
//! trims the hot log under them are never short in the middle, never
//! gapped; a range dropped before it was archived is an error naming it;
//! headers and tags come back from the tier.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bus_cold::{ColdBus, ColdBusOptions, ColdLocation, ColdTier};
use bus_core::memory::MemoryBus;
use bus_core::{BusError, EventBus, Headers, Manifest, TopicSpec};
use serde_json::json;

fn cold_bus(options: ColdBusOptions) -> ColdBus<MemoryBus> {
    let tier = Arc::new(ColdTier::open(&ColdLocation::Memory).unwrap());
    let bus = ColdBus::new(MemoryBus::new(), tier, options);
    bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
        .unwrap();
    bus
}

/// A publisher, an archiver trimming the hot log to its last record as
/// fast as it can, and readers paging from 0: every page a reader gets is
/// consecutive from the offset it asked for, and a full replay holds every
/// record published before it began.
#[test]
fn reads_racing_the_archiver_are_gap_free() {
    const RECORDS: u64 = 400;
    let bus = cold_bus(ColdBusOptions::default().object_records(7));
    let done = Arc::new(AtomicBool::new(false));
    // Readers go on until the archiver has trimmed at least once: on a busy
    // machine the publisher and readers can finish before it first runs.
    let trimmed = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(60);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for n in 0..RECORDS {
                bus.publish("t", "k", &json!({"n": n})).unwrap();
            }
        });
        scope.spawn(|| {
            while !done.load(Ordering::Acquire) && Instant::now() < deadline {
                let head = bus.inner().offsets("t", 0).unwrap().next;
                if head > 1 {
                    bus.archive_and_trim("t", 0, head - 1).unwrap();
                    if bus.inner().offsets("t", 0).unwrap().first > 0 {
                        trimmed.store(true, Ordering::Release);
                    }
                }
                std::thread::yield_now();
            }
        });
        let readers: Vec<_> = (0..3)
            .map(|_| {
                scope.spawn(|| {
                    let mut replays = 0;
                    loop {
                        let head = bus.inner().offsets("t", 0).unwrap().next;
                        let mut next = 0;
                        loop {
                            let page = bus.fetch("t", 0, next, 5).unwrap();
                            for (i, event) in page.iter().enumerate() {
                                assert_eq!(event.offset, next + i as u64, "gap in {page:?}");
                                assert_eq!(event.value["n"], event.offset);
                            }
                            match page.last() {
                                Some(last) => next = last.offset + 1,
                                None => break,
                            }
                        }
                        assert!(
                            next >= head,
                            "replay ended at {next}, below the head {head}"
                        );
                        replays += 1;
                        if (head >= RECORDS && trimmed.load(Ordering::Acquire))
                            || Instant::now() > deadline
                        {
                            return replays;
                        }
                    }
                })
            })
            .collect();
        for reader in readers {
            assert!(reader.join().unwrap() > 0);
        }
        done.store(true, Ordering::Release);
    });
    let hot_start = bus.inner().offsets("t", 0).unwrap().first;
    assert!(hot_start > 0, "the archiver never trimmed");
    assert_eq!(
        bus.offsets("t", 0).unwrap().first,
        0,
        "the tier starts at 0"
    );
    assert_eq!(bus.fetch("t", 0, 0, 1000).unwrap().len() as u64, RECORDS);
}

/// Records dropped from the hot log without being archived are an error
/// naming the missing range, never a silent gap: a page ends where the
/// hole begins, and the read from there is `Corrupt` naming it.
#[test]
fn a_range_dropped_before_it_was_archived_is_named() {
    let bus = cold_bus(ColdBusOptions::default());
    for n in 0..20 {
        bus.publish("t", "k", &json!({"n": n})).unwrap();
    }
    bus.archive_and_trim("t", 0, 5).unwrap();
    bus.inner().delete_below("t", 0, 12).unwrap(); // around the tier
    assert_eq!(bus.fetch("t", 0, 0, 5).unwrap().len(), 5);
    match bus.fetch("t", 0, 5, 5) {
        Err(error @ BusError::Corrupt { .. }) => {
            assert!(error.to_string().contains("t/0 [5, 12)"), "{error}");
        }
        other => panic!("expected Corrupt naming [5, 12), got {other:?}"),
    }
    // A page ends where the hole begins; the read from there names it.
    let page = bus.fetch("t", 0, 0, 100).unwrap();
    assert_eq!(
        page.iter().map(|e| e.offset).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
}

/// Headers and tags travel through the tier: read back equal, and a tier
/// read with another control key is `Integrity` naming the offset.
#[test]
fn headers_and_tags_come_back_from_the_tier() {
    let bus = cold_bus(ColdBusOptions::default().hot_records(1));
    bus.set_control_key([7; 32]).unwrap();
    let headers = Headers::try_from_pairs([("traceparent", "00-abc"), ("x-n", "ü")]).unwrap();
    for n in 0..10 {
        let with = if n % 2 == 0 {
            headers.clone()
        } else {
            Headers::default()
        };
        let value = json!({"n": n, "metadata": {"uid": format!("u-{n}")}});
        bus.publish_with_headers("t", "k", &value, None, &with)
            .unwrap();
    }
    assert!(
        bus.inner().offsets("t", 0).unwrap().first >= 6,
        "kept hot: too much"
    );
    let back = bus.fetch_with_headers("t", 0, 0, 100).unwrap();
    assert_eq!(back.len(), 10);
    for record in &back {
        let want = if record.event.offset % 2 == 0 {
            &headers
        } else {
            &Headers::default()
        };
        assert_eq!(&record.headers, want, "offset {}", record.event.offset);
        assert_eq!(record.event.value["n"], record.event.offset);
    }
    // UIDs below the hot start: found in the tier, and a retry stores nothing.
    let ack = bus.find_event_by_uid("t", "k", "u-1").unwrap().unwrap();
    assert_eq!(ack.offset, 1);
    let again = bus
        .publish("t", "k", &json!({"n": 1, "metadata": {"uid": "u-1"}}))
        .unwrap();
    assert_eq!(again, ack);
    assert_eq!(bus.offsets("t", 0).unwrap().next, 10);

    // Another key: the tier's records fail their tags.
    bus.set_control_key([8; 32]).unwrap();
    match bus.fetch("t", 0, 0, 100) {
        Err(BusError::Integrity { offset: 0, .. }) => {}
        other => panic!("a cold record under another key: {other:?}"),
    }
}
