//! The conformance suite's read cases on the memory bus with a cold tier
//! under it (C24): a partition keeps 2 to 4 records hot, every older read
//! comes from the tier (local files, or the S3 server when
//! `BUS_S3_ENDPOINT` is set). Here rather than in bus-cold: a dev-dependency
//! of bus-cold on this crate (which depends on bus-cold) is a cycle
//! `cargo package` cannot resolve.
#![cfg(feature = "cold")]

use bus_conformance::{Harness, Namespace, Unavailable};
use bus_core::memory::MemoryBus;
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
        Ok(Box::new(self.root.handle()))
    }
}

bus_conformance::cold_read_suite!(Memory);
