//! The durable-consumer cases (C20–C23) on the memory bus. A "restart" is
//! a new handle on the same in-process store: memory keeps nothing across
//! a real process restart.

use bus_conformance::Unavailable;
use bus_conformance::consumers::{ConsumerBus, ConsumerHarness, ConsumerNamespace};
use bus_core::BusError;
use bus_core::memory::MemoryBus;

struct Memory;

struct MemoryNamespace {
    root: MemoryBus,
}

impl ConsumerHarness for Memory {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn namespace(&self) -> Result<Box<dyn ConsumerNamespace>, Unavailable> {
        Ok(Box::new(MemoryNamespace {
            root: MemoryBus::new(),
        }))
    }
}

impl ConsumerNamespace for MemoryNamespace {
    fn open(&mut self) -> Result<Box<dyn ConsumerBus>, BusError> {
        Ok(Box::new(self.root.handle()))
    }
}

bus_conformance::consumer_suite!(Memory);

/// The same cases with a cold tier under every bus (C24): what a consumer
/// has not acknowledged is read from the tier below the hot records.
#[cfg(feature = "cold")]
mod cold {
    use super::Memory;

    bus_conformance::cold_consumer_suite!(Memory);
}
