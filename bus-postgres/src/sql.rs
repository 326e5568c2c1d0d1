//! The SQL of the bus, with its schema name filled in once.
//!
//! Tables (schema version 1):
//! - `meta(name, value)`: the `schema_version` row.
//! - `topics`: one row per provisioned topic, its manifest properties.
//! - `partitions(topic_id, partition, next_offset, log_start)`: the offset
//!   counter; its row lock (`FOR UPDATE`) serializes the writers of a
//!   partition, across processes, so offsets come out gap-free in commit
//!   order. `log_start` (C24, 0 until `delete_below` moves it up, never
//!   past the counter) is where the log begins: rows below it were dropped
//!   on purpose (archived to a cold tier), not lost.
//! - `records`: primary key `(topic_id, partition, offset)`, offsets never
//!   negative (a `CHECK`, added `NOT VALID` to tables made before it). The
//!   log of a partition is the offsets from its log start (or, on a topic
//!   with retention, its first record above it) up to the counter, without holes: a row past the
//!   counter is not part of it (a foreign writer's; the bus writes a slot
//!   such a row occupies off as damage and stores past it), a missing row
//!   within it is damage. The first authentic record of a UID (by offset)
//!   answers for it in dedup and find, ranges of the `records_uid` index
//!   read page by page; `claim` is set on the records the bus stores for a
//!   new UID, unique per partition, so the database refuses a second record
//!   of a UID even from a writer that skipped the lookup. Records written
//!   around the bus carry a `uid` but no claim; a claim that does not belong
//!   to an authentic record of its UID is released.
//! - `headers` (C25): `jsonb`, the record's headers as one object of
//!   strings; `NULL` for a record without any. Added to tables made before
//!   it by `ADD COLUMN IF NOT EXISTS` (a catalog change only: no rewrite,
//!   old rows read as records without headers, whose tags are unchanged).
//!   Written and read as text (`$n::text[]` cast to `jsonb`, `headers::text`
//!   back), so the bus needs no JSON support in the driver; the tag covers
//!   the parsed map, never the text, so `jsonb`'s own key order is harmless.
//! - `tag`: 32 bytes, the HMAC over topic, partition, key, UID and value
//!   (written before the offset-bound tags, still accepted), or a version
//!   byte 2 and 32 bytes of `RecordAuth::tag_at`, which also covers the
//!   offset and `stored_at`.

use bus_core::BusError;

use crate::options::PostgresOptions;

/// The schema version this crate writes and understands.
pub(crate) const SCHEMA_VERSION: i64 = 1;

/// Rows of one page of the UID index read by find-by-UID: it reads on past
/// pages whose rows all fail authentication, so forged rows never hide the
/// genuine one, however many.
pub(crate) const FIND_PAGE: i64 = 64;

/// The statements the bus sends, with the schema name filled in: public,
/// read-only, so a tool that writes or reads the same tables (the raw-client
/// benchmark reference in `bus-bench`, a foreign writer) sends exactly
/// the bus's SQL instead of a copy that can drift. Built by
/// [`Sql::for_options`]; the parameters of each are listed on its accessor.
pub struct Sql {
    pub(crate) schema: String,
    pub(crate) version: String,
    pub(crate) meta_table: String,
    /// `"schema".records`, to ask whether it lacks the headers column.
    pub(crate) records_table: String,
    /// Adds the headers column (C25) to a records table made before it.
    pub(crate) add_headers: String,
    /// `"schema".partitions`, to ask whether it lacks the log start column.
    pub(crate) partitions_table: String,
    /// Adds the log start column (C24) to a partitions table made before it.
    pub(crate) add_log_start: String,
    pub(crate) create: String,
    pub(crate) topic_by_name: String,
    pub(crate) topic_names: String,
    pub(crate) insert_topic: String,
    pub(crate) insert_partitions: String,
    pub(crate) lock_partition: String,
    pub(crate) claims: String,
    pub(crate) occupied: String,
    pub(crate) unclaim: String,
    pub(crate) insert_records: String,
    pub(crate) append: String,
    pub(crate) advance: String,
    pub(crate) notify: String,
    pub(crate) fetch: String,
    pub(crate) find: String,
    pub(crate) offsets: String,
    pub(crate) first_young: String,
    pub(crate) expire: String,
    pub(crate) delete_below: String,
}

impl Sql {
    /// `schema` is checked by `PostgresOptions::check` (`[A-Za-z_][A-Za-z0-9_]*`), so
    /// quoting it is enough.
    pub(crate) fn new(schema: &str) -> Self {
        let s = format!("\"{schema}\"");
        Self {
            schema: schema.to_owned(),
            meta_table: format!("{s}.meta"),
            records_table: format!("{s}.records"),
            add_headers: format!("ALTER TABLE {s}.records ADD COLUMN IF NOT EXISTS headers jsonb"),
            partitions_table: format!("{s}.partitions"),
            add_log_start: format!(
                "ALTER TABLE {s}.partitions ADD COLUMN IF NOT EXISTS log_start bigint NOT NULL DEFAULT 0"
            ),
            version: format!("SELECT value FROM {s}.meta WHERE name = 'schema_version'"),
            create: format!(
                "CREATE SCHEMA IF NOT EXISTS {s};
                 CREATE TABLE IF NOT EXISTS {s}.meta (name text PRIMARY KEY, value bigint NOT NULL);
                 INSERT INTO {s}.meta VALUES ('schema_version', {SCHEMA_VERSION}) ON CONFLICT DO NOTHING;
                 CREATE TABLE IF NOT EXISTS {s}.topics (
                     id serial PRIMARY KEY,
                     name text NOT NULL UNIQUE,
                     partitions integer NOT NULL,
                     retention_ms bigint,
                     dedup_window_ms bigint NOT NULL,
                     max_record_bytes bigint NOT NULL,
                     replication_factor integer NOT NULL);
                 CREATE TABLE IF NOT EXISTS {s}.partitions (
                     topic_id integer NOT NULL REFERENCES {s}.topics (id),
                     partition integer NOT NULL,
                     next_offset bigint NOT NULL DEFAULT 0,
                     PRIMARY KEY (topic_id, partition));
                 CREATE TABLE IF NOT EXISTS {s}.records (
                     topic_id integer NOT NULL,
                     partition integer NOT NULL,
                     \"offset\" bigint NOT NULL,
                     key text NOT NULL,
                     uid text,
                     claim text,
                     value bytea NOT NULL,
                     tag bytea,
                     stored_at bigint NOT NULL,
                     headers jsonb,
                     PRIMARY KEY (topic_id, partition, \"offset\"),
                     CONSTRAINT records_offset_nonnegative CHECK (\"offset\" >= 0));
                 DO $$ BEGIN
                     IF NOT EXISTS (SELECT 1 FROM pg_constraint
                                    WHERE conrelid = '{s}.records'::regclass
                                      AND conname = 'records_offset_nonnegative') THEN
                         ALTER TABLE {s}.records ADD CONSTRAINT records_offset_nonnegative
                             CHECK (\"offset\" >= 0) NOT VALID;
                     END IF;
                 END $$;
                 ALTER TABLE {s}.records ADD COLUMN IF NOT EXISTS headers jsonb;
                 ALTER TABLE {s}.partitions ADD COLUMN IF NOT EXISTS log_start bigint NOT NULL DEFAULT 0;
                 CREATE UNIQUE INDEX IF NOT EXISTS records_claim
                     ON {s}.records (topic_id, partition, claim) WHERE claim IS NOT NULL;
                 CREATE INDEX IF NOT EXISTS records_uid
                     ON {s}.records (topic_id, partition, uid, \"offset\") WHERE uid IS NOT NULL;"
            ),
            topic_by_name: format!(
                "SELECT id, partitions, retention_ms, dedup_window_ms, max_record_bytes, replication_factor
                 FROM {s}.topics WHERE name = $1"
            ),
            topic_names: format!("SELECT name FROM {s}.topics ORDER BY name"),
            insert_topic: format!(
                "INSERT INTO {s}.topics (name, partitions, retention_ms, dedup_window_ms, max_record_bytes, replication_factor)
                 VALUES ($1, $2, $3, $4, $5, $6) RETURNING id"
            ),
            insert_partitions: format!(
                "INSERT INTO {s}.partitions (topic_id, partition)
                 SELECT $1, p FROM generate_series(0, $2 - 1) AS p"
            ),
            lock_partition: format!(
                "SELECT next_offset FROM {s}.partitions WHERE topic_id = $1 AND partition = $2 FOR UPDATE"
            ),
            claims: format!(
                // Two ranges, one per index (an `OR` would scan the partition).
                "SELECT uid, \"offset\", key, value, tag, claim, stored_at, headers::text FROM {s}.records
                 WHERE topic_id = $1 AND partition = $2 AND uid = ANY($3)
                 UNION ALL
                 SELECT uid, \"offset\", key, value, tag, claim, stored_at, headers::text FROM {s}.records
                 WHERE topic_id = $1 AND partition = $2 AND claim = ANY($3)
                   AND (uid IS NULL OR uid <> ALL($3))
                 ORDER BY 2"
            ),
            occupied: format!(
                "SELECT \"offset\" FROM {s}.records
                 WHERE topic_id = $1 AND partition = $2 AND \"offset\" >= $3 AND \"offset\" < $4
                 ORDER BY \"offset\""
            ),
            unclaim: format!(
                "UPDATE {s}.records SET claim = NULL
                 WHERE topic_id = $1 AND partition = $2 AND \"offset\" = ANY($3)"
            ),
            insert_records: format!(
                "INSERT INTO {s}.records (topic_id, partition, \"offset\", key, uid, claim, value, tag, stored_at, headers)
                 SELECT $1, $2, o, k, u, u, v, t, $8, h::jsonb
                 FROM unnest($3::bigint[], $4::text[], $5::text[], $6::bytea[], $7::bytea[], $9::text[])
                      AS r (o, k, u, v, t, h)"
            ),
            // The whole round in one statement (one round trip, its own
            // transaction): advance the counter (its row lock serializes the
            // partition's writers), insert the records at the offsets it
            // covered, notify. A UID another writer stored meanwhile fails
            // the claim index, a slot a foreign row occupies the primary
            // key: either rolls all of it back. With `$10` set (the offset
            // the tags were made for) it writes nothing unless the counter
            // is there.
            append: format!(
                "WITH c AS (
                     UPDATE {s}.partitions SET next_offset = next_offset + $3
                     WHERE topic_id = $1 AND partition = $2
                       AND ($10::bigint IS NULL OR next_offset = $10)
                     RETURNING next_offset - $3 AS base),
                 ins AS (
                     INSERT INTO {s}.records (topic_id, partition, \"offset\", key, uid, claim, value, tag, stored_at, headers)
                     SELECT $1, $2, c.base + r.i - 1, r.k, r.u, r.u, r.v, r.t, $8, r.h::jsonb
                     FROM c, unnest($4::text[], $5::text[], $6::bytea[], $7::bytea[], $11::text[])
                          WITH ORDINALITY AS r (k, u, v, t, h, i))
                 SELECT c.base, pg_notify($9, CAST($2 AS integer)::text || ':' || (c.base + $3 - 1)::text)
                 FROM c"
            ),
            advance: format!(
                "UPDATE {s}.partitions SET next_offset = $3 WHERE topic_id = $1 AND partition = $2"
            ),
            notify: "SELECT pg_notify($1, $2)".to_owned(),
            // One snapshot for the rows and the bounds they are checked
            // against (the counter, the first record): a row at least, its
            // record columns NULL when none is in range.
            fetch: format!(
                "SELECT r.\"offset\", r.key, r.uid, r.value, r.tag, r.stored_at, p.next_offset,
                        (SELECT m.\"offset\" FROM {s}.records m
                         WHERE m.topic_id = $1 AND m.partition = $2 AND m.\"offset\" >= p.log_start
                         ORDER BY m.\"offset\" LIMIT 1),
                        r.headers::text, p.log_start
                 FROM {s}.partitions p
                 LEFT JOIN LATERAL (
                     SELECT \"offset\", key, uid, value, tag, stored_at, headers FROM {s}.records
                     WHERE topic_id = $1 AND partition = $2
                       AND \"offset\" >= GREATEST($3::bigint, p.log_start) AND \"offset\" < p.next_offset
                     ORDER BY \"offset\" LIMIT $4) r ON true
                 WHERE p.topic_id = $1 AND p.partition = $2
                 ORDER BY r.\"offset\""
            ),
            find: format!(
                "SELECT r.\"offset\", r.key, r.value, r.tag, r.stored_at, r.headers::text FROM {s}.records r
                 WHERE r.topic_id = $1 AND r.partition = $2 AND r.uid = $3
                   AND r.\"offset\" > $4::bigint
                   AND r.\"offset\" < (SELECT p.next_offset FROM {s}.partitions p
                                      WHERE p.topic_id = $1 AND p.partition = $2)
                   AND r.\"offset\" >= (SELECT p.log_start FROM {s}.partitions p
                                       WHERE p.topic_id = $1 AND p.partition = $2)
                 ORDER BY r.\"offset\" LIMIT {FIND_PAGE}"
            ),
            offsets: format!(
                "SELECT p.next_offset,
                        (SELECT r.\"offset\" FROM {s}.records r
                         WHERE r.topic_id = $1 AND r.partition = $2 AND r.\"offset\" >= p.log_start
                         ORDER BY r.\"offset\" LIMIT 1),
                        p.log_start
                 FROM {s}.partitions p WHERE p.topic_id = $1 AND p.partition = $2"
            ),
            first_young: format!(
                "SELECT \"offset\" FROM {s}.records
                 WHERE topic_id = $1 AND partition = $2 AND stored_at >= $3 AND \"offset\" >= 0
                 ORDER BY \"offset\" LIMIT 1"
            ),
            expire: format!(
                "DELETE FROM {s}.records WHERE topic_id = $1 AND partition = $2 AND \"offset\" < $3"
            ),
            // One statement: the counter row's lock (the UPDATE) orders it
            // with the partition's writers; the log start only moves up, and
            // never past the counter.
            delete_below: format!(
                "WITH p AS (
                     UPDATE {s}.partitions SET log_start = GREATEST(log_start, LEAST($3::bigint, next_offset))
                     WHERE topic_id = $1 AND partition = $2
                     RETURNING log_start)
                 DELETE FROM {s}.records r USING p
                 WHERE r.topic_id = $1 AND r.partition = $2 AND r.\"offset\" < p.log_start"
            ),
        }
    }
}

impl Sql {
    /// The statements for `options.schema`, once the schema name is checked
    /// (`[A-Za-z_][A-Za-z0-9_]{0,62}`, so quoting it is enough).
    pub fn for_options(options: &PostgresOptions) -> Result<Self, BusError> {
        options.check()?;
        Ok(Self::new(&options.schema))
    }

    /// `$1` topic name → `id, partitions, retention_ms, dedup_window_ms,
    /// max_record_bytes, replication_factor`.
    pub fn topic_by_name(&self) -> &str {
        &self.topic_by_name
    }

    /// `$1` topic id, `$2` partition, `$3` UIDs (`text[]`) → the stored
    /// rows carrying or claiming those UIDs: `uid, offset, key, value, tag,
    /// claim, stored_at, headers` (C25, JSON text or `NULL`), by offset.
    pub fn claims(&self) -> &str {
        &self.claims
    }

    /// One append round in one statement: `$1` topic id, `$2` partition,
    /// `$3` record count, `$4` keys, `$5` UIDs, `$6` values (JSON bytes),
    /// `$7` tags, `$8` stored-at (ms), `$9` the NOTIFY channel, `$10` the
    /// counter the round expects (`NULL`: any), `$11` headers (C25: JSON
    /// object text or `NULL` per record) → the first offset written; no row
    /// when the counter is elsewhere.
    pub fn append(&self) -> &str {
        &self.append
    }

    /// `$1` topic id, `$2` partition, `$3` first offset, `$4` limit →
    /// `offset, key, uid, value, tag, stored_at, next_offset, first_offset,
    /// headers, log_start` in offset order, below the counter; one row with the record columns
    /// `NULL` when there is none.
    pub fn fetch(&self) -> &str {
        &self.fetch
    }

    /// `$1` topic id, `$2` partition, `$3` UID, `$4` read after this offset
    /// (−1 from the start) → a page of the records carrying it below the
    /// counter, `offset, key, value, tag, stored_at, headers`, first first.
    pub fn find(&self) -> &str {
        &self.find
    }
}
