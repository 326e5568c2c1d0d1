//! Provisioning (contract C1), the schema version, and topic lookups (C2:
//! an unknown topic is an error and creates nothing).

use std::sync::Arc;

use bus_core::{BusError, Manifest, TopicSpec};
use tokio_postgres::GenericClient;
use tokio_postgres::error::SqlState;

use crate::errors::{pg, pool};
use crate::shared::{Shared, Topic};
use crate::sql::SCHEMA_VERSION;

/// Refuses a schema written by a newer bus-postgres; a schema not made yet is fine.
pub(crate) async fn check_version(
    shared: &Shared,
    client: &impl GenericClient,
) -> Result<(), BusError> {
    // Asked first, so a missing table fails no statement (inside provision's
    // transaction a failed statement would abort it).
    let exists = client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &[&shared.sql.meta_table],
        )
        .await
        .map_err(|e| pg("schema version check", &e))?;
    if !exists.get::<_, bool>(0) {
        return Ok(());
    }
    let row = client
        .query_opt(&shared.sql.version, &[])
        .await
        .map_err(|e| pg("schema version check", &e))?;
    let Some(row) = row else { return Ok(()) };
    let version: i64 = row.get(0);
    if version > SCHEMA_VERSION {
        return Err(BusError::backend(
            "postgres",
            format!(
                "schema {:?} has bus-postgres schema version {version}, newer than the version {SCHEMA_VERSION} this build understands; upgrade bus-postgres or use another schema (?schema=NAME)",
                shared.sql.schema
            ),
        ));
    }
    add_headers_column(shared, client).await
}

/// Every read names the headers column (C25) and the log start (C24), so
/// tables made before them get them when a bus connects, not only at the
/// next provision (a bus that only reads old records failed with "column
/// headers does not exist"). Asked first: ALTER TABLE would take the
/// table's exclusive lock on every connect. Both are catalog changes (no
/// rewrite): a NULL headers column reads as "no headers", so old rows read
/// and verify as before, and a log start of 0 is where every log began.
async fn add_headers_column(shared: &Shared, client: &impl GenericClient) -> Result<(), BusError> {
    for (table, column, add, what) in [
        (
            &shared.sql.records_table,
            "headers",
            &shared.sql.add_headers,
            "adding the headers column (C25) to a table made before it",
        ),
        (
            &shared.sql.partitions_table,
            "log_start",
            &shared.sql.add_log_start,
            "adding the log start column (C24) to a table made before it",
        ),
    ] {
        let missing = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL AND NOT EXISTS (
                     SELECT 1 FROM pg_attribute
                     WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)",
                &[table, &column],
            )
            .await
            .map_err(|e| pg("column check", &e))?;
        if missing.get::<_, bool>(0) {
            client.batch_execute(add).await.map_err(|e| pg(what, &e))?;
        }
    }
    Ok(())
}

/// Reads a topic row; `None` when the topic (or the whole schema) does not exist.
pub(crate) async fn lookup(
    shared: &Shared,
    client: &impl GenericClient,
    name: &str,
) -> Result<Option<(i32, TopicSpec)>, BusError> {
    let row = match client.query_opt(&shared.sql.topic_by_name, &[&name]).await {
        Ok(row) => row,
        Err(error)
            if error.code() == Some(&SqlState::UNDEFINED_TABLE)
                || error.code() == Some(&SqlState::INVALID_SCHEMA_NAME) =>
        {
            return Ok(None);
        }
        Err(error) => return Err(pg("topic lookup", &error)),
    };
    let Some(row) = row else { return Ok(None) };
    let number = |index: usize| -> Result<u64, BusError> {
        u64::try_from(row.get::<_, i64>(index)).map_err(|_| {
            BusError::backend(
                "postgres",
                format!("topic {name:?}: negative column {index}"),
            )
        })
    };
    let mut spec = TopicSpec::new(
        name,
        u32::try_from(row.get::<_, i32>(1)).map_err(|_| {
            BusError::backend("postgres", format!("topic {name:?}: negative partitions"))
        })?,
    );
    spec.retention_ms = row
        .get::<_, Option<i64>>(2)
        .map(|ms| u64::try_from(ms).unwrap_or(0));
    spec.dedup_window_ms = number(3)?;
    spec.max_record_bytes = number(4)?;
    spec.replication_factor = u16::try_from(row.get::<_, i32>(5)).unwrap_or(1);
    Ok(Some((row.get(0), spec)))
}

/// The topic from the cache, else from the database (another process may have
/// provisioned it).
pub(crate) async fn topic(shared: &Arc<Shared>, name: &str) -> Result<Arc<Topic>, BusError> {
    if let Some(topic) = shared.cached(name) {
        return Ok(topic);
    }
    let client = shared.pool.get().await.map_err(pool)?;
    match lookup(shared, &**client, name).await? {
        Some((id, spec)) => Ok(shared.remember(id, spec)),
        None => Err(BusError::UnknownTopic(name.to_owned())),
    }
}

pub(crate) async fn names(shared: &Shared) -> Result<Vec<String>, BusError> {
    let client = shared.pool.get().await.map_err(pool)?;
    match client.query(&shared.sql.topic_names, &[]).await {
        Ok(rows) => Ok(rows.iter().map(|row| row.get(0)).collect()),
        Err(error)
            if error.code() == Some(&SqlState::UNDEFINED_TABLE)
                || error.code() == Some(&SqlState::INVALID_SCHEMA_NAME) =>
        {
            Ok(Vec::new())
        }
        Err(error) => Err(pg("list topics", &error)),
    }
}

fn as_i64(field: &str, value: u64) -> Result<i64, BusError> {
    i64::try_from(value).map_err(|_| BusError::invalid(field, "too large for PostgreSQL's bigint"))
}

/// Creates what is missing and verifies what exists, in one transaction under
/// an advisory lock, so concurrent provisions of one schema take turns.
pub(crate) async fn provision(shared: &Arc<Shared>, manifest: &Manifest) -> Result<(), BusError> {
    manifest.refuse_cold("the PostgreSQL backend")?;
    let mut client = shared.pool.get().await.map_err(pool)?;
    let tx = client
        .transaction()
        .await
        .map_err(|e| pg("provision: begin", &e))?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('bus-postgres provision ' || $1))",
        &[&shared.sql.schema],
    )
    .await
    .map_err(|e| pg("provision: lock", &e))?;
    check_version(shared, &*tx).await?;
    tx.batch_execute(&shared.sql.create)
        .await
        .map_err(|e| pg("provision: create schema", &e))?;
    let mut created = Vec::new();
    for (index, spec) in manifest.topics.iter().enumerate() {
        if let Some((id, existing)) = lookup(shared, &*tx, &spec.name).await? {
            spec.conflict_with(&existing)?;
            created.push((id, existing));
            continue;
        }
        let field = |name: &str| format!("topics[{index}].{name}");
        let partitions = i32::try_from(spec.partitions)
            .map_err(|_| BusError::invalid(field("partitions"), "too large"))?;
        let retention = spec
            .retention_ms
            .map(|ms| as_i64(&field("retention_ms"), ms))
            .transpose()?;
        let row = tx
            .query_one(
                &shared.sql.insert_topic,
                &[
                    &spec.name,
                    &partitions,
                    &retention,
                    &as_i64(&field("dedup_window_ms"), spec.dedup_window_ms)?,
                    &as_i64(&field("max_record_bytes"), spec.max_record_bytes)?,
                    &i32::from(spec.replication_factor),
                ],
            )
            .await
            .map_err(|e| pg("provision: insert topic", &e))?;
        let id: i32 = row.get(0);
        tx.execute(&shared.sql.insert_partitions, &[&id, &partitions])
            .await
            .map_err(|e| pg("provision: insert partitions", &e))?;
        created.push((id, spec.clone()));
    }
    tx.commit().await.map_err(|e| pg("provision: commit", &e))?;
    for (id, spec) in created {
        shared.remember(id, spec);
    }
    Ok(())
}
