//! An acknowledgement inside the caller's own transaction: exactly-once
//! processing on PostgreSQL (issue #28; contract C21, C23).
//!
//! The handler's writes and the cursor advance are one transaction, so they
//! commit together or not at all. The bus takes the transaction by value,
//! writes the cursor in it (compare-and-set on the owner, C23), and commits
//! it itself: the caller never holds a transaction whose cursor write was
//! refused, so a fenced instance cannot commit its writes by mistake.

use std::future::Future;

use bus_core::BusError;
use bus_core::consumer::{Consumer, Delivery, ExternalAck};

use crate::PostgresBus;
use crate::consumer::{as_i64, decode, table};
use crate::errors::{pg, pool};

/// A transaction of the caller's that [`PostgresBus::ack_in_transaction`]
/// can write a cursor into and then commit or roll back: a
/// `tokio_postgres::Transaction` or a `deadpool_postgres::Transaction`
/// (use the `tokio_postgres` this crate re-exports, so the types match).
pub trait CallerTransaction: Send {
    /// The transaction to run statements in.
    fn transaction(&self) -> &tokio_postgres::Transaction<'_>;
    /// Commits it.
    fn commit(self) -> impl Future<Output = Result<(), tokio_postgres::Error>> + Send;
    /// Rolls it back.
    fn rollback(self) -> impl Future<Output = Result<(), tokio_postgres::Error>> + Send;
}

impl CallerTransaction for tokio_postgres::Transaction<'_> {
    fn transaction(&self) -> &tokio_postgres::Transaction<'_> {
        self
    }
    fn commit(self) -> impl Future<Output = Result<(), tokio_postgres::Error>> + Send {
        tokio_postgres::Transaction::commit(self)
    }
    fn rollback(self) -> impl Future<Output = Result<(), tokio_postgres::Error>> + Send {
        tokio_postgres::Transaction::rollback(self)
    }
}

impl CallerTransaction for deadpool_postgres::Transaction<'_> {
    fn transaction(&self) -> &tokio_postgres::Transaction<'_> {
        self
    }
    fn commit(self) -> impl Future<Output = Result<(), tokio_postgres::Error>> + Send {
        deadpool_postgres::Transaction::commit(self)
    }
    fn rollback(self) -> impl Future<Output = Result<(), tokio_postgres::Error>> + Send {
        deadpool_postgres::Transaction::rollback(self)
    }
}

/// What [`PostgresBus::ack_in_transaction`] did with the caller's
/// transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum TransactionalAck {
    /// The caller's writes and the acknowledgement committed together: the
    /// record is never delivered to this consumer again (C21).
    Committed,
    /// The delivery was acknowledged already (a second ack of the same
    /// delivery): the transaction was rolled back, so the handler's writes
    /// for it do not land twice, and nothing changed.
    AlreadyAcknowledged,
}

impl PostgresBus {
    /// Acknowledges `delivery` inside the caller's `transaction` and
    /// commits it: the handler's own writes in that transaction and the
    /// consumer's cursor advance commit together or not at all
    /// (exactly-once processing on PostgreSQL).
    ///
    /// - The cursor row is updated in `transaction` only where its owner is
    ///   still this instance (C23). The row stays locked until the commit,
    ///   so a `TakeOver` by another instance waits for it and then reads the
    ///   committed cursor.
    /// - Fenced (another instance took over, or the consumer was reset or
    ///   deleted): the transaction is rolled back, nothing of it commits,
    ///   and [`BusError::Fenced`] is returned; the instance stays fenced.
    /// - Any other error before the commit (a bad delivery, a failed
    ///   statement): rolled back, the record stays in flight and is
    ///   delivered again after `ack_wait` or a restart.
    /// - The commit itself fails: the bus reads the cursor row back (`FOR
    ///   SHARE`, waiting for a commit still in flight) to learn whether the
    ///   commit happened; if it did, `Committed`; if it did not, the error,
    ///   the record in flight; if the row cannot be read in time,
    ///   the instance is fenced (its in-memory state could be wrong either
    ///   way) and the error returned: open the consumer again to continue
    ///   from what committed.
    /// - The consumer's in-memory state follows only what committed: it is
    ///   changed after the commit, never before. Pending acknowledgements
    ///   of the same instance (`ack_every(n)` batches) become durable with
    ///   this one.
    ///
    /// `transaction` must be a top-level transaction on this bus's
    /// database (the cursor table is `"<schema>".consumers`): a savepoint
    /// (a `transaction()` nested in another) "commits" by a release, and an
    /// outer rollback would then undo an acknowledgement the consumer
    /// already counts (the record would come again only after a restart).
    /// `consumer` must come from
    /// [`DurableConsumers::consume`](bus_core::consumer::DurableConsumers::consume)
    /// on this bus. The consumer itself is synchronous: an async caller
    /// receives with `try_recv`, or `recv_timeout` inside
    /// `tokio::task::spawn_blocking`/`block_in_place`, and awaits this.
    pub async fn ack_in_transaction<T: CallerTransaction>(
        &self,
        consumer: &mut Consumer,
        transaction: T,
        delivery: &Delivery,
    ) -> Result<TransactionalAck, BusError> {
        let prepared = match consumer.prepare_external_ack(delivery) {
            Ok(Some(prepared)) => prepared,
            Ok(None) => {
                transaction.rollback().await.map_err(|e| {
                    pg(
                        "roll back a transaction whose delivery was acknowledged already",
                        &e,
                    )
                })?;
                return Ok(TransactionalAck::AlreadyAcknowledged);
            }
            Err(error) => {
                // Dropping the transaction rolls it back; say so explicitly
                // so the caller's writes are gone before the error returns.
                let _ = transaction.rollback().await;
                return Err(error);
            }
        };
        let table = table(&self.core);
        let text = serde_json::to_string(&prepared.state)?;
        let (topic, name) = (consumer.topic().to_owned(), consumer.name().to_owned());
        let owner = as_i64(prepared.owner);
        let written = transaction
            .transaction()
            .execute(
                &format!(
                    "UPDATE {table} SET state = $3 WHERE topic = $1 AND name = $2 AND owner = $4"
                ),
                &[&topic, &name, &text, &owner],
            )
            .await;
        match written {
            Ok(1) => {}
            Ok(_) => {
                let reason = fence_reason(transaction.transaction(), &table, &topic, &name).await;
                let _ = transaction.rollback().await;
                return Err(consumer.fence(reason));
            }
            Err(error) => {
                let _ = transaction.rollback().await;
                return Err(pg("consumer ack in transaction", &error));
            }
        }
        match transaction.commit().await {
            Ok(()) => {
                consumer.confirm_external_ack(prepared);
                Ok(TransactionalAck::Committed)
            }
            Err(error) => {
                let failed = pg("commit a transaction with a consumer ack", &error);
                match self
                    .committed_anyway(&table, &topic, &name, &prepared)
                    .await
                {
                    Ok(true) => {
                        consumer.confirm_external_ack(prepared);
                        Ok(TransactionalAck::Committed)
                    }
                    Ok(false) => Err(failed),
                    Err(_) => {
                        let _ = consumer
                            .fence("the outcome of a commit with an ack is unknown: open the consumer again");
                        Err(failed)
                    }
                }
            }
        }
    }

    /// Whether the cursor row holds exactly what `prepared` wrote. Read
    /// `FOR SHARE`, so a commit still in flight on the server (the COMMIT
    /// arrived, the answer was lost) finishes first, or the read runs into
    /// the bus's timeout and the outcome stays unknown. Read through the
    /// bus's own connector (the caller's connection is broken), on a thread
    /// of its own: a pooled connection made from the caller's runtime would
    /// be driven only while that runtime polls it.
    async fn committed_anyway(
        &self,
        table: &str,
        topic: &str,
        name: &str,
        prepared: &ExternalAck,
    ) -> Result<bool, BusError> {
        let core = std::sync::Arc::clone(&self.core);
        let (table, topic, name) = (table.to_owned(), topic.to_owned(), name.to_owned());
        let (send, receive) = futures::channel::oneshot::channel();
        std::thread::Builder::new()
            .name("bus-postgres-ack-check".to_owned())
            .spawn(move || {
                let read = core.run("consumer ack check", move |shared| async move {
                    let mut client = shared.pool.get().await.map_err(pool)?;
                    let transaction = client
                        .transaction()
                        .await
                        .map_err(|e| pg("consumer ack check", &e))?;
                    let row = transaction
                        .query_opt(
                            &format!(
                                "SELECT state, owner FROM {table} WHERE topic = $1 AND name = $2 FOR SHARE"
                            ),
                            &[&topic, &name],
                        )
                        .await
                        .map_err(|e| pg("consumer ack check", &e))?;
                    row.map(|row| decode(row.get(0), row.get(1))).transpose()
                });
                let _ = send.send(read);
            })?;
        let stored = receive
            .await
            .map_err(|_| BusError::backend("postgres", "the ack check thread is gone"))??;
        Ok(stored.as_ref() == Some(&prepared.state))
    }
}

/// Why the owner compare-and-set found no row of this instance.
async fn fence_reason(
    transaction: &tokio_postgres::Transaction<'_>,
    table: &str,
    topic: &str,
    name: &str,
) -> &'static str {
    let row = transaction
        .query_opt(
            &format!("SELECT owner FROM {table} WHERE topic = $1 AND name = $2"),
            &[&topic, &name],
        )
        .await;
    match row {
        Ok(None) => "the consumer was deleted",
        Ok(Some(row)) => match row.try_get::<_, Option<i64>>(0) {
            Ok(None) => "the consumer was reset",
            _ => "another instance took over",
        },
        Err(_) => "another instance took over",
    }
}
