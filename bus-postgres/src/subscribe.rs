//! The [`Feed`] of a live subscription: reads through the bus's fetch; the
//! listener (see `listener`) rings its doorbell.

use std::sync::{Arc, Weak};

use bus_core::{BusError, StoredEvent, backend::Feed};

use crate::inner::Core;

/// Holds the bus weakly: a subscription that outlives its bus keeps no
/// connection or thread alive (its doorbell is closed by then).
pub(crate) struct PgFeed {
    core: Weak<Core>,
    topic: String,
}

impl PgFeed {
    pub(crate) fn new(core: &Arc<Core>, topic: &str) -> Self {
        Self {
            core: Arc::downgrade(core),
            topic: topic.to_owned(),
        }
    }
}

impl Feed for PgFeed {
    fn read(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        Ok(self
            .read_records(partition, from, max)?
            .into_iter()
            .map(|record| record.event)
            .collect())
    }

    /// The records with their headers (C25): what the subscription reads.
    fn read_records(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<bus_core::StoredRecord>, BusError> {
        match self.core.upgrade() {
            Some(core) => core.fetch(&self.topic, partition, from, max),
            None => Ok(Vec::new()),
        }
    }

    fn head(&mut self, partition: u32) -> Result<u64, BusError> {
        match self.core.upgrade() {
            Some(core) => Ok(core.offsets(&self.topic, partition)?.next),
            None => Ok(0),
        }
    }
}
