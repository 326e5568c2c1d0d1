//! Delivery spans of durable consumers (feature `otel`, see
//! [`crate::otel`]): each delivery, a redelivery included, in a `process`
//! span that lasts until the next one is asked for.

use std::time::Instant;

use super::{Consumer, Delivery};
use crate::BusError;
use crate::otel::Deliveries;

impl Consumer {
    /// Starts a `process` span for each delivery from now on (what
    /// [`crate::Traced`]'s `consume` does).
    pub(crate) fn trace_deliveries(&mut self, system: &'static str) {
        self.deliveries = Some(Deliveries::new(system));
    }

    /// The context of the `process` span of the delivery handed out last,
    /// open until the next one is asked for (see
    /// [`crate::Subscription::delivery_context`]).
    pub fn delivery_context(&self) -> Option<&opentelemetry::Context> {
        self.deliveries.as_ref().and_then(Deliveries::context)
    }

    pub(super) fn next_traced(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Option<Delivery>, BusError> {
        if let Some(deliveries) = &mut self.deliveries {
            deliveries.end();
        }
        let delivery = self.next_delivery(deadline);
        if let (Some(deliveries), Ok(Some(delivery))) = (&mut self.deliveries, &delivery) {
            deliveries.begin(&delivery.topic, &delivery.event, &delivery.headers);
        }
        delivery
    }
}
