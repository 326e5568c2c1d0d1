//! C8 concurrency and C9 any calling context.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use bus_core::{EventBus, PublishAck};
use serde_json::json;

use crate::util::{assert_contiguous, fetch_all, ok};
use crate::{CaseResult, Ctx};

/// C8: concurrent publishers get distinct offsets; partition order is ack order.
pub fn c08_concurrent_publishers_get_distinct_offsets(ctx: &mut Ctx) -> CaseResult {
    concurrent_publishers(ctx, "plain");
    // Signing between taking an offset and storing the record is where
    // real backends race: run it again with a control key.
    ctx.set_control_key([0x33; 32]);
    concurrent_publishers(ctx, "signed");
    Ok(())
}

fn concurrent_publishers(ctx: &Ctx, base: &str) {
    let topic = ctx.simple_topic(base, 1);
    let (threads, each) = (24, 20);
    let barrier = Arc::new(Barrier::new(threads));
    let acks: Vec<(usize, usize, PublishAck)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (bus, topic, barrier) = (ctx.bus(), topic.clone(), Arc::clone(&barrier));
                scope.spawn(move || {
                    barrier.wait();
                    (0..each)
                        .map(|i| {
                            let ack = ok(
                                "publish",
                                bus.publish(&topic, "k", &json!({ "t": t, "i": i })),
                            );
                            (t, i, ack)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|_| panic!("publisher panicked")))
            .collect()
    });
    let offsets: BTreeSet<u64> = acks.iter().map(|(_, _, ack)| ack.offset).collect();
    assert_eq!(offsets.len(), threads * each, "offsets must be distinct");
    assert_eq!(
        offsets.iter().copied().collect::<Vec<_>>(),
        (0..(threads * each) as u64).collect::<Vec<_>>()
    );
    let stored = fetch_all(ctx.bus(), &topic, 0, 0);
    let by_offset: BTreeMap<u64, &serde_json::Value> =
        stored.iter().map(|e| (e.offset, &e.value)).collect();
    for (t, i, ack) in &acks {
        assert_eq!(by_offset[&ack.offset], &json!({ "t": t, "i": i }));
    }
    // Each thread's own records appear in the order it published them.
    let mut last_seen: BTreeMap<u64, i64> = BTreeMap::new();
    for event in &stored {
        let t = event.value["t"].as_u64().unwrap_or(u64::MAX);
        let i = event.value["i"].as_i64().unwrap_or(-1);
        let previous = last_seen.insert(t, i).unwrap_or(-1);
        assert!(
            i > previous,
            "thread {t}: record {i} stored after {previous}"
        );
    }
}

/// C8 with C5 and C7: a record is readable the moment its ack returns —
/// by the bus that published it and by another bus on the same storage,
/// by offset and by UID. (On a replicated broker a read answered by a
/// follower that has not applied the record yet would miss it.)
pub fn c08_acked_records_read_back_at_once(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 2);
    let second = if ctx.caps().exclusive_open {
        None
    } else {
        Some(ok("open a second bus", ctx.open_second()))
    };
    let bus = ctx.bus();
    for i in 0..120u32 {
        let (key, uid) = (format!("k{}", i % 5), format!("ack-{i}"));
        let ack = ok(
            "publish_idempotent",
            bus.publish_idempotent(&topic, &key, &json!({ "i": i }), &uid),
        );
        let mut readers: Vec<(&str, &dyn EventBus)> = vec![("publisher", bus)];
        if let Some(second) = &second {
            readers.push(("second bus", second.as_ref()));
        }
        for (who, reader) in readers {
            let got = ok("fetch", reader.fetch(&topic, ack.partition, ack.offset, 1));
            assert!(
                got.first().is_some_and(
                    |event| event.offset == ack.offset && event.value == json!({ "i": i })
                ),
                "{who}: fetch right after the ack of offset {} returned {got:?}",
                ack.offset
            );
            // A longer read, as a replay takes it, reaches the record too.
            let replay = ok("fetch", reader.fetch(&topic, ack.partition, 0, 10_000));
            assert!(
                replay
                    .last()
                    .is_some_and(|event| event.offset >= ack.offset),
                "{who}: a replay right after the ack of offset {} ended at {:?}",
                ack.offset,
                replay.last().map(|event| event.offset)
            );
            let found = ok(
                "find_event_by_uid",
                reader.find_event_by_uid(&topic, &key, &uid),
            );
            assert_eq!(
                found.as_ref(),
                Some(&ack),
                "{who}: find_event_by_uid right after the ack"
            );
        }
    }
    Ok(())
}

/// C8: a fetch running beside publishers always sees a gap-free prefix.
pub fn c08_concurrent_fetch_sees_gap_free_prefix(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let done = Arc::new(AtomicBool::new(false));
    let total = 300u64;
    std::thread::scope(|scope| {
        let bus = ctx.bus();
        let writer = {
            let (done, topic) = (Arc::clone(&done), topic.clone());
            scope.spawn(move || {
                for i in 0..total {
                    ok("publish", bus.publish(&topic, "k", &json!({ "i": i })));
                }
                done.store(true, Ordering::SeqCst);
            })
        };
        let mut max_seen = 0usize;
        loop {
            let finished = done.load(Ordering::SeqCst);
            let got = ok("fetch", bus.fetch(&topic, 0, 0, 10_000));
            assert_contiguous(&got);
            if let Some(first) = got.first() {
                assert_eq!(first.offset, 0);
            }
            for event in &got {
                assert_eq!(event.value, json!({ "i": event.offset }));
            }
            assert!(
                got.len() >= max_seen,
                "a fetch saw fewer records than an earlier one"
            );
            max_seen = got.len();
            if finished {
                assert_eq!(max_seen as u64, total);
                break;
            }
        }
        writer.join().unwrap_or_else(|_| panic!("writer panicked"));
    });
    Ok(())
}

fn exercise(bus: &dyn EventBus, topic: &str, tag: &str) -> PublishAck {
    let ack = ok("publish", bus.publish(topic, tag, &json!({ "from": tag })));
    let got = ok("fetch", bus.fetch(topic, ack.partition, ack.offset, 1));
    assert_eq!(got[0].value, json!({ "from": tag }));
    let uid = format!("uid-{tag}");
    let first = ok(
        "idempotent",
        bus.publish_idempotent(topic, tag, &json!(1), &uid),
    );
    assert_eq!(
        ok("find", bus.find_event_by_uid(topic, tag, &uid)),
        Some(first)
    );
    assert_eq!(ok("partitions", bus.partitions(topic)), 2);
    assert!(bus.topics().iter().any(|t| t == topic));
    ack
}

/// C9: every method works inside tokio current-thread and multi-thread
/// runtimes, without panicking or deadlocking.
pub fn c09_works_inside_tokio_runtimes(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 2);
    let bus = ctx.bus();
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    current.block_on(async { exercise(bus, &topic, "current-thread") });
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    multi.block_on(async { exercise(bus, &topic, "multi-thread") });
    Ok(())
}

/// C9: 64 threads at once.
pub fn c09_sixty_four_threads_at_once(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 2);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..64)
            .map(|t| {
                let (bus, topic) = (ctx.bus(), topic.clone());
                scope.spawn(move || exercise(bus, &topic, &format!("thread-{t}")))
            })
            .collect();
        for handle in handles {
            handle
                .join()
                .unwrap_or_else(|_| panic!("a thread panicked"));
        }
    });
    let total: usize = (0..2)
        .map(|p| fetch_all(ctx.bus(), &topic, p, 0).len())
        .sum();
    assert_eq!(total, 128);
    Ok(())
}
