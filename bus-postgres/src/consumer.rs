//! Durable consumers on PostgreSQL (C20–C23): the shared engine of
//! `bus_core::consumer` over a cursor table.
//!
//! - `"<schema>".consumers(topic, name, state, owner)`: one row per
//!   consumer, its state as JSON text; created on first use (no schema
//!   version change: older buses never read it).
//! - Writes are compare-and-set on the `owner` column (`UPDATE ... WHERE
//!   owner = $id`), so an instance that lost ownership writes nothing and
//!   learns it (`Fenced`).
//! - Liveness of an owner: a session-level advisory lock on its id, held
//!   on a connection taken out of the pool for the owner's lifetime. A
//!   process that dies loses its connection and so its lock; another
//!   `consume` sees the owner gone. Acquiring runs in a transaction under a
//!   transaction-level advisory lock on (schema, topic, name), so two
//!   acquirers never both see the consumer free.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bus_core::consumer::{
    ConsumeOptions, Consumer, ConsumerInfo, CursorState, CursorStore, DurableConsumers,
    OwnerPolicy, OwnerToken, StoredSelector, delete_consumer, fenced_error, list_consumers,
    open_consumer, reset_consumer,
};
use bus_core::{BusError, Selector, StartAt};
use deadpool_postgres::{ClientWrapper, GenericClient, Object};
use tokio_postgres::error::SqlState;

use crate::PostgresBus;
use crate::errors::{pg, pool};
use crate::inner::Core;

/// How often a `Wait` owner policy looks again (the owner's lock belongs
/// to another session; nothing here is woken when it goes).
const WAIT_POLL: Duration = Duration::from_millis(50);

struct PgCursorStore {
    core: Arc<Core>,
}

/// The owner's own connection, out of the pool: closing it (a drop, or
/// the process dying) releases its advisory lock.
struct OwnerHold {
    client: Option<ClientWrapper>,
}

enum Acquired {
    Got(u64, Box<ClientWrapper>, CursorState),
    Busy,
}

pub(crate) fn table(core: &Core) -> String {
    format!("\"{}\".consumers", core.shared.options.schema)
}

pub(crate) fn as_i64(id: u64) -> i64 {
    i64::from_ne_bytes(id.to_ne_bytes())
}

pub(crate) fn decode(text: &str, owner: Option<i64>) -> Result<CursorState, BusError> {
    let mut state: CursorState = serde_json::from_str(text).map_err(|error| {
        BusError::backend(
            "postgres",
            format!("consumer cursor is not readable: {error}"),
        )
    })?;
    state.owner = owner.map(|id| u64::from_ne_bytes(id.to_ne_bytes()));
    Ok(state)
}

fn random_id() -> Result<u64, BusError> {
    use std::io::Read as _;
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

/// Whether the table is missing (no consumer was ever stored here).
fn missing_table(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&SqlState::UNDEFINED_TABLE)
}

async fn create_table(client: &impl GenericClient, table: &str) -> Result<(), BusError> {
    // Concurrent CREATE TABLE IF NOT EXISTS can collide in the catalog:
    // one transaction-level lock per schema serializes them.
    client
        .batch_execute(&format!(
            "SELECT pg_advisory_xact_lock(hashtextextended('bus-consumers-create {table}', 0));
             CREATE TABLE IF NOT EXISTS {table} (
                 topic text NOT NULL, name text NOT NULL, state text NOT NULL, owner bigint,
                 PRIMARY KEY (topic, name))"
        ))
        .await
        .map_err(|error| pg("create the consumers table", &error))
}

impl CursorStore for PgCursorStore {
    fn acquire(
        &self,
        topic: &str,
        name: &str,
        policy: OwnerPolicy,
        selector: &StoredSelector,
    ) -> Result<(OwnerToken, CursorState), BusError> {
        let started = Instant::now();
        loop {
            let id = random_id()?;
            let (table, topic_s, name_s) = (table(&self.core), topic.to_owned(), name.to_owned());
            let fresh = serde_json::to_string(&CursorState {
                selector: selector.clone(),
                partitions: Default::default(),
                owner: None,
            })?;
            let take_over = policy == OwnerPolicy::TakeOver;
            let acquired = self.core.run("consumer acquire", move |shared| async move {
                let mut client = shared.pool.get().await.map_err(pool)?;
                let tx = client
                    .transaction()
                    .await
                    .map_err(|e| pg("consumer acquire", &e))?;
                create_table(&tx, &table).await?;
                let guard = format!("bus-consumer {table} {topic_s} {name_s}");
                tx.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", &[&guard])
                    .await
                    .map_err(|e| pg("consumer acquire", &e))?;
                let row = tx
                    .query_opt(
                        // FOR UPDATE: an owner's cursor write in flight (its own
                        // or inside a caller's transaction) commits first and
                        // is read here, so the new owner never starts from a
                        // state older than an acknowledgement that committed
                        // (C21, C23).
                        &format!(
                            "SELECT state, owner FROM {table} WHERE topic = $1 AND name = $2 FOR UPDATE"
                        ),
                        &[&topic_s, &name_s],
                    )
                    .await
                    .map_err(|e| pg("consumer acquire", &e))?;
                let stored = match &row {
                    Some(row) => Some(decode(row.get(0), row.get(1))?),
                    None => None,
                };
                if let Some(owner) = stored.as_ref().and_then(|s| s.owner) {
                    let free: bool = tx
                        .query_one(
                            "SELECT CASE WHEN pg_try_advisory_lock($1) THEN pg_advisory_unlock($1) ELSE false END",
                            &[&as_i64(owner)],
                        )
                        .await
                        .map_err(|e| pg("consumer acquire", &e))?
                        .get(0);
                    if !free && !take_over {
                        return Ok(Acquired::Busy);
                    }
                }
                let owner = Object::take(shared.pool.get().await.map_err(pool)?);
                let locked: bool = owner
                    .query_one("SELECT pg_try_advisory_lock($1)", &[&as_i64(id)])
                    .await
                    .map_err(|e| pg("consumer acquire", &e))?
                    .get(0);
                if !locked {
                    return Err(BusError::backend("postgres", "a new owner id is locked already"));
                }
                let mut state = match stored {
                    Some(state) => state,
                    None => decode(&fresh, None)?,
                };
                state.owner = Some(id);
                let text = serde_json::to_string(&state)?;
                tx.execute(
                    &format!(
                        "INSERT INTO {table} (topic, name, state, owner) VALUES ($1, $2, $3, $4)
                         ON CONFLICT (topic, name) DO UPDATE SET owner = EXCLUDED.owner"
                    ),
                    &[&topic_s, &name_s, &text, &as_i64(id)],
                )
                .await
                .map_err(|e| pg("consumer acquire", &e))?;
                tx.commit().await.map_err(|e| pg("consumer acquire", &e))?;
                Ok(Acquired::Got(id, Box::new(owner), state))
            })?;
            match acquired {
                Acquired::Got(id, client, state) => {
                    let hold = OwnerHold {
                        client: Some(*client),
                    };
                    return Ok((
                        OwnerToken {
                            id,
                            hold: Some(Box::new(hold)),
                        },
                        state,
                    ));
                }
                Acquired::Busy => match policy {
                    OwnerPolicy::Wait(wait) if started.elapsed() < wait => {
                        std::thread::sleep(WAIT_POLL);
                    }
                    OwnerPolicy::Wait(wait) => {
                        return Err(BusError::timeout(
                            format!(
                                "waiting for consumer {name:?} of topic {topic:?} to be released"
                            ),
                            wait,
                        ));
                    }
                    _ => {
                        return Err(BusError::ConsumerBusy {
                            topic: topic.to_owned(),
                            consumer: name.to_owned(),
                        });
                    }
                },
            }
        }
    }

    fn store(
        &self,
        topic: &str,
        name: &str,
        token: &OwnerToken,
        state: &CursorState,
    ) -> Result<(), BusError> {
        let mut state = state.clone();
        state.owner = Some(token.id);
        let text = serde_json::to_string(&state)?;
        let (table, topic_s, name_s, id) = (
            table(&self.core),
            topic.to_owned(),
            name.to_owned(),
            as_i64(token.id),
        );
        let outcome = self.core.run("consumer ack", move |shared| async move {
            let client = shared.pool.get().await.map_err(pool)?;
            // Prepared once per pooled connection: a statement given as text
            // costs a round trip of its own on every ack.
            let update = client
                .prepare_cached(&format!(
                    "UPDATE {table} SET state = $3 WHERE topic = $1 AND name = $2 AND owner = $4"
                ))
                .await
                .map_err(|e| pg("consumer ack", &e))?;
            let updated = client
                .execute(&update, &[&topic_s, &name_s, &text, &id])
                .await
                .map_err(|e| pg("consumer ack", &e))?;
            if updated == 1 {
                return Ok(None);
            }
            let row = client
                .query_opt(
                    &format!("SELECT owner FROM {table} WHERE topic = $1 AND name = $2"),
                    &[&topic_s, &name_s],
                )
                .await
                .map_err(|e| pg("consumer ack", &e))?;
            Ok(Some(match row.map(|row| row.get::<_, Option<i64>>(0)) {
                None => "the consumer was deleted",
                Some(None) => "the consumer was reset",
                Some(Some(_)) => "another instance took over",
            }))
        })?;
        match outcome {
            None => Ok(()),
            Some(reason) => Err(fenced_error(topic, name, reason)),
        }
    }

    fn release(&self, _topic: &str, _name: &str, token: OwnerToken) {
        let id = as_i64(token.id);
        let Some(hold) = token.hold else {
            return;
        };
        let Ok(mut hold) = hold.downcast::<OwnerHold>() else {
            return;
        };
        let Some(client) = hold.client.take() else {
            return;
        };
        // Unlock before closing, so the next `consume` finds the consumer
        // free at once (closing alone frees it once the server notices).
        let _ = self.core.run("consumer release", move |_| async move {
            let _ = client
                .execute("SELECT pg_advisory_unlock($1)", &[&id])
                .await;
            drop(client);
            Ok(())
        });
    }

    fn list(&self, topic: &str) -> Result<Vec<(String, CursorState)>, BusError> {
        let (table, topic_s) = (table(&self.core), topic.to_owned());
        self.core.run("consumers", move |shared| async move {
            let client = shared.pool.get().await.map_err(pool)?;
            let rows = match client
                .query(
                    &format!(
                        "SELECT name, state, owner FROM {table} WHERE topic = $1 ORDER BY name"
                    ),
                    &[&topic_s],
                )
                .await
            {
                Ok(rows) => rows,
                Err(error) if missing_table(&error) => return Ok(Vec::new()),
                Err(error) => return Err(pg("consumers", &error)),
            };
            rows.iter()
                .map(|row| Ok((row.get::<_, String>(0), decode(row.get(1), row.get(2))?)))
                .collect()
        })
    }

    fn load(&self, topic: &str, name: &str) -> Result<Option<CursorState>, BusError> {
        let (table, topic_s, name_s) = (table(&self.core), topic.to_owned(), name.to_owned());
        self.core.run("consumer load", move |shared| async move {
            let client = shared.pool.get().await.map_err(pool)?;
            match client
                .query_opt(
                    &format!("SELECT state, owner FROM {table} WHERE topic = $1 AND name = $2"),
                    &[&topic_s, &name_s],
                )
                .await
            {
                Ok(Some(row)) => Ok(Some(decode(row.get(0), row.get(1))?)),
                Ok(None) => Ok(None),
                Err(error) if missing_table(&error) => Ok(None),
                Err(error) => Err(pg("consumer load", &error)),
            }
        })
    }

    fn replace(
        &self,
        topic: &str,
        name: &str,
        state: Option<&CursorState>,
    ) -> Result<bool, BusError> {
        let text = match state {
            Some(state) => {
                let mut state = state.clone();
                state.owner = None;
                Some(serde_json::to_string(&state)?)
            }
            None => None,
        };
        let (table, topic_s, name_s) = (table(&self.core), topic.to_owned(), name.to_owned());
        self.core.run("consumer reset", move |shared| async move {
            let mut client = shared.pool.get().await.map_err(pool)?;
            let tx = client
                .transaction()
                .await
                .map_err(|e| pg("consumer reset", &e))?;
            create_table(&tx, &table).await?;
            let existed = match &text {
                Some(text) => {
                    let before = tx
                        .execute(
                            &format!("UPDATE {table} SET state = $3, owner = NULL WHERE topic = $1 AND name = $2"),
                            &[&topic_s, &name_s, text],
                        )
                        .await
                        .map_err(|e| pg("consumer reset", &e))?;
                    if before == 0 {
                        tx.execute(
                            &format!("INSERT INTO {table} (topic, name, state) VALUES ($1, $2, $3)"),
                            &[&topic_s, &name_s, text],
                        )
                        .await
                        .map_err(|e| pg("consumer reset", &e))?;
                    }
                    before > 0
                }
                None => {
                    tx.execute(
                        &format!("DELETE FROM {table} WHERE topic = $1 AND name = $2"),
                        &[&topic_s, &name_s],
                    )
                    .await
                    .map_err(|e| pg("consumer delete", &e))?
                        > 0
                }
            };
            tx.commit().await.map_err(|e| pg("consumer reset", &e))?;
            Ok(existed)
        })
    }
}

impl PostgresBus {
    fn cursor_store(&self) -> PgCursorStore {
        PgCursorStore {
            core: Arc::clone(&self.core),
        }
    }
}

impl DurableConsumers for PostgresBus {
    fn consume(
        &self,
        topic: &str,
        name: &str,
        selector: Selector,
        start_if_new: StartAt,
        options: ConsumeOptions,
    ) -> Result<Consumer, BusError> {
        let publisher = PostgresBus {
            core: Arc::clone(&self.core),
        };
        open_consumer(
            self,
            Arc::new(publisher),
            Arc::new(self.cursor_store()),
            topic,
            name,
            selector,
            start_if_new,
            options,
        )
    }

    fn consumers(&self, topic: &str) -> Result<Vec<ConsumerInfo>, BusError> {
        list_consumers(self, &self.cursor_store(), topic)
    }

    fn reset_consumer(&self, topic: &str, name: &str, start: StartAt) -> Result<(), BusError> {
        reset_consumer(self, &self.cursor_store(), topic, name, start)
    }

    fn delete_consumer(&self, topic: &str, name: &str) -> Result<bool, BusError> {
        delete_consumer(self, &self.cursor_store(), topic, name)
    }

    fn shared_cursor_store(&self) -> Option<Arc<dyn bus_core::consumer::CursorStore>> {
        Some(Arc::new(self.cursor_store()))
    }
}
