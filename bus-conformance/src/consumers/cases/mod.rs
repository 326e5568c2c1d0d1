//! The durable-consumer cases, one file per rule (C20–C23), and the
//! helpers they share.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc, missing_docs)]

use std::time::Duration;

use bus_core::consumer::{ConsumeOptions, Consumer, Delivery};
use bus_core::{EventBus, Selector, StartAt};
use serde_json::json;

use super::{ConsumerBus, ConsumerCtx};

mod c20;
mod c21;
mod c22;
mod c23;
mod c25;

pub use c20::*;
pub use c21::*;
pub use c22::*;
pub use c23::*;
pub use c25::*;

pub(super) const WAIT: Duration = Duration::from_secs(10);

pub(super) fn open(
    bus: &dyn ConsumerBus,
    topic: &str,
    name: &str,
    start: StartAt,
    options: ConsumeOptions,
) -> Consumer {
    match bus.consume(topic, name, Selector::Topic, start, options) {
        Ok(consumer) => consumer,
        Err(error) => panic!("consume {topic}/{name} failed: {error}"),
    }
}

/// Exactly `n` deliveries, each within [`WAIT`].
pub(super) fn take(consumer: &mut Consumer, n: usize) -> Vec<Delivery> {
    (0..n)
        .map(|i| match consumer.recv_timeout(WAIT) {
            Ok(Some(delivery)) => delivery,
            other => panic!("delivery {i} of {n}: {other:?}"),
        })
        .collect()
}

/// Nothing more is waiting now.
pub(super) fn assert_idle(consumer: &mut Consumer) {
    let more = consumer.try_recv().unwrap();
    assert!(more.is_none(), "unexpected delivery {more:?}");
}

pub(super) fn publish_n(bus: &dyn EventBus, topic: &str, n: u64) {
    for i in 0..n {
        bus.publish(topic, &format!("k{i}"), &json!({"n": i}))
            .unwrap();
    }
}

pub(super) fn numbers(deliveries: &[Delivery]) -> Vec<u64> {
    let mut out: Vec<u64> = deliveries
        .iter()
        .map(|d| d.event.value["n"].as_u64().unwrap())
        .collect();
    out.sort_unstable();
    out
}

pub(super) fn dead_letter_topic(ctx: &ConsumerCtx) -> String {
    ctx.simple_topic("dlq", 1)
}
