//! The conformance suite's read cases on the embedded log with a generic
//! cold tier (`bus_cold::ColdBus`) under the bus (C24). Segments of 256
//! bytes hold a record or two, so `delete_below` (whole segments) keeps a
//! partition's hot log to its last few records and reads below come from
//! the tier (local files, or the S3 server when `BUS_S3_ENDPOINT` is set).

use bus_conformance::{Harness, Namespace, Unavailable};
use bus_core::{BusError, EventBus};
use bus_embedded::{EmbeddedBus, Options};

struct SmallSegments;

struct SmallSegmentsNamespace {
    dir: tempfile::TempDir,
}

impl Harness for SmallSegments {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    fn namespace(&self) -> Result<Box<dyn Namespace>, Unavailable> {
        let dir = tempfile::tempdir().map_err(|e| Unavailable(format!("temp dir: {e}")))?;
        Ok(Box::new(SmallSegmentsNamespace { dir }))
    }
}

impl Namespace for SmallSegmentsNamespace {
    fn open(&mut self) -> Result<Box<dyn EventBus>, BusError> {
        let options = Options::default().segment_bytes(256);
        Ok(Box::new(EmbeddedBus::open_with(self.dir.path(), options)?))
    }
}

bus_conformance::cold_read_suite!(SmallSegments);
