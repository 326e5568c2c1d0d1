//! C18 with a feed that trails its head: a live tail fed by a consumer
//! that can be behind the broker (Kafka's shared consumer, NATS's push)
//! answers "nothing yet" past what it buffered while `head` already counts
//! more records. A key subscription's catch-up to that head must still see
//! every record below it, so the skip it reports does not depend on when
//! the read happens.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bus_core::backend::{Doorbell, Feed, Plan};
use bus_core::{BusError, StoredEvent, SubscribeOptions, Subscription, SubscriptionItem};

/// Records 0..len, the buffered ones readable through `read`, every one
/// through `read_below_head`.
struct TrailingFeed {
    records: Vec<StoredEvent>,
    buffered: u64,
}

impl TrailingFeed {
    fn slice(&self, from: u64, until: u64, max: usize) -> Vec<StoredEvent> {
        let end = until.min(from.saturating_add(max as u64));
        (from..end)
            .filter_map(|offset| usize::try_from(offset).ok())
            .filter_map(|index| self.records.get(index).cloned())
            .collect()
    }
}

impl Feed for TrailingFeed {
    fn read(&mut self, _: u32, from: u64, max: usize) -> Result<Vec<StoredEvent>, BusError> {
        Ok(self.slice(from, self.buffered, max))
    }

    fn head(&mut self, _: u32) -> Result<u64, BusError> {
        Ok(self.records.len() as u64)
    }

    fn read_below_head(
        &mut self,
        _: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        Ok(self.slice(from, self.records.len() as u64, max))
    }
}

#[test]
fn a_key_catch_up_reads_to_the_head_even_when_the_tail_trails() {
    // Sixty records of another key with ten of "mine" among them, the
    // tail's buffer holding only the first twenty.
    let mut records = Vec::new();
    let mut mine = Vec::new();
    for n in 0..70u64 {
        let key = if n % 7 == 3 { "mine" } else { "other" };
        if key == "mine" {
            mine.push(n);
        }
        records.push(StoredEvent {
            partition: 0,
            offset: n,
            key: key.to_owned(),
            value: serde_json::json!({ "n": n }),
            stored_at: 0,
        });
    }
    assert_eq!(mine.len(), 10);
    let feed = TrailingFeed {
        records,
        buffered: 20,
    };
    let plan = Plan {
        topic: "t".to_owned(),
        partitions: vec![(0, 0)],
        key: Some("mine".to_owned()),
        not_before: None,
    };
    let options = SubscribeOptions::default().max_lag(4);
    let mut sub = Subscription::new(plan, options, Box::new(feed), Doorbell::new()).unwrap();
    let wait = Duration::from_millis(200);
    assert_eq!(
        sub.recv_timeout(wait).unwrap(),
        Some(SubscriptionItem::Lagged {
            partition: 0,
            skipped: 6,
            next_offset: mine[6],
        }),
        "six of the key's ten records skipped, whatever the tail had buffered"
    );
    for offset in &mine[6..] {
        match sub.recv_timeout(wait).unwrap() {
            Some(SubscriptionItem::Record { event, .. }) => assert_eq!(event.offset, *offset),
            other => panic!("expected record {offset}, got {other:?}"),
        }
    }
}
