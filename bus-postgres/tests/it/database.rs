//! What the database decides on its own, against the shared server
//! (`BUS_POSTGRES_URL`), each test in a schema of its own: concurrent retries
//! of one UID from several buses (separate sessions, as separate processes
//! would be) store one record; a schema written by a newer bus-postgres is
//! refused with a clear error; rows written, deleted or edited with SQL
//! around the bus (issue #25) never pass for genuine ones, never hide them
//! and never stop the log.

use bus_core::{BusError, EventBus, Manifest, TopicSpec};
use bus_postgres::{PostgresBus, PostgresOptions};
use serde_json::json;

const KEY: [u8; 32] = [0x5a; 32];

/// Where `topic`'s partition 0 rows live, for SQL written around the bus.
const ROWS: &str =
    "{s}.records WHERE topic_id = (SELECT id FROM {s}.topics WHERE name = 't') AND partition = 0";

fn offsets_of(events: &[bus_core::StoredEvent]) -> Vec<u64> {
    events.iter().map(|event| event.offset).collect()
}

fn integrity_at(result: Result<Vec<bus_core::StoredEvent>, BusError>, at: u64) {
    match result {
        Err(BusError::Integrity { offset, .. }) if offset == at => {}
        other => panic!("expected Integrity at {at}, got {other:?}"),
    }
}

fn corrupt_at(result: Result<Vec<bus_core::StoredEvent>, BusError>, at: u64) {
    match result {
        Err(BusError::Corrupt { offset, .. }) if offset == at => {}
        other => panic!("expected Corrupt at {at}, got {other:?}"),
    }
}

struct Schema {
    options: PostgresOptions,
}

impl Schema {
    fn new(test: &str) -> Option<Self> {
        let url = match bus_conformance::brokers::postgres_url() {
            Ok(url) => url,
            Err(why) if !bus_conformance::brokers_required() => {
                bus_conformance::loud(&format!("SKIPPED {test}: {why}"));
                return None;
            }
            Err(why) => panic!("{test}: BUS_REQUIRE_BROKERS=1 but {why}"),
        };
        let id = uuid::Uuid::new_v4().simple().to_string();
        let options = PostgresOptions::from_url(&url)
            .expect("BUS_POSTGRES_URL")
            .schema(format!("bt_{}", &id[..12]));
        Some(Self { options })
    }

    fn sql(&self, sql: &str) {
        if let Err(error) = self.try_sql(sql) {
            panic!("raw sql: {error}");
        }
    }

    /// Runs `sql` with `{s}` standing for the quoted schema name; the
    /// server's refusal as text.
    fn try_sql(&self, sql: &str) -> Result<(), String> {
        let sql = sql.replace("{s}", &format!("\"{}\"", self.options.schema));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let config = self.options.config.clone();
        runtime.block_on(async move {
            let (client, connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .expect("raw connect");
            tokio::spawn(connection);
            client
                .batch_execute(&sql)
                .await
                .map_err(|e| format!("{e:?}"))
        })
    }

    /// A bus on this schema with the test key, topic `t` (one partition)
    /// provisioned.
    fn keyed_bus(&self) -> PostgresBus {
        let bus = PostgresBus::connect_with(self.options.clone()).expect("connect");
        bus.set_control_key(KEY).expect("key");
        bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
            .expect("provision");
        bus
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        self.sql(&format!(
            "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
            self.options.schema
        ));
    }
}

#[test]
fn concurrent_retries_from_several_buses_store_one_record_per_uid() {
    let Some(schema) = Schema::new("concurrent_retries") else {
        return;
    };
    let buses: Vec<PostgresBus> = (0..4)
        .map(|_| PostgresBus::connect_with(schema.options.clone()).expect("connect"))
        .collect();
    buses[0]
        .provision(&Manifest::new([TopicSpec::new("t", 2)]))
        .expect("provision");
    let spec = buses[3].topic_spec("t").expect("topic_spec");
    assert_eq!(
        spec.map(|spec| spec.partitions),
        Some(2),
        "another bus reads the spec"
    );
    let uids = 50;
    let acks: Vec<Vec<_>> = std::thread::scope(|scope| {
        let threads: Vec<_> = buses
            .iter()
            .flat_map(|bus| (0..2).map(move |_| bus))
            .map(|bus| {
                scope.spawn(move || {
                    (0..uids)
                        .map(|i| {
                            bus.publish_idempotent(
                                "t",
                                &format!("k{i}"),
                                &json!({"i": i}),
                                &format!("u{i}"),
                            )
                            .expect("publish")
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("publisher"))
            .collect()
    });
    for i in 0..uids {
        let first = &acks[0][i];
        assert!(
            acks.iter().all(|mine| &mine[i] == first),
            "u{i} got different acks"
        );
    }
    let stored: u64 = (0..2)
        .map(|p| buses[1].offsets("t", p).expect("offsets").next)
        .sum();
    assert_eq!(stored, uids as u64, "one record per UID");
}

#[test]
fn a_schema_from_a_newer_version_is_refused() {
    let Some(schema) = Schema::new("newer_schema") else {
        return;
    };
    let bus = PostgresBus::connect_with(schema.options.clone()).expect("connect");
    bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
        .expect("provision");
    drop(bus);
    schema.sql(&format!(
        "UPDATE \"{}\".meta SET value = 99 WHERE name = 'schema_version'",
        schema.options.schema
    ));
    let error = PostgresBus::connect_with(schema.options.clone()).expect_err("newer schema");
    assert!(
        matches!(error, BusError::BackendFailure { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("99") && message.contains("upgrade"),
        "{message}"
    );
}

#[test]
fn unknown_topics_create_nothing() {
    let Some(schema) = Schema::new("unknown_topics") else {
        return;
    };
    let bus = PostgresBus::connect_with(schema.options.clone()).expect("connect");
    assert!(matches!(
        bus.publish("nope", "k", &json!(1)),
        Err(BusError::UnknownTopic(_))
    ));
    assert!(bus.topics().is_empty());
    // Not even the schema exists before a provision.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let config = schema.options.config.clone();
    let name = schema.options.schema.clone();
    let found = runtime.block_on(async move {
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .expect("raw connect");
        tokio::spawn(connection);
        client
            .query_one(
                "SELECT count(*) FROM pg_namespace WHERE nspname = $1",
                &[&name],
            )
            .await
            .expect("query")
            .get::<_, i64>(0)
    });
    assert_eq!(
        found, 0,
        "publishing to an unknown topic created the schema"
    );
}

/// Issue #25 (C5): offsets are gap-free by construction here, so a row
/// deleted with SQL is damage: fetch returns the records before it, then
/// `Corrupt` naming the missing offset, wherever it starts reading (a
/// deleted first record of a topic without retention too).
#[test]
fn a_deleted_record_is_a_gap_named_by_fetch() {
    let Some(schema) = Schema::new("deleted_record") else {
        return;
    };
    let bus = schema.keyed_bus();
    for i in 0..6 {
        bus.publish("t", "k", &json!({"i": i})).expect("publish");
    }
    schema.sql(&format!("DELETE FROM {ROWS} AND \"offset\" IN (0, 2, 5)"));
    let read = bus.fetch("t", 0, 1, 3).expect("the records before the gap");
    assert_eq!(offsets_of(&read), [1], "fetch skipped the deleted record");
    corrupt_at(bus.fetch("t", 0, 2, 3), 2);
    assert_eq!(
        offsets_of(&bus.fetch("t", 0, 3, 2).expect("past it")),
        [3, 4]
    );
    // The last record and the first one (no retention: the log starts at 0).
    assert_eq!(
        offsets_of(&bus.fetch("t", 0, 3, 10).expect("before")),
        [3, 4]
    );
    corrupt_at(bus.fetch("t", 0, 5, 10), 5);
    corrupt_at(bus.fetch("t", 0, 0, 10), 0);
    assert_eq!(bus.offsets("t", 0).expect("offsets").first, 0);
    // The log goes on after the damage.
    let ack = bus.publish("t", "k", &json!({"i": 6})).expect("publish");
    assert_eq!(ack.offset, 6);
    assert_eq!(offsets_of(&bus.fetch("t", 0, 6, 10).expect("new")), [6]);
}

/// Issue #25 (C7, C14): a byte-exact copy of a UID record, inserted at
/// offset −1 or into a deleted slot below the original, never answers for
/// the UID, and publishing that UID goes on answering the original.
#[test]
fn a_copied_uid_record_never_takes_the_originals_place() {
    let Some(schema) = Schema::new("copied_uid") else {
        return;
    };
    let bus = schema.keyed_bus();
    bus.publish("t", "k", &json!("a")).expect("publish");
    bus.publish("t", "k", &json!("b")).expect("publish");
    let original = bus
        .publish_idempotent("t", "k", &json!({"pay": 7}), "u")
        .expect("publish");
    assert_eq!(original.offset, 2);
    let copy = |to: i64| {
        format!(
            "INSERT INTO {{s}}.records (topic_id, partition, \"offset\", key, uid, value, tag, stored_at)
             SELECT topic_id, partition, {to}, key, uid, value, tag, stored_at FROM {ROWS} AND \"offset\" = 2"
        )
    };
    // The table may refuse a negative offset; if it takes it, it is no record.
    let _ = schema.try_sql(&copy(-1));
    let check = |when: &str| {
        assert_eq!(
            bus.find_event_by_uid("t", "k", "u").expect("find"),
            Some(original.clone()),
            "find after {when}"
        );
        assert_eq!(
            bus.publish_idempotent("t", "k", &json!({"pay": 7}), "u")
                .expect("a retry"),
            original,
            "a retry after {when}"
        );
    };
    check("a copy at -1");
    schema.sql(&format!("DELETE FROM {ROWS} AND \"offset\" = 0"));
    schema.sql(&copy(0));
    check("a copy in a deleted slot below");
    integrity_at(bus.fetch("t", 0, 0, 10), 0);
    let reopened = PostgresBus::connect_with(schema.options.clone()).expect("reopen");
    reopened.set_control_key(KEY).expect("key");
    assert_eq!(
        reopened.find_event_by_uid("t", "k", "u").expect("find"),
        Some(original)
    );
}

/// Issue #25 (C7): any number of forged rows carrying a UID, all before the
/// genuine record, never hide it from find-by-UID or dedup.
#[test]
fn forged_rows_never_hide_a_stored_uid() {
    let Some(schema) = Schema::new("forged_uid_rows") else {
        return;
    };
    let bus = schema.keyed_bus();
    for i in 0..70 {
        bus.publish("t", "k", &json!({"i": i})).expect("publish");
    }
    let genuine = bus
        .publish_idempotent("t", "k", &json!({"pay": 1}), "u")
        .expect("publish");
    assert_eq!(genuine.offset, 70);
    schema.sql(
        "UPDATE {s}.records SET uid = 'u' WHERE topic_id = (SELECT id FROM {s}.topics WHERE name = 't')
         AND partition = 0 AND \"offset\" < 70",
    );
    assert_eq!(
        bus.find_event_by_uid("t", "k", "u").expect("find"),
        Some(genuine.clone()),
        "70 forged rows hid the genuine record"
    );
    assert_eq!(
        bus.publish_idempotent("t", "k", &json!({"pay": 1}), "u")
            .expect("a retry"),
        genuine
    );
    integrity_at(bus.fetch("t", 0, 0, 10), 0);
    assert_eq!(bus.offsets("t", 0).expect("offsets").next, 71);
}

/// Issue #25: a foreign row past the partition's counter, or a foreign
/// claim row without a UID, never stops publishing: the bus skips the
/// occupied slot (which then reads as `Integrity`), keeps offsets gap-free
/// and every acked record readable.
#[test]
fn foreign_rows_cannot_stop_publishing() {
    let Some(schema) = Schema::new("foreign_rows") else {
        return;
    };
    let bus = schema.keyed_bus();
    bus.publish("t", "k", &json!(0)).expect("publish");
    bus.publish("t", "k", &json!(1)).expect("publish");
    // Two offsets past the counter (2), a copy of record 1.
    schema.sql(&format!(
        "INSERT INTO {{s}}.records (topic_id, partition, \"offset\", key, uid, value, tag, stored_at)
         SELECT topic_id, partition, 4, key, uid, value, tag, stored_at FROM {ROWS} AND \"offset\" = 1"
    ));
    // Nothing past the counter is part of the log yet.
    assert!(bus.fetch("t", 0, 2, 10).expect("at the end").is_empty());
    let mut acked = Vec::new();
    for i in 2..7 {
        let ack = bus
            .publish("t", "k", &json!(i))
            .expect("publish past a foreign row");
        acked.push(ack.offset);
    }
    assert_eq!(acked, [2, 3, 5, 6, 7], "the occupied slot 4 is skipped");
    assert_eq!(
        offsets_of(&bus.fetch("t", 0, 0, 10).expect("before it")),
        [0, 1, 2, 3]
    );
    integrity_at(bus.fetch("t", 0, 4, 10), 4);
    let after = bus.fetch("t", 0, 5, 10).expect("after it");
    assert_eq!(offsets_of(&after), [5, 6, 7]);
    assert_eq!(after[0].value, json!(4));
    // A batch across several occupied slots.
    schema.sql(
        "INSERT INTO {s}.records (topic_id, partition, \"offset\", key, value, stored_at)
         SELECT id, 0, o, 'k', '1', 0 FROM {s}.topics, (VALUES (9::bigint), (10)) AS f (o)
         WHERE name = 't'",
    );
    let batch: Vec<bus_core::BatchRecord> = (0..3)
        .map(|i| bus_core::BatchRecord::new("k", json!({"batch": i})))
        .collect();
    let acks = bus.publish_batch("t", &batch).expect("batch");
    assert_eq!(
        acks.iter().map(|ack| ack.offset).collect::<Vec<_>>(),
        [8, 11, 12]
    );
    // A claim row without a UID, somewhere ahead.
    schema.sql(&format!(
        "INSERT INTO {{s}}.records (topic_id, partition, \"offset\", key, claim, value, stored_at)
         SELECT topic_id, partition, 1000, 'k', 'v', '1', 0 FROM {ROWS} AND \"offset\" = 0"
    ));
    let first = bus
        .publish_idempotent("t", "k", &json!("v"), "v")
        .expect("publish a UID a foreign row claims");
    assert_eq!(first.offset, 13);
    assert_eq!(
        bus.publish_idempotent("t", "k", &json!("v"), "v")
            .expect("retry"),
        first
    );
    assert_eq!(
        bus.find_event_by_uid("t", "k", "v").expect("find"),
        Some(first)
    );
}

/// Issue #25 (C14): on PostgreSQL the tag covers the offset and
/// `stored_at`: two records swapping offsets, or an edited time, read as
/// `Integrity` naming the offset.
#[test]
fn moved_records_and_edited_times_are_not_authentic() {
    let Some(schema) = Schema::new("moved_records") else {
        return;
    };
    let bus = schema.keyed_bus();
    for i in 0..3 {
        bus.publish("t", "k", &json!({"i": i})).expect("publish");
    }
    for (from, to) in [(0, 1000), (1, 0), (1000, 1)] {
        schema.sql(&format!(
            "UPDATE {{s}}.records SET \"offset\" = {to} WHERE topic_id = (SELECT id FROM {{s}}.topics WHERE name = 't') AND partition = 0 AND \"offset\" = {from}"
        ));
    }
    integrity_at(bus.fetch("t", 0, 0, 10), 0);
    integrity_at(bus.fetch("t", 0, 1, 10), 1);
    assert_eq!(
        offsets_of(&bus.fetch("t", 0, 2, 10).expect("untouched")),
        [2]
    );
    schema.sql(
        "UPDATE {s}.records SET stored_at = stored_at - 60000 WHERE topic_id = (SELECT id FROM {s}.topics WHERE name = 't') AND partition = 0 AND \"offset\" = 2",
    );
    integrity_at(bus.fetch("t", 0, 2, 10), 2);
}

/// Tables and records written by the previous version (schema 1, tags
/// over topic, partition, key, UID and value only) still read, answer for
/// their UIDs and take new records; the next provision makes negative
/// offsets impossible.
#[test]
fn records_of_the_previous_version_still_read() {
    use bus_core::auth::{RecordAuth, RecordParts};
    let Some(schema) = Schema::new("previous_version") else {
        return;
    };
    schema.sql(
        "CREATE SCHEMA {s};
         CREATE TABLE {s}.meta (name text PRIMARY KEY, value bigint NOT NULL);
         INSERT INTO {s}.meta VALUES ('schema_version', 1);
         CREATE TABLE {s}.topics (id serial PRIMARY KEY, name text NOT NULL UNIQUE,
             partitions integer NOT NULL, retention_ms bigint, dedup_window_ms bigint NOT NULL,
             max_record_bytes bigint NOT NULL, replication_factor integer NOT NULL);
         CREATE TABLE {s}.partitions (topic_id integer NOT NULL REFERENCES {s}.topics (id),
             partition integer NOT NULL, next_offset bigint NOT NULL DEFAULT 0,
             PRIMARY KEY (topic_id, partition));
         CREATE TABLE {s}.records (topic_id integer NOT NULL, partition integer NOT NULL,
             \"offset\" bigint NOT NULL, key text NOT NULL, uid text, claim text,
             value bytea NOT NULL, tag bytea, stored_at bigint NOT NULL,
             PRIMARY KEY (topic_id, partition, \"offset\"));
         CREATE UNIQUE INDEX records_claim ON {s}.records (topic_id, partition, claim) WHERE claim IS NOT NULL;
         CREATE INDEX records_uid ON {s}.records (topic_id, partition, uid, \"offset\") WHERE uid IS NOT NULL;",
    );
    let spec = TopicSpec::new("t", 1);
    schema.sql(&format!(
        "INSERT INTO {{s}}.topics (name, partitions, retention_ms, dedup_window_ms, max_record_bytes, replication_factor)
         VALUES ('t', 1, NULL, {}, {}, {});
         INSERT INTO {{s}}.partitions (topic_id, partition, next_offset) SELECT id, 0, 3 FROM {{s}}.topics;",
        spec.dedup_window_ms, spec.max_record_bytes, spec.replication_factor
    ));
    let auth = RecordAuth::new(&KEY);
    for (offset, uid) in [(0, None), (1, Some("old")), (2, None)] {
        let value = format!("{{\"old\":{offset}}}");
        let tag = auth.tag(RecordParts {
            topic: "t",
            partition: 0,
            key: "k",
            uid,
            value: value.as_bytes(),
        });
        schema.sql(&format!(
            "INSERT INTO {{s}}.records (topic_id, partition, \"offset\", key, uid, claim, value, tag, stored_at)
             SELECT id, 0, {offset}, 'k', {uid}, {uid}, convert_to('{value}', 'UTF8'), '\\x{}', 1000 FROM {{s}}.topics",
            bus_core::auth::to_hex(&tag),
            uid = uid.map_or("NULL".to_owned(), |uid| format!("'{uid}'")),
        ));
    }
    let bus = PostgresBus::connect_with(schema.options.clone()).expect("connect");
    bus.set_control_key(KEY).expect("key");
    let old = bus.fetch("t", 0, 0, 10).expect("old records");
    assert_eq!(offsets_of(&old), [0, 1, 2]);
    assert_eq!(old[1].value, json!({"old": 1}));
    let found = bus.find_event_by_uid("t", "k", "old").expect("find");
    assert_eq!(found.map(|ack| ack.offset), Some(1));
    assert_eq!(
        bus.publish_idempotent("t", "k", &json!(1), "old")
            .expect("retry")
            .offset,
        1
    );
    assert_eq!(
        bus.publish("t", "k", &json!("new"))
            .expect("publish")
            .offset,
        3
    );
    assert_eq!(
        offsets_of(&bus.fetch("t", 0, 0, 10).expect("all")),
        [0, 1, 2, 3]
    );
    bus.provision(&Manifest::new([spec]))
        .expect("provision again");
    let refused = schema.try_sql(&format!(
        "INSERT INTO {{s}}.records (topic_id, partition, \"offset\", key, value, stored_at)
         SELECT topic_id, partition, -1, key, value, stored_at FROM {ROWS} AND \"offset\" = 0"
    ));
    assert!(refused.is_err(), "a negative offset was stored");
}

/// C24: `delete_below` records where the log starts and drops the rows
/// below it; reads begin there (a row written below it by SQL is not read
/// and not damage), it never moves down or past the counter, and a row
/// deleted above it is still `Corrupt` naming it.
#[test]
fn delete_below_moves_the_log_start_and_damage_above_it_is_still_named() {
    let Some(schema) = Schema::new("delete_below") else {
        return;
    };
    let bus = schema.keyed_bus();
    for i in 0..6 {
        bus.publish_idempotent("t", "k", &json!({"i": i}), &format!("u{i}"))
            .expect("publish");
    }
    assert_eq!(bus.delete_below("t", 0, 3).expect("delete below"), 3);
    assert_eq!(bus.offsets("t", 0).expect("offsets").first, 3);
    assert_eq!(
        offsets_of(&bus.fetch("t", 0, 0, 10).expect("from 0")),
        [3, 4, 5]
    );
    assert_eq!(
        offsets_of(&bus.fetch("t", 0, 1, 2).expect("from 1")),
        [3, 4]
    );
    assert_eq!(bus.find_event_by_uid("t", "k", "u1").expect("find"), None);
    assert_eq!(bus.delete_below("t", 0, 1).expect("never down"), 0);
    assert_eq!(bus.offsets("t", 0).expect("offsets").first, 3);

    // A copy of record 3 written below the log start is neither read nor damage.
    schema.sql(&format!(
        "INSERT INTO {{s}}.records (topic_id, partition, \"offset\", key, uid, value, tag, stored_at)
         SELECT topic_id, partition, 1, key, uid, value, tag, stored_at FROM {ROWS} AND \"offset\" = 3"
    ));
    assert_eq!(
        offsets_of(&bus.fetch("t", 0, 0, 10).expect("from 0")),
        [3, 4, 5]
    );
    assert_eq!(
        bus.find_event_by_uid("t", "k", "u3")
            .expect("find")
            .map(|ack| ack.offset),
        Some(3)
    );
    // A row deleted above the log start is a gap named by fetch.
    schema.sql(&format!("DELETE FROM {ROWS} AND \"offset\" = 4"));
    assert_eq!(
        offsets_of(&bus.fetch("t", 0, 0, 10).expect("before the gap")),
        [3]
    );
    corrupt_at(bus.fetch("t", 0, 4, 10), 4);

    // Never past the counter: the log is empty at 6, and goes on there (the
    // rows dropped: 3, 5 and the copy at 1).
    assert_eq!(bus.delete_below("t", 0, 100).expect("past the head"), 3);
    let offsets = bus.offsets("t", 0).expect("offsets");
    assert_eq!((offsets.first, offsets.next), (6, 6));
    assert_eq!(bus.fetch("t", 0, 0, 10).expect("empty").len(), 0);
    assert_eq!(bus.publish("t", "k", &json!(6)).expect("publish").offset, 6);
    assert_eq!(offsets_of(&bus.fetch("t", 0, 0, 10).expect("new")), [6]);
    assert!(matches!(
        bus.delete_below("t", 1, 0),
        Err(BusError::UnknownPartition { .. })
    ));
}
