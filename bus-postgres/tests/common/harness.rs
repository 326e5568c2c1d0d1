//! The conformance suite's harness for PostgreSQL (`BUS_POSTGRES_URL`):
//! each case owns a schema, dropped when the case ends.

use bus_conformance::{Harness, Namespace, RawRecord, Unavailable};
use bus_core::{BusError, EventBus};
use bus_postgres::{PostgresBus, PostgresOptions};

/// The suite's harness; `through_async` runs every case through the async
/// surface of a bus made by `PostgresBus::connect_async`.
pub struct Postgres {
    pub through_async: bool,
}

struct PostgresNamespace {
    through_async: bool,
    options: PostgresOptions,
    runtime: tokio::runtime::Runtime,
}

impl Harness for Postgres {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn namespace(&self) -> Result<Box<dyn Namespace>, Unavailable> {
        let url = bus_conformance::brokers::postgres_url()?;
        let options = PostgresOptions::from_url(&url)
            .map_err(|error| Unavailable(format!("BUS_POSTGRES_URL: {error}")))?
            .schema(format!("bt_{}", bus_conformance::namespace_id(12)));
        Ok(Box::new(PostgresNamespace {
            through_async: self.through_async,
            options,
            runtime: bus_conformance::current_thread_runtime()?,
        }))
    }
}

impl PostgresNamespace {
    /// A plain client beside the bus, as a foreign writer.
    fn raw(&self) -> Result<tokio_postgres::Client, BusError> {
        let config = self.options.config.clone();
        self.runtime.block_on(async move {
            let (client, connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(|error| BusError::backend("postgres", format!("raw connect: {error}")))?;
            tokio::spawn(connection);
            Ok(client)
        })
    }
}

impl Namespace for PostgresNamespace {
    fn open(&mut self) -> Result<Box<dyn EventBus>, BusError> {
        let options = self.options.clone();
        #[cfg(feature = "async")]
        if self.through_async {
            return Ok(Box::new(bus_conformance::ThroughAsync::build(|| {
                PostgresBus::connect_async_with(options)
            })?));
        }
        assert!(!self.through_async, "the async surface needs feature async");
        Ok(Box::new(PostgresBus::connect_with(options)?))
    }

    fn inject_raw(
        &mut self,
        _bus: &mut Option<Box<dyn EventBus>>,
        topic: &str,
        partition: u32,
        raw: &RawRecord,
    ) -> Result<(), BusError> {
        let client = self.raw()?;
        let s = format!("\"{}\"", self.options.schema);
        let part =
            i32::try_from(partition).map_err(|_| BusError::backend("postgres", "partition"))?;
        let raw = raw.clone();
        let topic = topic.to_owned();
        // Takes the next offset under the counter's row lock, as the bus
        // does, and claims no UID (a foreign writer does not know the claim
        // column): the bus must still refuse it by its tag.
        self.runtime.block_on(async move {
            let sql = format!(
                "WITH t AS (SELECT id FROM {s}.topics WHERE name = $1),
                      c AS (UPDATE {s}.partitions SET next_offset = next_offset + 1
                            WHERE topic_id = (SELECT id FROM t) AND partition = $2
                            RETURNING next_offset - 1 AS o)
                 INSERT INTO {s}.records (topic_id, partition, \"offset\", key, uid, value, tag, stored_at, headers)
                 SELECT (SELECT id FROM t), $2, o, $3, $4, $5, $6,
                        (extract(epoch FROM clock_timestamp()) * 1000)::bigint, $7::text::jsonb FROM c"
            );
            // The caller's headers (C25) as the bus stores them.
            let headers = (!raw.headers.is_empty())
                .then(|| serde_json::to_string(&raw.headers))
                .transpose()
                .map_err(|error| BusError::backend("postgres", format!("headers: {error}")))?;
            let inserted = client
                .execute(
                    &sql,
                    &[&topic, &part, &raw.key, &raw.uid, &raw.value, &raw.tag, &headers],
                )
                .await
                .map_err(|error| BusError::backend("postgres", format!("raw insert: {error}")))?;
            if inserted == 1 {
                Ok(())
            } else {
                Err(BusError::backend("postgres", format!("raw insert stored {inserted} rows")))
            }
        })
    }
}

impl Drop for PostgresNamespace {
    fn drop(&mut self) {
        let Ok(client) = self.raw() else { return };
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.options.schema);
        let _ = self
            .runtime
            .block_on(async move { client.batch_execute(&sql).await });
    }
}
