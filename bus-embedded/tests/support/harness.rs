//! The conformance suite's harness for the embedded backend: each case
//! owns a temp directory.

use bus_conformance::{Harness, Namespace, RawRecord, Unavailable};
use bus_core::{BusError, EventBus};
use bus_embedded::EmbeddedBus;

/// The suite's harness; `through_async` runs every case through the
/// embedded bus's async surface.
pub struct Embedded {
    pub through_async: bool,
}

struct EmbeddedNamespace {
    through_async: bool,
    dir: tempfile::TempDir,
}

impl Harness for Embedded {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    fn namespace(&self) -> Result<Box<dyn Namespace>, Unavailable> {
        let dir = tempfile::tempdir().map_err(|e| Unavailable(format!("temp dir: {e}")))?;
        Ok(Box::new(EmbeddedNamespace {
            through_async: self.through_async,
            dir,
        }))
    }
}

impl Namespace for EmbeddedNamespace {
    fn open(&mut self) -> Result<Box<dyn EventBus>, BusError> {
        let bus = EmbeddedBus::open(self.dir.path())?;
        #[cfg(feature = "async")]
        if self.through_async {
            return Ok(Box::new(bus_conformance::ThroughAsync::new(bus)?));
        }
        assert!(!self.through_async, "the async surface needs feature async");
        Ok(Box::new(bus))
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
        bus_embedded::testing::append_raw_record_with_headers(
            self.dir.path(),
            topic,
            partition,
            &raw.key,
            raw.uid.as_deref(),
            &raw.value,
            raw.tag.as_deref(),
            &raw.headers,
        )
        .map(drop)
    }
}
