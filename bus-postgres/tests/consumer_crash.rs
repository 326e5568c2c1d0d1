//! C21/C22/C23 under kill -9 on PostgreSQL (`BUS_POSTGRES_URL`), on the
//! shared harness (`bus_conformance::consumers::crash`): a child process
//! (this test binary re-invoked) publishes from a producer thread while a
//! durable consumer in the same process handles each record (prints `H`),
//! then acknowledges it (prints `A` once the ack is durable) or, for the
//! records poisoned on purpose, dead-letters it (prints `D`). Every other
//! record is acknowledged inside the handler's own transaction
//! (`ack_in_transaction`), which also inserts a row naming the record: those
//! rows show exactly-once processing (one row per record, whatever was
//! killed when). The parent kills the child at random moments over many
//! rounds, lets a last child drain the topic, and checks: every record
//! handled at least once; none handled again after its durable ack; the
//! dead-letter topic holds exactly the poisoned records, once each; one row
//! per record acked in a transaction; no lag left.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use bus_conformance::brokers_required;
use bus_conformance::consumers::crash::{self, ChildStderr, Plan, Run};
use bus_core::EventBus;
use bus_core::consumer::{ConsumeOptions, OwnerPolicy};
use bus_postgres::{PostgresBus, PostgresOptions, TransactionalAck, tokio_postgres};

/// A round waits longer than on the embedded log (a child connects twice:
/// the bus and the handler's client), and every child's stderr reaches the
/// test output.
const PLAN: Plan = Plan {
    round_deadline: Duration::from_secs(60),
    first_line: Duration::from_secs(3),
    next_line: Duration::from_secs(3),
    drain_idle: Duration::from_millis(1000),
    child_stderr: ChildStderr::All,
    ..Plan::new("postgres")
};

/// Acknowledged inside the handler's transaction (the others by a plain
/// ack).
fn in_transaction(i: u64) -> bool {
    i.is_multiple_of(2)
}

fn options(schema: &str) -> PostgresOptions {
    let url = std::env::var("BUS_POSTGRES_URL").unwrap();
    PostgresOptions::from_url(&url).unwrap().schema(schema)
}

/// The child's body; a no-op unless the parent set `BUS_CONSUMER_CHILD`.
#[test]
fn consumer_child_process() {
    let Some(role) = crash::role().unwrap() else {
        return;
    };
    let schema = crash::var("BUS_CONSUMER_SCHEMA").unwrap();
    let options = options(&schema);
    let bus = PostgresBus::connect_with(options.clone()).unwrap();
    let runtime = bus_conformance::current_thread_runtime().unwrap();
    let mut client = runtime.block_on(async {
        let (client, connection) = options.config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    });
    // The previous child was killed: its advisory lock goes when the
    // server notices its connection closed, so wait for it (C23).
    let consume = ConsumeOptions::default().owner(OwnerPolicy::Wait(Duration::from_secs(30)));
    let insert = format!("INSERT INTO \"{schema}\".handled (record) VALUES ($1)");
    crash::run_child(&bus, &PLAN, role, consume, |consumer, delivery| {
        let i = crash::index_of(&delivery.event.value).unwrap();
        if !in_transaction(i) {
            return consumer.ack(delivery);
        }
        let record = i64::try_from(i).unwrap();
        let outcome = runtime.block_on(async {
            let transaction = client.transaction().await.unwrap();
            transaction.execute(&insert, &[&record]).await.unwrap();
            bus.ack_in_transaction(consumer, transaction, delivery)
                .await
        })?;
        assert_eq!(outcome, TransactionalAck::Committed);
        Ok(())
    })
    .unwrap();
}

#[test]
fn kill_nine_mid_consume_loses_nothing_and_repeats_no_durable_ack() {
    if let Err(why) = bus_conformance::brokers::postgres_url() {
        assert!(!brokers_required(), "BUS_REQUIRE_BROKERS=1 but {}", why.0);
        eprintln!("SKIPPED kill -9 consumer test: {}", why.0);
        return;
    }
    let schema = format!("ckill_{}", bus_conformance::namespace_id(12));
    let bus = PostgresBus::connect_with(options(&schema)).unwrap();
    bus.provision(&PLAN.manifest()).unwrap();
    let runtime = bus_conformance::current_thread_runtime().unwrap();
    let config = options(&schema).config;
    let client = runtime.block_on(async {
        let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        // No unique index: a record processed twice would show as two rows.
        client
            .batch_execute(&format!(
                "CREATE TABLE \"{schema}\".handled (record bigint NOT NULL)"
            ))
            .await
            .unwrap();
        client
    });
    let mut run = Run::new(
        &PLAN,
        vec![("BUS_CONSUMER_SCHEMA".to_owned(), schema.clone())],
    );
    run.all_rounds_and_drain().unwrap();
    let outcome = run.finish(&bus).unwrap();

    let transactional: BTreeSet<u64> = outcome
        .records
        .values()
        .filter(|value| value["poison"] != true)
        .filter_map(crash::index_of)
        .filter(|i| in_transaction(*i))
        .collect();
    let rows: Vec<u64> = runtime.block_on(async {
        client
            .query(
                &format!("SELECT record FROM \"{schema}\".handled ORDER BY record"),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| u64::try_from(row.get::<_, i64>(0)).unwrap())
            .collect()
    });
    let row_set: BTreeSet<u64> = rows.iter().copied().collect();
    eprintln!(
        "{}, acked in the handler's transaction {} (rows {}, records with two rows {})",
        outcome.summary(),
        transactional.len(),
        rows.len(),
        rows.len() - row_set.len(),
    );
    let _ = runtime.block_on(async {
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .await
    });
    outcome.assert_holds();
    assert_eq!(
        rows.len(),
        row_set.len(),
        "a record processed twice in a transaction"
    );
    assert_eq!(
        row_set, transactional,
        "exactly once: one row per record acked in a transaction"
    );
}
