//! Opening, listing, resetting and deleting durable consumers over a bus
//! and its [`CursorStore`]: what a backend's [`super::DurableConsumers`]
//! implementation calls.

use std::sync::Arc;
use std::time::Duration;

use super::acked::Acked;
use super::engine::{Consumer, Parts};
use super::{
    ConsumeOptions, ConsumerInfo, ConsumerPartition, CursorState, CursorStore, PartitionState,
    StoredSelector, validate_consumer_name,
};
use crate::subscription::{Selector, StartAt, SubscribeOptions};
use crate::{BusError, EventBus, backend::validate_topic, now_ms};

/// Opens durable consumer `name` of `topic` (C20–C23). `bus` is the
/// caller's handle (the subscription is made through it, so it ends with
/// it); `publisher` is an owned handle on the same bus for dead-letter
/// writes; `store` the backend's cursor store.
#[allow(clippy::too_many_arguments)]
pub fn open_consumer(
    bus: &dyn EventBus,
    publisher: Arc<dyn EventBus>,
    store: Arc<dyn CursorStore>,
    topic: &str,
    name: &str,
    selector: Selector,
    start_if_new: StartAt,
    options: ConsumeOptions,
) -> Result<Consumer, BusError> {
    validate_topic(topic)?;
    validate_consumer_name(name)?;
    options.validate()?;
    bus.partitions(topic)?;
    if let Some(dlq) = &options.dead_letter {
        if dlq == topic {
            return Err(BusError::invalid(
                "dead_letter",
                format!("{dlq:?} is the consumed topic; name another provisioned topic"),
            ));
        }
        match bus.partitions(dlq) {
            Ok(_) => {}
            Err(BusError::UnknownTopic(_)) => {
                return Err(BusError::invalid(
                    "dead_letter",
                    format!(
                        "topic {dlq:?} is not provisioned; provision it before consuming (C22)"
                    ),
                ));
            }
            Err(error) => return Err(error),
        }
    }
    let wanted = StoredSelector::from(&selector);
    // Checked before taking ownership, so a wrong call fences nobody.
    if let Some(stored) = store.load(topic, name)?
        && !stored.partitions.is_empty()
        && stored.selector != wanted
    {
        return Err(BusError::invalid(
            "selector",
            format!(
                "consumer {name:?} of topic {topic:?} was created with {:?}, not {wanted:?}; use another name or delete it",
                stored.selector
            ),
        ));
    }
    let (token, state) = store.acquire(topic, name, options.owner, &wanted)?;
    let start = if state.partitions.is_empty() {
        start_if_new
    } else {
        StartAt::Positions(state.partitions.iter().map(|(&p, s)| (p, s.next)).collect())
    };
    let sub = match bus.subscribe(topic, selector, start, SubscribeOptions::default()) {
        Ok(sub) => sub,
        Err(error) => {
            store.release(topic, name, token);
            return Err(error);
        }
    };
    Consumer::start(Parts {
        topic: topic.to_owned(),
        name: name.to_owned(),
        sub,
        store,
        token,
        publisher,
        options,
        state,
    })
}

/// Every durable consumer of `topic`, with per-partition lag in records
/// and in time (C20).
pub fn list_consumers(
    bus: &dyn EventBus,
    store: &dyn CursorStore,
    topic: &str,
) -> Result<Vec<ConsumerInfo>, BusError> {
    validate_topic(topic)?;
    bus.partitions(topic)?;
    let now = now_ms();
    let mut out = Vec::new();
    for (name, state) in store.list(topic)? {
        let mut partitions = Vec::new();
        for (&partition, stored) in &state.partitions {
            let head = bus.offsets(topic, partition)?.next;
            let acked_above = Acked::new(stored.next, &stored.acked).count_above();
            let lag_records = head.saturating_sub(stored.next).saturating_sub(acked_above);
            let lag_time = if lag_records > 0 {
                bus.fetch(topic, partition, stored.next, 1)?
                    .first()
                    .map(|event| Duration::from_millis(now.saturating_sub(event.stored_at)))
            } else {
                None
            };
            partitions.push(ConsumerPartition {
                partition,
                cursor: stored.next,
                acked_above,
                lag_records,
                lag_time,
            });
        }
        out.push(ConsumerInfo {
            name,
            selector: Selector::from(&state.selector),
            partitions,
        });
    }
    Ok(out)
}

/// Moves consumer `name` to `start`, resolved on its own selector; a
/// running instance is fenced (C20, C23). An unknown consumer is
/// [`BusError::InvalidArgument`] on `consumer`.
pub fn reset_consumer(
    bus: &dyn EventBus,
    store: &dyn CursorStore,
    topic: &str,
    name: &str,
    start: StartAt,
) -> Result<(), BusError> {
    validate_topic(topic)?;
    validate_consumer_name(name)?;
    bus.partitions(topic)?;
    let Some(state) = store.load(topic, name)? else {
        return Err(BusError::invalid(
            "consumer",
            format!("topic {topic:?} has no consumer {name:?}"),
        ));
    };
    let selector = Selector::from(&state.selector);
    let positions = bus
        .subscribe(topic, selector, start, SubscribeOptions::default())?
        .positions();
    let state = CursorState {
        selector: state.selector,
        partitions: positions
            .into_iter()
            .map(|(p, next)| {
                (
                    p,
                    PartitionState {
                        next,
                        ..PartitionState::default()
                    },
                )
            })
            .collect(),
        owner: None,
    };
    store.replace(topic, name, Some(&state))?;
    Ok(())
}

/// Deletes consumer `name` of `topic`; a running instance is fenced.
pub fn delete_consumer(
    bus: &dyn EventBus,
    store: &dyn CursorStore,
    topic: &str,
    name: &str,
) -> Result<bool, BusError> {
    validate_topic(topic)?;
    validate_consumer_name(name)?;
    bus.partitions(topic)?;
    store.replace(topic, name, None)
}
