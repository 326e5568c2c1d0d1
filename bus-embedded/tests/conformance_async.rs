//! The shared conformance suite on the embedded backend, through its async
//! surface (feature `async`; see `bus_conformance::ThroughAsync`).

use bus_conformance::{Harness, Namespace, RawRecord, ThroughAsync, Unavailable};
use bus_core::{BusError, EventBus};
use bus_embedded::EmbeddedBus;

struct Embedded;

struct EmbeddedNamespace {
    dir: tempfile::TempDir,
}

impl Harness for Embedded {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    fn namespace(&self) -> Result<Box<dyn Namespace>, Unavailable> {
        let dir = tempfile::tempdir().map_err(|e| Unavailable(format!("temp dir: {e}")))?;
        Ok(Box::new(EmbeddedNamespace { dir }))
    }
}

impl Namespace for EmbeddedNamespace {
    fn open(&mut self) -> Result<Box<dyn EventBus>, BusError> {
        Ok(Box::new(ThroughAsync::new(EmbeddedBus::open(
            self.dir.path(),
        )?)?))
    }

    fn inject_raw(
        &mut self,
        bus: &mut Option<Box<dyn EventBus>>,
        topic: &str,
        partition: u32,
        raw: &RawRecord,
    ) -> Result<(), BusError> {
        // Close the bus to release the directory lock, as another writer would need.
        *bus = None;
        bus_embedded::testing::append_raw_record(
            self.dir.path(),
            topic,
            partition,
            &raw.key,
            raw.uid.as_deref(),
            &raw.value,
            raw.tag.as_deref(),
        )
        .map(drop)
    }
}

bus_conformance::suite!(Embedded);
