//! The conformance suite on the in-memory backend, through its async
//! surface (feature `async`; see `bus_conformance::ThroughAsync`).

use bus::memory::MemoryBus;
use bus_conformance::{Harness, Namespace, RawRecord, ThroughAsync, Unavailable};
use bus_core::{BusError, EventBus};

struct Memory;

struct MemoryNamespace {
    root: MemoryBus,
}

impl Harness for Memory {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn namespace(&self) -> Result<Box<dyn Namespace>, Unavailable> {
        Ok(Box::new(MemoryNamespace {
            root: MemoryBus::new(),
        }))
    }
}

impl Namespace for MemoryNamespace {
    fn open(&mut self) -> Result<Box<dyn EventBus>, BusError> {
        Ok(Box::new(ThroughAsync::new(self.root.handle())?))
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

bus_conformance::suite!(Memory);
