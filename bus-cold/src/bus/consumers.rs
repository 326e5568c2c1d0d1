//! Durable consumers (C20–C23) of a [`ColdBus`]: the engine of bus-core
//! over the cold bus's own `subscribe`, so a consumer that begins below the
//! hot log start is served from the tier (C24), with its cursors kept where
//! the inner bus keeps them ([`DurableConsumers::shared_cursor_store`]).

use std::sync::Arc;

use bus_core::consumer::{
    ConsumeOptions, Consumer, ConsumerInfo, CursorStore, DurableConsumers, delete_consumer,
    list_consumers, open_consumer, reset_consumer,
};
use bus_core::{BusError, EventBus, Selector, StartAt};

use super::ColdBus;

impl<B: EventBus + DurableConsumers + 'static> ColdBus<B> {
    fn cursors(&self) -> Result<Arc<dyn CursorStore>, BusError> {
        self.inner()
            .shared_cursor_store()
            .ok_or_else(|| BusError::Unsupported {
                backend: self.inner().capabilities().backend.to_owned(),
                operation: "durable consumers through a cold tier (the bus shares no cursor store)"
                    .to_owned(),
            })
    }
}

impl<B: EventBus + DurableConsumers + 'static> DurableConsumers for ColdBus<B> {
    fn consume(
        &self,
        topic: &str,
        name: &str,
        selector: Selector,
        start_if_new: StartAt,
        options: ConsumeOptions,
    ) -> Result<Consumer, BusError> {
        open_consumer(
            self,
            Arc::new(self.clone()),
            self.cursors()?,
            topic,
            name,
            selector,
            start_if_new,
            options,
        )
    }

    fn consumers(&self, topic: &str) -> Result<Vec<ConsumerInfo>, BusError> {
        list_consumers(self, self.cursors()?.as_ref(), topic)
    }

    fn reset_consumer(&self, topic: &str, name: &str, start: StartAt) -> Result<(), BusError> {
        reset_consumer(self, self.cursors()?.as_ref(), topic, name, start)
    }

    fn delete_consumer(&self, topic: &str, name: &str) -> Result<bool, BusError> {
        delete_consumer(self, self.cursors()?.as_ref(), topic, name)
    }

    fn shared_cursor_store(&self) -> Option<Arc<dyn CursorStore>> {
        self.inner().shared_cursor_store()
    }
}
