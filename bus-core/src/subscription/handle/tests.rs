//! Unit tests of [`Subscription`]'s delivery over a fake feed.

use super::*;
use crate::subscription::Plan;

/// A partition whose offsets below `first` expired, with forged records
/// at the offsets in `forged`.
struct FakeFeed {
    first: u64,
    next: u64,
    forged: Vec<u64>,
    /// Offsets missing from the log (rows deleted behind the bus).
    missing: Vec<u64>,
    /// Read `[from, from + max)` by offset (as a buffer-backed feed
    /// does) rather than `max` records from the first retained one.
    window: bool,
}

fn event(offset: u64) -> StoredEvent {
    StoredEvent {
        partition: 0,
        offset,
        key: "k".to_owned(),
        value: serde_json::json!({ "n": offset }),
        stored_at: 0,
    }
}

impl Feed for FakeFeed {
    fn read(
        &mut self,
        _partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        let start = from.max(self.first);
        let end = if self.window {
            from.saturating_add(max as u64).min(self.next)
        } else {
            start.saturating_add(max as u64).min(self.next)
        };
        let mut out = Vec::new();
        for offset in start..end {
            if self.forged.contains(&offset) || self.missing.contains(&offset) {
                if !out.is_empty() {
                    break;
                }
                if self.missing.contains(&offset) {
                    return Err(BusError::Corrupt {
                        location: "t/0".to_owned(),
                        offset,
                        reason: "missing".to_owned(),
                    });
                }
                return Err(BusError::Integrity {
                    topic: "t".to_owned(),
                    partition: 0,
                    offset,
                    reason: "forged".to_owned(),
                });
            }
            out.push(event(offset));
        }
        Ok(out)
    }

    fn head(&mut self, _partition: u32) -> Result<u64, BusError> {
        Ok(self.next)
    }
}

fn subscription(feed: FakeFeed) -> Subscription {
    let plan = Plan {
        topic: "t".to_owned(),
        partitions: vec![(0, 0)],
        key: None,
        not_before: None,
    };
    Subscription::new(
        plan,
        SubscribeOptions::default(),
        Box::new(feed),
        Doorbell::new(),
    )
    .expect("valid options")
}

/// Offsets 0..3 expired, 3 forged, 4 authentic: the gap is `Lagged(3)`,
/// then the forged record's error, then record 4 (the re-read of the
/// expired prefix must not leave the subscription stuck).
fn forged_after_expired(window: bool) {
    let mut sub = subscription(FakeFeed {
        first: 3,
        next: 5,
        forged: vec![3],
        missing: Vec::new(),
        window,
    });
    let wait = Duration::from_millis(200);
    assert_eq!(
        sub.recv_timeout(wait).expect("lag"),
        Some(SubscriptionItem::Lagged {
            partition: 0,
            skipped: 3,
            next_offset: 3
        })
    );
    match sub.recv_timeout(wait) {
        Err(BusError::Integrity { offset: 3, .. }) => {}
        other => panic!("expected Integrity at 3, got {other:?}"),
    }
    match sub.recv_timeout(wait).expect("record") {
        Some(SubscriptionItem::Record { event, .. }) => assert_eq!(event.offset, 4),
        other => panic!("expected record 4, got {other:?}"),
    }
    assert_eq!(sub.recv_timeout(Duration::ZERO).expect("end"), None);
}

#[test]
fn forged_record_after_expired_records_is_lag_then_error_then_goes_on() {
    forged_after_expired(false);
}

#[test]
fn forged_record_after_expired_records_with_an_offset_window_feed() {
    forged_after_expired(true);
}

#[test]
fn forged_record_after_authentic_ones_keeps_them() {
    let mut sub = subscription(FakeFeed {
        first: 0,
        next: 4,
        forged: vec![2],
        missing: Vec::new(),
        window: false,
    });
    let wait = Duration::from_millis(200);
    let mut offsets = Vec::new();
    for _ in 0..2 {
        match sub.recv_timeout(wait).expect("record") {
            Some(SubscriptionItem::Record { event, .. }) => offsets.push(event.offset),
            other => panic!("expected a record, got {other:?}"),
        }
    }
    assert_eq!(offsets, [0, 1]);
    assert!(matches!(
        sub.recv_timeout(wait),
        Err(BusError::Integrity { offset: 2, .. })
    ));
    match sub.recv_timeout(wait).expect("record") {
        Some(SubscriptionItem::Record { event, .. }) => assert_eq!(event.offset, 3),
        other => panic!("expected record 3, got {other:?}"),
    }
}

#[test]
fn a_missing_record_is_an_error_item_then_delivery_goes_on() {
    let mut sub = subscription(FakeFeed {
        first: 0,
        next: 4,
        forged: Vec::new(),
        missing: vec![1],
        window: false,
    });
    let wait = Duration::from_millis(200);
    let record = |sub: &mut Subscription| match sub.recv_timeout(wait).expect("record") {
        Some(SubscriptionItem::Record { event, .. }) => event.offset,
        other => panic!("expected a record, got {other:?}"),
    };
    assert_eq!(record(&mut sub), 0);
    assert!(matches!(
        sub.recv_timeout(wait),
        Err(BusError::Corrupt { offset: 1, .. })
    ));
    assert_eq!(sub.positions(), vec![(0, 2)], "past the missing record");
    assert_eq!(record(&mut sub), 2);
    assert_eq!(record(&mut sub), 3);
}
