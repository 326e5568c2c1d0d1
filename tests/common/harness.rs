//! The conformance suite's harness for the in-memory backend: each case
//! owns a `MemoryBus`, and every open is a handle on it.

use bus::memory::MemoryBus;
use bus_conformance::{Harness, Namespace, RawRecord, Unavailable};
use bus_core::{BusError, EventBus};

/// The suite's harness; `through_async` runs every case through the memory
/// bus's async surface (feature `async`).
pub struct Memory {
    pub through_async: bool,
}

struct MemoryNamespace {
    through_async: bool,
    root: MemoryBus,
}

impl Harness for Memory {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn namespace(&self) -> Result<Box<dyn Namespace>, Unavailable> {
        Ok(Box::new(MemoryNamespace {
            through_async: self.through_async,
            root: MemoryBus::new(),
        }))
    }
}

impl Namespace for MemoryNamespace {
    fn open(&mut self) -> Result<Box<dyn EventBus>, BusError> {
        let bus = self.root.handle();
        #[cfg(feature = "async")]
        if self.through_async {
            return Ok(Box::new(bus_conformance::ThroughAsync::new(bus)?));
        }
        assert!(!self.through_async, "the async surface needs feature async");
        Ok(Box::new(bus))
    }

    fn inject_raw(
        &mut self,
        _bus: &mut Option<Box<dyn EventBus>>,
        topic: &str,
        partition: u32,
        raw: &RawRecord,
    ) -> Result<(), BusError> {
        self.root
            .inject_raw(topic, partition, raw.clone())
            .map(drop)
    }
}
