//! The durable-consumer cases (C20–C23) on PostgreSQL (`BUS_POSTGRES_URL`):
//! each case owns a schema, dropped when the case ends; a restart is a new
//! connection (a new bus) on the same schema.

use bus_conformance::Unavailable;
use bus_conformance::consumers::{ConsumerBus, ConsumerHarness, ConsumerNamespace};
use bus_core::BusError;
use bus_postgres::{PostgresBus, PostgresOptions};

struct Postgres;

struct PostgresNamespace {
    options: PostgresOptions,
    runtime: tokio::runtime::Runtime,
}

impl ConsumerHarness for Postgres {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn namespace(&self) -> Result<Box<dyn ConsumerNamespace>, Unavailable> {
        let url = bus_conformance::brokers::postgres_url()?;
        let options = PostgresOptions::from_url(&url)
            .map_err(|error| Unavailable(format!("BUS_POSTGRES_URL: {error}")))?
            .schema(format!("bc_{}", bus_conformance::namespace_id(12)));
        Ok(Box::new(PostgresNamespace {
            options,
            runtime: bus_conformance::current_thread_runtime()?,
        }))
    }
}

impl ConsumerNamespace for PostgresNamespace {
    fn open(&mut self) -> Result<Box<dyn ConsumerBus>, BusError> {
        Ok(Box::new(PostgresBus::connect_with(self.options.clone())?))
    }
}

impl Drop for PostgresNamespace {
    fn drop(&mut self) {
        let config = self.options.config.clone();
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.options.schema);
        let _ = self.runtime.block_on(async move {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            client.batch_execute(&sql).await
        });
    }
}

bus_conformance::consumer_suite!(Postgres);

/// The same cases with a cold tier under every bus (C24): what a consumer
/// has not acknowledged is read from the tier below the hot records (the
/// S3 server of the tests when BUS_S3_ENDPOINT is set, else local files).
mod cold {
    use super::Postgres;

    bus_conformance::cold_consumer_suite!(Postgres);
}
