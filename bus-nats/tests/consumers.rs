//! The durable-consumer cases (C20–C23) on NATS JetStream (`BUS_NATS_URL`):
//! each case owns a stream prefix (its topics and its consumer bucket),
//! deleted when the case ends; a restart is a new connection (a new bus)
//! on the same prefix.

mod common;

use bus_conformance::Unavailable;
use bus_conformance::consumers::{ConsumerBus, ConsumerHarness, ConsumerNamespace};
use bus_core::BusError;
use bus_nats::{NatsBus, NatsOptions};

struct Nats;

struct NatsNamespace {
    options: NatsOptions,
}

impl ConsumerHarness for Nats {
    fn backend(&self) -> &'static str {
        "nats"
    }

    fn namespace(&self) -> Result<Box<dyn ConsumerNamespace>, Unavailable> {
        let url = bus_conformance::brokers::nats_url()?;
        let options = NatsOptions::from_url(&url)
            .map_err(|error| Unavailable(format!("BUS_NATS_URL: {error}")))?
            .prefix(format!("bc-{}", bus_conformance::namespace_id(12)));
        Ok(Box::new(NatsNamespace { options }))
    }
}

impl ConsumerNamespace for NatsNamespace {
    fn open(&mut self) -> Result<Box<dyn ConsumerBus>, BusError> {
        Ok(Box::new(NatsBus::connect_with(self.options.clone())?))
    }
}

impl Drop for NatsNamespace {
    fn drop(&mut self) {
        let prefix = self.options.prefix.clone();
        common::raw(async |js| common::delete_streams(&js, &prefix).await);
    }
}

bus_conformance::consumer_suite!(Nats);

/// The same cases with a cold tier under every bus (C24): what a consumer
/// has not acknowledged is read from the tier below the hot records (the
/// S3 server of the tests when BUS_S3_ENDPOINT is set, else local files).
mod cold {
    use super::Nats;

    bus_conformance::cold_consumer_suite!(Nats);
}
