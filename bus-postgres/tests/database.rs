//! What the database decides on its own, against the shared server
//! (`BUS_POSTGRES_URL`), each test in a schema of its own: concurrent retries
//! of one UID from several buses (separate sessions, as separate processes
//! would be) store one record; a schema written by a newer bus-postgres is
//! refused with a clear error.

use bus_core::{BusError, EventBus, Manifest, TopicSpec};
use bus_postgres::{PostgresBus, PostgresOptions};
use serde_json::json;

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
            client.batch_execute(sql).await.expect("raw sql");
        });
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
