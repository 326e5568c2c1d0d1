//! An acknowledgement inside the caller's own transaction
//! (`PostgresBus::ack_in_transaction`, issue #28, C21/C23), against
//! `BUS_POSTGRES_URL`: the handler's row and the cursor advance commit
//! together or not at all. Each test owns a schema, dropped at the end.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bus_conformance::brokers_required;
use bus_core::consumer::{ConsumeOptions, Consumer, Delivery, DurableConsumers, OwnerPolicy};
use bus_core::{BusError, EventBus, Manifest, Selector, StartAt, TopicSpec};
use bus_postgres::{PostgresBus, PostgresOptions, TransactionalAck, tokio_postgres};

const TOPIC: &str = "jobs";
const WAIT: Duration = Duration::from_secs(10);

struct Db {
    bus: PostgresBus,
    options: PostgresOptions,
    runtime: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl Db {
    /// A fresh schema with topic `jobs` and a `handled` table for the
    /// handler's own writes; `None` (a loud skip) without a database.
    fn new(test: &str) -> Option<Self> {
        let url = match bus_conformance::brokers::postgres_url() {
            Ok(url) => url,
            Err(why) if !brokers_required() => {
                eprintln!("SKIPPED {test}: {}", why.0);
                return None;
            }
            Err(why) => panic!("{test}: BUS_REQUIRE_BROKERS=1 but {}", why.0),
        };
        let options = PostgresOptions::from_url(&url)
            .unwrap()
            .schema(format!("ctx_{}", bus_conformance::namespace_id(12)));
        let bus = PostgresBus::connect_with(options.clone()).unwrap();
        bus.provision(&Manifest::new([TopicSpec::new(TOPIC, 1)]))
            .unwrap();
        let runtime = bus_conformance::current_thread_runtime().unwrap();
        let config = options.config.clone();
        let schema = options.schema.clone();
        let client = runtime.block_on(async move {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            client
                .batch_execute(&format!(
                    "CREATE TABLE \"{schema}\".handled (record bigint PRIMARY KEY)"
                ))
                .await
                .unwrap();
            client
        });
        Some(Self {
            bus,
            options,
            runtime,
            client,
        })
    }

    fn consume(&self, policy: OwnerPolicy) -> Consumer {
        self.bus
            .consume(
                TOPIC,
                "worker",
                Selector::Topic,
                StartAt::Beginning,
                ConsumeOptions::default().owner(policy),
            )
            .unwrap()
    }

    /// Handles `delivery` (a row in `handled`) and acknowledges it in the
    /// same transaction; `commit: false` rolls the transaction back as a
    /// failing handler would, without acknowledging (`None`).
    fn handle(
        &mut self,
        consumer: &mut Consumer,
        delivery: &Delivery,
        commit: bool,
    ) -> Result<Option<TransactionalAck>, BusError> {
        let schema = self.options.schema.clone();
        let (bus, client) = (&self.bus, &mut self.client);
        let record = i64::try_from(delivery.offset).unwrap();
        self.runtime.block_on(async move {
            let transaction = client.transaction().await.unwrap();
            transaction
                .execute(
                    &format!("INSERT INTO \"{schema}\".handled (record) VALUES ($1)"),
                    &[&record],
                )
                .await
                .unwrap();
            if !commit {
                transaction.rollback().await.unwrap();
                return Ok(None);
            }
            bus.ack_in_transaction(consumer, transaction, delivery)
                .await
                .map(Some)
        })
    }

    /// The records the handler's committed rows name.
    fn handled(&self) -> Vec<u64> {
        let sql = format!(
            "SELECT record FROM \"{}\".handled ORDER BY record",
            self.options.schema
        );
        self.runtime.block_on(async {
            self.client
                .query(&sql, &[])
                .await
                .unwrap()
                .iter()
                .map(|row| u64::try_from(row.get::<_, i64>(0)).unwrap())
                .collect()
        })
    }

    /// A restart: a new bus on the same schema.
    fn reopen(&mut self) {
        self.bus = PostgresBus::connect_with(self.options.clone()).unwrap();
    }

    fn publish(&self, n: u64) {
        for i in 0..n {
            self.bus
                .publish(TOPIC, &format!("k{i}"), &serde_json::json!({ "i": i }))
                .unwrap();
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.options.schema);
        let _ = self
            .runtime
            .block_on(async { self.client.batch_execute(&sql).await });
    }
}

fn next(consumer: &mut Consumer) -> Delivery {
    consumer.recv_timeout(WAIT).unwrap().expect("a delivery")
}

#[test]
fn commit_stores_the_row_and_the_ack_together() {
    let Some(mut db) = Db::new("commit_stores_the_row_and_the_ack_together") else {
        return;
    };
    db.publish(3);
    let mut consumer = db.consume(OwnerPolicy::Fail);
    let first = next(&mut consumer);
    assert_eq!(
        db.handle(&mut consumer, &first, true).unwrap(),
        Some(TransactionalAck::Committed)
    );
    assert_eq!(consumer.cursor(), vec![(0, 1)], "memory follows the commit");
    // A second transactional ack of the same delivery rolls its
    // transaction back: the handler's second row does not land.
    let schema = db.options.schema.clone();
    let again = {
        let (bus, client) = (&db.bus, &mut db.client);
        let consumer = &mut consumer;
        let first = &first;
        db.runtime.block_on(async move {
            let transaction = client.transaction().await.unwrap();
            transaction
                .execute(
                    &format!("INSERT INTO \"{schema}\".handled (record) VALUES (100)"),
                    &[],
                )
                .await
                .unwrap();
            bus.ack_in_transaction(consumer, transaction, first).await
        })
    };
    assert_eq!(again.unwrap(), TransactionalAck::AlreadyAcknowledged);
    assert_eq!(db.handled(), vec![0]);
    let stored = db.bus.consumers(TOPIC).unwrap();
    assert_eq!(stored[0].partitions[0].cursor, 1, "the ack is stored");
    drop(consumer);
    db.reopen();
    let mut consumer = db.consume(OwnerPolicy::Fail);
    let after = next(&mut consumer);
    assert_eq!(after.offset, 1, "record 0 is never delivered again");
    assert_eq!(after.delivery_count, 1);
}

#[test]
fn rollback_stores_nothing_and_the_record_comes_again() {
    let Some(mut db) = Db::new("rollback_stores_nothing_and_the_record_comes_again") else {
        return;
    };
    db.publish(2);
    let mut consumer = db.consume(OwnerPolicy::Fail);
    let first = next(&mut consumer);
    assert_eq!(db.handle(&mut consumer, &first, false).unwrap(), None);
    assert_eq!(consumer.cursor(), vec![(0, 0)]);
    assert!(db.handled().is_empty(), "the handler's row rolled back");
    assert_eq!(db.bus.consumers(TOPIC).unwrap()[0].partitions[0].cursor, 0);
    drop(consumer);
    db.reopen();
    let mut consumer = db.consume(OwnerPolicy::Fail);
    let back = next(&mut consumer);
    assert_eq!((back.offset, back.delivery_count), (0, 2), "redelivered");
    // Now handled for good, then the next one.
    assert_eq!(
        db.handle(&mut consumer, &back, true).unwrap(),
        Some(TransactionalAck::Committed)
    );
    let second = next(&mut consumer);
    assert_eq!(
        db.handle(&mut consumer, &second, true).unwrap(),
        Some(TransactionalAck::Committed)
    );
    assert_eq!(db.handled(), vec![0, 1]);
    assert_eq!(db.bus.consumers(TOPIC).unwrap()[0].partitions[0].cursor, 2);
}

#[test]
fn a_bad_delivery_rolls_the_transaction_back() {
    let Some(mut db) = Db::new("a_bad_delivery_rolls_the_transaction_back") else {
        return;
    };
    db.publish(2);
    let mut consumer = db.consume(OwnerPolicy::Fail);
    let first = next(&mut consumer);
    let mut other = db
        .bus
        .consume(
            TOPIC,
            "other",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default(),
        )
        .unwrap();
    let theirs = next(&mut other);
    let error = db.handle(&mut consumer, &theirs, true).unwrap_err();
    assert!(
        matches!(error, BusError::InvalidArgument { .. }),
        "{error:?}"
    );
    assert!(db.handled().is_empty(), "nothing committed");
    assert_eq!(consumer.cursor(), vec![(0, 0)]);
    assert_eq!(
        db.handle(&mut consumer, &first, true).unwrap(),
        Some(TransactionalAck::Committed)
    );
    assert_eq!(db.handled(), vec![0]);
}

#[test]
fn a_fenced_instance_commits_nothing() {
    let Some(mut db) = Db::new("a_fenced_instance_commits_nothing") else {
        return;
    };
    db.publish(2);
    let mut old = db.consume(OwnerPolicy::Fail);
    let first = next(&mut old);
    let mut new = db.consume(OwnerPolicy::TakeOver);
    let error = db.handle(&mut old, &first, true).unwrap_err();
    assert!(matches!(error, BusError::Fenced { .. }), "{error:?}");
    assert!(
        db.handled().is_empty(),
        "the fenced handler's row rolled back"
    );
    assert_eq!(db.bus.consumers(TOPIC).unwrap()[0].partitions[0].cursor, 0);
    // Fenced for good: a plain ack and a receive fail the same way.
    assert!(matches!(old.ack(&first), Err(BusError::Fenced { .. })));
    assert!(matches!(old.try_recv(), Err(BusError::Fenced { .. })));
    // The new owner gets the record and handles it once.
    let again = next(&mut new);
    assert_eq!(again.offset, 0);
    assert_eq!(
        db.handle(&mut new, &again, true).unwrap(),
        Some(TransactionalAck::Committed)
    );
    assert_eq!(db.handled(), vec![0]);
}

/// A take-over while a transactional ack is written but not committed:
/// the cursor row stays locked by the caller's transaction, the take-over
/// reads it `FOR UPDATE`, so it waits for the commit and starts after the
/// record (reading the row without waiting would start it at the record,
/// handled a second time). To hold the transaction open after the bus
/// commits, the test hands the bus a savepoint inside an outer
/// transaction: a device of this test only (a savepoint's commit is not
/// durable; the API wants a top-level transaction).
#[test]
fn a_take_over_waits_for_an_uncommitted_transactional_ack() {
    let Some(mut db) = Db::new("a_take_over_waits_for_an_uncommitted_transactional_ack") else {
        return;
    };
    db.publish(2);
    let mut old = db.consume(OwnerPolicy::Fail);
    let first = next(&mut old);
    let schema = db.options.schema.clone();
    let options = db.options.clone();
    let (bus, client) = (&db.bus, &mut db.client);
    let taker_cursor = db.runtime.block_on(async {
        let mut outer = client.transaction().await.unwrap();
        let savepoint = outer.transaction().await.unwrap();
        savepoint
            .execute(
                &format!("INSERT INTO \"{schema}\".handled (record) VALUES (0)"),
                &[],
            )
            .await
            .unwrap();
        let acked = bus.ack_in_transaction(&mut old, savepoint, &first).await;
        assert_eq!(acked.unwrap(), TransactionalAck::Committed);
        let taker = std::thread::spawn(move || {
            let bus = PostgresBus::connect_with(options).unwrap();
            let consumer = bus
                .consume(
                    TOPIC,
                    "worker",
                    Selector::Topic,
                    StartAt::Beginning,
                    ConsumeOptions::default().owner(OwnerPolicy::TakeOver),
                )
                .unwrap();
            consumer.cursor()
        });
        // Until the take-over waits on the row lock (its statement names
        // this test's schema).
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "the take-over never waited"
            );
            assert!(
                !taker.is_finished(),
                "the take-over did not wait for the commit"
            );
            // pg_stat_activity is a snapshot per transaction: a new one.
            outer
                .batch_execute("SELECT pg_stat_clear_snapshot()")
                .await
                .unwrap();
            let waiting: i64 = outer
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                     AND position($1 in query) > 0",
                    &[&format!("\"{schema}\".consumers")],
                )
                .await
                .unwrap()
                .get(0);
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        outer.commit().await.unwrap();
        taker.join().unwrap()
    });
    assert_eq!(
        taker_cursor,
        vec![(0, 1)],
        "the new owner starts after the acknowledged record"
    );
    assert_eq!(db.handled(), vec![0]);
    // The old instance is fenced now.
    let second = next(&mut old);
    let error = db.handle(&mut old, &second, true).unwrap_err();
    assert!(matches!(error, BusError::Fenced { .. }), "{error:?}");
    assert_eq!(db.handled(), vec![0]);
}

/// The commit itself fails (here a deferred foreign key checked at
/// COMMIT): the bus reads the cursor row back, finds its write did not
/// land, and returns the error; the record stays in flight, the instance
/// is not fenced, and nothing of the transaction is stored.
#[test]
fn a_failing_commit_acknowledges_nothing() {
    let Some(mut db) = Db::new("a_failing_commit_acknowledges_nothing") else {
        return;
    };
    db.publish(1);
    let mut consumer = db.consume(OwnerPolicy::Fail);
    let first = next(&mut consumer);
    let schema = db.options.schema.clone();
    let (bus, client) = (&db.bus, &mut db.client);
    let outcome = db.runtime.block_on(async {
        client
            .batch_execute(&format!(
                "CREATE TABLE \"{schema}\".parent (id bigint PRIMARY KEY);
                 CREATE TABLE \"{schema}\".child (parent bigint REFERENCES \"{schema}\".parent
                     DEFERRABLE INITIALLY DEFERRED)"
            ))
            .await
            .unwrap();
        let transaction = client.transaction().await.unwrap();
        transaction
            .batch_execute(&format!(
                "INSERT INTO \"{schema}\".handled (record) VALUES (0);
                 INSERT INTO \"{schema}\".child (parent) VALUES (999)"
            ))
            .await
            .unwrap();
        bus.ack_in_transaction(&mut consumer, transaction, &first)
            .await
    });
    let error = outcome.unwrap_err();
    assert!(
        !matches!(error, BusError::Fenced { .. }),
        "a failed commit is not fencing: {error:?}"
    );
    assert!(db.handled().is_empty(), "nothing of the transaction stored");
    assert_eq!(consumer.cursor(), vec![(0, 0)], "memory did not move");
    assert_eq!(db.bus.consumers(TOPIC).unwrap()[0].partitions[0].cursor, 0);
    // Still the owner: the record can be handled again and acknowledged.
    assert_eq!(
        db.handle(&mut consumer, &first, true).unwrap(),
        Some(TransactionalAck::Committed)
    );
    assert_eq!(db.handled(), vec![0]);
}
