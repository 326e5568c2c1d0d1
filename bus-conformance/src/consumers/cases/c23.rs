//! C23 one owner.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc, missing_docs)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bus_core::consumer::{ConsumeOptions, OwnerPolicy};
use bus_core::{BusError, Selector, StartAt};

use super::{ConsumerCtx, WAIT, assert_idle, open, publish_n, take};

pub fn c23_second_owner_fails_waits_or_takes_over(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("owner", 1);
    let bus = ctx.bus();
    let first = open(
        bus,
        &topic,
        "o",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    let try_open = |policy| {
        bus.consume(
            &topic,
            "o",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default().owner(policy),
        )
    };
    assert!(matches!(
        try_open(OwnerPolicy::Fail),
        Err(BusError::ConsumerBusy { .. })
    ));
    assert!(matches!(
        try_open(OwnerPolicy::Wait(Duration::from_millis(100))),
        Err(BusError::Timeout { .. })
    ));
    // A waiter gets it once the owner goes away.
    let waited = std::thread::scope(|scope| {
        let waiter = scope.spawn(|| try_open(OwnerPolicy::Wait(WAIT)));
        drop(first);
        waiter.join().unwrap()
    });
    let waited = waited.unwrap();
    let taker = try_open(OwnerPolicy::TakeOver).unwrap();
    drop(taker);
    drop(waited);
    // Nobody owns it now: Fail succeeds.
    assert!(try_open(OwnerPolicy::Fail).is_ok());
}

pub fn c23_fenced_instance_acks_nothing(ctx: &mut ConsumerCtx) {
    let topic = ctx.simple_topic("fence", 1);
    publish_n(ctx.bus(), &topic, 3);
    let mut old = open(
        ctx.bus(),
        &topic,
        "f",
        StartAt::Beginning,
        ConsumeOptions::default(),
    );
    let got = take(&mut old, 3);
    old.ack(&got[0]).unwrap();
    let takeover = ConsumeOptions::default().owner(OwnerPolicy::TakeOver);
    let mut new = open(ctx.bus(), &topic, "f", StartAt::Beginning, takeover);
    assert!(matches!(old.ack(&got[1]), Err(BusError::Fenced { .. })));
    assert!(matches!(
        old.ack_through(0, 2),
        Err(BusError::Fenced { .. })
    ));
    assert!(matches!(old.flush(), Err(BusError::Fenced { .. })));
    assert!(matches!(old.try_recv(), Err(BusError::Fenced { .. })));
    let info = ctx.bus().consumers(&topic).unwrap();
    assert_eq!(
        info[0].partitions[0].cursor, 1,
        "the fenced acks advanced nothing"
    );
    let back = take(&mut new, 2);
    assert_eq!(
        back.iter().map(|d| d.offset).collect::<Vec<_>>(),
        vec![1, 2]
    );
    // A reset fences the running instance too.
    ctx.bus()
        .reset_consumer(&topic, "f", StartAt::Beginning)
        .unwrap();
    assert!(matches!(new.ack(&back[0]), Err(BusError::Fenced { .. })));
}

/// What the racers of [`c23_two_instances_race_with_take_over`] saw.
#[derive(Default)]
struct Race {
    /// Offset → the racer whose ack of it returned `Ok`.
    acked: std::collections::BTreeMap<u64, usize>,
    /// Offsets whose ack returned `Ok` twice (must stay empty).
    twice: Vec<u64>,
    /// Per racer: instances opened, acks refused with `Fenced`.
    opened: [u64; 2],
    fenced: [u64; 2],
    redelivered: u64,
}

/// Two instances of one consumer in one process, each taking over again
/// and again (`OwnerPolicy::TakeOver`) while the other acknowledges: no
/// record's ack succeeds in both (C23), every ack refused is `Fenced`, and
/// every record ends up acknowledged exactly once. Each racer also holds
/// back one delivery per instance and acknowledges it after its own next
/// take-over, which must be refused: fencing is checked on every round,
/// not only when the threads happen to interleave.
pub fn c23_two_instances_race_with_take_over(ctx: &mut ConsumerCtx) {
    // Enough rounds for every racer to be taken over many times (each
    // round takes over); few enough for a backend whose take-over costs a
    // second (Kafka: a transactional producer's init and a settled read).
    const RECORDS: u64 = 60;
    let topic = ctx.simple_topic("race", 1);
    publish_n(ctx.bus(), &topic, RECORDS);
    let bus = ctx.bus();
    let race = Mutex::new(Race::default());
    let deadline = Instant::now() + Duration::from_secs(300);
    let done = || race.lock().unwrap().acked.len() as u64 >= RECORDS;
    // A new consumer's first cursor write happens inside `consume`: taken
    // over before it, the open itself is `Fenced`; open again.
    let open_racer = |racer: usize| loop {
        race.lock().unwrap().opened[racer] += 1;
        match bus.consume(
            &topic,
            "racer",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default().owner(OwnerPolicy::TakeOver),
        ) {
            Ok(consumer) => break consumer,
            Err(BusError::Fenced { .. }) => race.lock().unwrap().fenced[racer] += 1,
            // A transient error is retried, as a careful user would: this
            // case is about fencing, not about the broker's availability.
            Err(error) if error.is_transient() && Instant::now() < deadline => {}
            Err(error) => panic!("racer {racer}: take over failed: {error}"),
        }
    };
    let run = |racer: usize| {
        let mut current = open_racer(racer);
        while !done() {
            assert!(
                Instant::now() < deadline,
                "racers did not finish: {}",
                race.lock().unwrap().acked.len()
            );
            let mut got = Vec::new();
            let mut fenced = false;
            while got.len() < 3 {
                match current.recv_timeout(Duration::from_millis(20)) {
                    Ok(Some(delivery)) => got.push(delivery),
                    Ok(None) => break,
                    Err(BusError::Fenced { .. }) => {
                        fenced = true;
                        break;
                    }
                    Err(error) => panic!("racer {racer}: recv failed: {error}"),
                }
            }
            if got.iter().any(|d| d.delivery_count > 1) {
                race.lock().unwrap().redelivered += 1;
            }
            // Hold the last one back when there are several.
            let held = if got.len() >= 2 { got.pop() } else { None };
            for delivery in &got {
                if fenced {
                    break;
                }
                match current.ack(delivery) {
                    Ok(()) => {
                        let mut race = race.lock().unwrap();
                        if race.acked.insert(delivery.offset, racer).is_some() {
                            race.twice.push(delivery.offset);
                        }
                    }
                    Err(BusError::Fenced { .. }) => {
                        race.lock().unwrap().fenced[racer] += 1;
                        fenced = true;
                    }
                    Err(error) => panic!("racer {racer}: ack failed: {error}"),
                }
            }
            if held.is_some() || fenced {
                let next = open_racer(racer);
                if let Some(held) = held {
                    // Taken over since it was delivered: refused, whoever
                    // took it over.
                    match current.ack(&held) {
                        Err(BusError::Fenced { .. }) => race.lock().unwrap().fenced[racer] += 1,
                        other => panic!("racer {racer}: a fenced instance's ack gave {other:?}"),
                    }
                }
                current = next;
            }
        }
    };
    std::thread::scope(|scope| {
        let first = scope.spawn(|| run(0));
        run(1);
        if let Err(panic) = first.join() {
            std::panic::resume_unwind(panic);
        }
    });
    let race = race.into_inner().unwrap();
    eprintln!(
        "c23 race: {RECORDS} records, instances opened {:?}, acks refused as fenced {:?}, rounds with a redelivery {}, acked by racer 0: {}",
        race.opened,
        race.fenced,
        race.redelivered,
        race.acked.values().filter(|&&r| r == 0).count()
    );
    assert!(
        race.twice.is_empty(),
        "acknowledged by two instances: {:?}",
        race.twice
    );
    assert_eq!(
        race.acked.keys().copied().collect::<Vec<_>>(),
        (0..RECORDS).collect::<Vec<_>>()
    );
    assert!(
        race.opened.iter().all(|&n| n >= 2),
        "take-overs both ways: {:?}",
        race.opened
    );
    assert!(race.fenced.iter().sum::<u64>() >= 1, "no ack was fenced");
    // The stored cursor is past every record, and a new owner gets nothing.
    let info = bus.consumers(&topic).unwrap();
    assert_eq!(
        (
            info[0].partitions[0].cursor,
            info[0].partitions[0].acked_above
        ),
        (RECORDS, 0)
    );
    let mut last = open(
        bus,
        &topic,
        "racer",
        StartAt::Beginning,
        ConsumeOptions::default().owner(OwnerPolicy::TakeOver),
    );
    assert_idle(&mut last);
}
