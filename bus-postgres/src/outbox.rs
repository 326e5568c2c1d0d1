//! The transactional outbox (issue #31): a publish inside the caller's own
//! transaction, so an event is stored if and only if the state change it
//! describes commits.
//!
//! The record goes through the same locked round as any publish that has
//! to decide UIDs under the partition's lock (`publish::locked_round`):
//! the same offsets (from the counter row, in the inserting transaction, so
//! a rollback leaves no hole), the same dedup (C6: a UID stored already
//! answers with its offset), the same placed tag (C14) and headers (C25),
//! and the same `NOTIFY`, which PostgreSQL delivers only at commit, so a
//! subscription sees the record after the caller commits and never before.

use bus_core::{BusError, Headers, PublishAck, backend::validate_topic, backend::validate_uid};

use crate::PostgresBus;
use crate::errors::pg;
use crate::publish::{Tx, locked_round, prepare};

/// How often a round is tried again, each in a savepoint of its own, when a
/// row written around the bus takes the slot or the UID claim it chose.
const ATTEMPTS: usize = 4;

impl PostgresBus {
    /// Publishes `value` on `topic` inside `transaction`, which the caller
    /// then commits or rolls back: the record is stored if and only if the
    /// transaction commits, with the offset, dedup and tag of any publish,
    /// and subscriptions see it once it has committed.
    ///
    /// The returned ack names the offset the record has once the caller
    /// commits. Until the transaction ends it holds the lock of the
    /// partition's offset counter (that is how offsets stay gap-free and in
    /// commit order), so every other publish to that partition waits for
    /// it: keep such transactions short.
    ///
    /// `transaction` must be on this bus's database (the bus's tables are
    /// in schema `"<schema>"` there). A `deadpool_postgres::Transaction`
    /// passes as `&mut *transaction`. Each attempt runs in a savepoint, so
    /// a refused attempt never aborts the caller's transaction; an error
    /// returned leaves the transaction usable (the caller decides).
    ///
    /// # Errors
    /// As a publish: `InvalidArgument`, `UnknownTopic`, `TooLarge`, … before
    /// anything is written; a database error as `Backend`/`Unavailable`.
    pub async fn publish_in_transaction(
        &self,
        transaction: &mut tokio_postgres::Transaction<'_>,
        topic: &str,
        key: &str,
        value: &serde_json::Value,
        event_uid: Option<&str>,
        headers: &Headers,
    ) -> Result<PublishAck, BusError> {
        if let Some(uid) = event_uid {
            validate_uid(uid)?;
        }
        validate_topic(topic)?;
        let shared = &self.core.shared;
        let topic = match shared.cached(topic) {
            Some(found) => found,
            None => crate::topics::topic(shared, topic).await?,
        };
        let record = prepare(&topic, key, value, event_uid, headers)?;
        let partition = record.partition;
        for _ in 0..ATTEMPTS {
            let savepoint = transaction
                .savepoint("bus_outbox")
                .await
                .map_err(|e| pg("publish in transaction: savepoint", &e))?;
            let round = locked_round(
                Tx::Caller(&savepoint),
                shared,
                &topic,
                partition,
                &[&record],
            )
            .await;
            match round {
                Ok(Some(locked)) => {
                    savepoint
                        .commit()
                        .await
                        .map_err(|e| pg("publish in transaction: release savepoint", &e))?;
                    let offset = locked.offsets.first().copied().ok_or_else(|| {
                        BusError::backend("postgres", "publish in transaction stored nothing")
                    })?;
                    return Ok(PublishAck {
                        topic: topic.spec.name.clone(),
                        partition,
                        offset,
                    });
                }
                // A foreign row took the slot or the claim: try again.
                Ok(None) => savepoint
                    .rollback()
                    .await
                    .map_err(|e| pg("publish in transaction: roll back savepoint", &e))?,
                Err(error) => {
                    // Leave the caller's transaction as it was before.
                    let _ = savepoint.rollback().await;
                    return Err(error);
                }
            }
        }
        Err(BusError::unavailable(
            "postgres",
            format!(
                "publish in transaction to {:?} partition {partition}: rows written around the bus kept taking the next offsets or UID claims ({ATTEMPTS} attempts); try again",
                topic.spec.name
            ),
        ))
    }
}
