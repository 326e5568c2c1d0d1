//! Delivery spans of subscriptions (feature `otel`): the sync handle and
//! the async stream each keep the `process` span of the record they handed
//! out last (see [`crate::otel`]).

use std::time::Instant;

use super::{Subscription, SubscriptionItem, SubscriptionStream};
use crate::BusError;
use crate::otel::Deliveries;

impl Subscription {
    /// Starts a `process` span for each record handed out from now on
    /// (what [`crate::Traced::subscribe`] does).
    pub(crate) fn trace_deliveries(&mut self, system: &'static str) {
        self.deliveries = Some(Deliveries::new(system));
    }

    /// The context of the `process` span of the record handed out last,
    /// open until the next item is asked for: attach it (or make it the
    /// parent of the handler's spans) to put the handling in the record's
    /// trace. `None` when the subscription is not traced (a bare backend's,
    /// not wrapped in [`crate::Traced`]) or nothing records and the record
    /// carried no context.
    pub fn delivery_context(&self) -> Option<&opentelemetry::Context> {
        self.deliveries.as_ref().and_then(Deliveries::context)
    }

    /// The next item with a `process` span per record (the previous one
    /// ends when the next item is asked for).
    pub(super) fn next_traced(
        &mut self,
        deadline: Option<Instant>,
    ) -> Option<Result<SubscriptionItem, BusError>> {
        if let Some(deliveries) = &mut self.deliveries {
            deliveries.end();
        }
        let item = self.next_item(deadline);
        if let (
            Some(deliveries),
            Some(Ok(SubscriptionItem::Record {
                topic,
                event,
                headers,
            })),
        ) = (&mut self.deliveries, &item)
        {
            deliveries.begin(topic, event, headers);
        }
        item
    }
}

impl SubscriptionStream {
    /// As [`Subscription::trace_deliveries`], on the stream's side: the
    /// span starts when the item reaches the task and ends when the task
    /// asks for the next one.
    #[cfg(feature = "async")]
    pub(crate) fn trace_deliveries(&mut self, system: &'static str) {
        self.deliveries = Some(Deliveries::new(system));
    }

    /// As [`Subscription::delivery_context`].
    pub fn delivery_context(&self) -> Option<&opentelemetry::Context> {
        self.deliveries.as_ref().and_then(Deliveries::context)
    }
}
