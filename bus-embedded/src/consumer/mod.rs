//! Durable consumers on the embedded log (C20–C23): the shared engine of
//! `bus_core::consumer` over the cursor files of [`store`].
//!
//! A read-only open (C16) runs a consumer too: it writes nothing to the
//! log, only the consumer's own files under `consumers/` (same locks, so a
//! read-only open in another process and the writer's process exclude
//! each other per consumer). It cannot write dead letters, so a consumer
//! with a dead-letter topic is refused there with `ReadOnly`.

mod store;

use std::sync::Arc;

use bus_core::consumer::{
    ConsumeOptions, Consumer, ConsumerInfo, DurableConsumers, delete_consumer, list_consumers,
    open_consumer, reset_consumer,
};
use bus_core::{BusError, Selector, StartAt};

use crate::bus::EmbeddedBus;
use store::FileCursorStore;

impl EmbeddedBus {
    fn cursor_store(&self) -> FileCursorStore {
        FileCursorStore::new(self.inner.topics_dir.clone())
    }
}

impl DurableConsumers for EmbeddedBus {
    fn consume(
        &self,
        topic: &str,
        name: &str,
        selector: Selector,
        start_if_new: StartAt,
        options: ConsumeOptions,
    ) -> Result<Consumer, BusError> {
        if self.inner.options.read_only && options.dead_letter.is_some() {
            return Err(BusError::ReadOnly {
                operation: "consume with a dead-letter topic".to_owned(),
                path: self.inner.root.clone(),
            });
        }
        open_consumer(
            self,
            Arc::new(self.handle()),
            Arc::new(self.cursor_store()),
            topic,
            name,
            selector,
            start_if_new,
            options,
        )
    }

    fn consumers(&self, topic: &str) -> Result<Vec<ConsumerInfo>, BusError> {
        list_consumers(self, &self.cursor_store(), topic)
    }

    fn reset_consumer(&self, topic: &str, name: &str, start: StartAt) -> Result<(), BusError> {
        reset_consumer(self, &self.cursor_store(), topic, name, start)
    }

    fn delete_consumer(&self, topic: &str, name: &str) -> Result<bool, BusError> {
        delete_consumer(self, &self.cursor_store(), topic, name)
    }

    fn shared_cursor_store(&self) -> Option<Arc<dyn bus_core::consumer::CursorStore>> {
        Some(Arc::new(self.cursor_store()))
    }
}
