//! A raw tokio-postgres client running the bus's own SQL
//! ([`bus_postgres::Sql`]), for benchmarks (`bus bench` and
//! `examples/bench_postgres.rs`): what the bus costs on top of the
//! statements it sends.

use std::collections::HashMap;

use bus_core::{BusError, now_ms};
use serde_json::Value;
use tokio_postgres::{Client, NoTls, Statement};

use bus_postgres::{PostgresOptions, Sql};

/// A client error as the reference reports it: what the server refused is a
/// backend error, anything else (a lost connection) `Unavailable`; both keep
/// the client's error as their source. The bus's own mapping is finer (it
/// retries shutdowns); a benchmark only needs to stop and say why.
fn pg(what: &str, error: tokio_postgres::Error) -> BusError {
    let message = format!("{what}: {error}");
    if error.as_db_error().is_some() {
        BusError::backend_caused("postgres", message, error)
    } else {
        BusError::unavailable_caused("postgres", message, error)
    }
}

/// One raw connection with its statements prepared once (as the bus's pool
/// caches them), writing partition 0 of one topic the bus provisioned.
pub struct RawConn {
    client: Client,
    sql: Sql,
    topic_id: i32,
    statements: HashMap<&'static str, Statement>,
}

impl RawConn {
    /// Connects (without TLS) and looks up `topic` in the options' schema.
    pub async fn connect(options: &PostgresOptions, topic: &str) -> Result<Self, BusError> {
        let (client, connection) = options
            .config
            .connect(NoTls)
            .await
            .map_err(|e| pg("raw connect", e))?;
        tokio::spawn(connection);
        let sql = Sql::for_options(options)?;
        let row = client
            .query_one(sql.topic_by_name(), &[&topic])
            .await
            .map_err(|e| pg("raw topic", e))?;
        Ok(Self {
            client,
            sql,
            topic_id: row.get(0),
            statements: HashMap::new(),
        })
    }

    async fn statement(&mut self, name: &'static str) -> Result<Statement, BusError> {
        if let Some(statement) = self.statements.get(name) {
            return Ok(statement.clone());
        }
        let text = match name {
            "claims" => self.sql.claims(),
            "append" => self.sql.append(),
            "fetch" => self.sql.fetch(),
            _ => self.sql.find(),
        };
        let statement = self
            .client
            .prepare(text)
            .await
            .map_err(|e| pg("raw prepare", e))?;
        self.statements.insert(name, statement.clone());
        Ok(statement)
    }

    /// What the bus sends for a round whose UIDs are new: the UID lookup
    /// (only when the records carry UIDs), then the one statement that
    /// advances the counter, inserts and notifies `channel`. Returns the
    /// first offset.
    pub async fn append(
        &mut self,
        records: &[(String, Option<String>, Value)],
        channel: &str,
    ) -> Result<i64, BusError> {
        let claims = self.statement("claims").await?;
        let append = self.statement("append").await?;
        let id = self.topic_id;
        let err = |e: tokio_postgres::Error| pg("raw append", e);
        let uids: Vec<Option<&str>> = records.iter().map(|(_, uid, _)| uid.as_deref()).collect();
        let lookup: Vec<&str> = uids.iter().flatten().copied().collect();
        if !lookup.is_empty() {
            self.client
                .query(&claims, &[&id, &0i32, &lookup])
                .await
                .map_err(err)?;
        }
        let count = i64::try_from(records.len()).unwrap_or(i64::MAX);
        let keys: Vec<&str> = records.iter().map(|(key, _, _)| key.as_str()).collect();
        let values = records
            .iter()
            .map(|(_, _, value)| serde_json::to_vec(value))
            .collect::<Result<Vec<_>, _>>()?;
        let tags: Vec<Option<&[u8]>> = vec![None; records.len()];
        // No headers (C25): the column stays NULL, as the bus leaves it.
        let headers: Vec<Option<&str>> = vec![None; records.len()];
        let stored_at = i64::try_from(now_ms()).unwrap_or(i64::MAX);
        let row = self
            .client
            .query_one(
                &append,
                &[
                    &id,
                    &0i32,
                    &count,
                    &keys,
                    &uids,
                    &values,
                    &tags,
                    &stored_at,
                    &channel,
                    &None::<i64>,
                    &headers,
                ],
            )
            .await
            .map_err(err)?;
        Ok(row.get(0))
    }

    /// The connection, for statements of a benchmark's own (a consumer's
    /// cursor update beside the bus's).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Up to `max` records from `from` on, their values decoded; the next
    /// offset to read (or `from` at the end) and how many came.
    pub async fn fetch(&mut self, from: i64, max: i64) -> Result<(i64, usize), BusError> {
        let statement = self.statement("fetch").await?;
        let rows = self
            .client
            .query(&statement, &[&self.topic_id, &0i32, &from, &max])
            .await
            .map_err(|e| pg("raw fetch", e))?;
        // At the end the statement answers one row without a record.
        let mut next = from;
        let mut count = 0;
        for row in &rows {
            if let Some(offset) = row.get::<_, Option<i64>>(0) {
                let _: Value = serde_json::from_slice(row.get::<_, &[u8]>(3))?;
                next = offset + 1;
                count += 1;
            }
        }
        Ok((next, count))
    }

    /// Whether `uid` is stored (one range of the UID index).
    pub async fn find(&mut self, uid: &str) -> Result<bool, BusError> {
        let statement = self.statement("find").await?;
        let rows = self
            .client
            .query(&statement, &[&self.topic_id, &0i32, &uid, &-1i64])
            .await
            .map_err(|e| pg("raw find", e))?;
        Ok(!rows.is_empty())
    }
}

/// [`RawConn`] behind a synchronous face, on a runtime of its own.
pub struct RawPostgres {
    runtime: tokio::runtime::Runtime,
    conn: RawConn,
}

impl RawPostgres {
    /// Connects to `url` (the bus's URL: same schema) for `topic`.
    pub fn new(url: &str, topic: &str) -> Result<Self, BusError> {
        let options = PostgresOptions::from_url(url)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let conn = runtime.block_on(RawConn::connect(&options, topic))?;
        Ok(Self { runtime, conn })
    }

    /// One transaction per record (no UIDs, as `bus bench` publishes).
    pub fn serial(&mut self, events: &[Value]) -> Result<(), BusError> {
        for value in events {
            let record = [("k".to_owned(), None, value.clone())];
            self.runtime
                .block_on(self.conn.append(&record, "bench_raw"))?;
        }
        Ok(())
    }

    /// One transaction for all of `events` (no UIDs).
    pub fn batch(&mut self, events: &[Value]) -> Result<(), BusError> {
        let records: Vec<_> = events
            .iter()
            .map(|value| ("k".to_owned(), None, value.clone()))
            .collect();
        self.runtime
            .block_on(self.conn.append(&records, "bench_raw"))?;
        Ok(())
    }

    /// Reads the partition from 0 in pages of `page`; records read.
    pub fn replay(&mut self, page: i64) -> Result<usize, BusError> {
        let (mut from, mut total) = (0, 0);
        loop {
            let (next, count) = self.runtime.block_on(self.conn.fetch(from, page))?;
            if count == 0 {
                return Ok(total);
            }
            (from, total) = (next, total + count);
        }
    }
}
