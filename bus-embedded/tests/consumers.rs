//! The durable-consumer cases (C20–C23) on the embedded log: each case owns
//! a temp directory; a restart closes the bus and opens the directory again.

use bus_conformance::Unavailable;
use bus_conformance::consumers::{ConsumerBus, ConsumerHarness, ConsumerNamespace};
use bus_core::BusError;
use bus_embedded::EmbeddedBus;

struct Embedded;

struct EmbeddedNamespace {
    dir: tempfile::TempDir,
}

impl ConsumerHarness for Embedded {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    fn namespace(&self) -> Result<Box<dyn ConsumerNamespace>, Unavailable> {
        let dir = tempfile::tempdir().map_err(|e| Unavailable(format!("temp dir: {e}")))?;
        Ok(Box::new(EmbeddedNamespace { dir }))
    }
}

impl ConsumerNamespace for EmbeddedNamespace {
    fn open(&mut self) -> Result<Box<dyn ConsumerBus>, BusError> {
        Ok(Box::new(EmbeddedBus::open(self.dir.path())?))
    }
}

bus_conformance::consumer_suite!(Embedded);

/// The same cases with a cold tier under every bus (C24): what a consumer
/// has not acknowledged is read from the tier below the hot records (the
/// S3 server of the tests when BUS_S3_ENDPOINT is set, else local files).
mod cold {
    use super::Embedded;

    bus_conformance::cold_consumer_suite!(Embedded);
}
