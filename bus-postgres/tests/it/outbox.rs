//! The transactional outbox (issue #31): `PostgresBus::publish_in_transaction`
//! against `BUS_POSTGRES_URL`. A record published in the caller's
//! transaction is stored iff it commits, with the offsets, dedup, tag and
//! headers of any publish, and a subscription sees it only after the
//! commit. Each test owns a schema.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use bus_conformance::brokers_required;
use bus_core::{
    EventBus, Headers, Manifest, PublishAck, Selector, StartAt, SubscribeOptions, TopicSpec,
};
use bus_postgres::{PostgresBus, PostgresOptions, tokio_postgres};
use serde_json::json;

const TOPIC: &str = "orders";

struct Db {
    bus: PostgresBus,
    runtime: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl Db {
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
            .schema(format!("obx_{}", bus_conformance::namespace_id(12)));
        let bus = PostgresBus::connect_with(options.clone()).unwrap();
        bus.set_control_key([0x31; 32]).unwrap();
        bus.provision(&Manifest::new([TopicSpec::new(TOPIC, 1)]))
            .unwrap();
        let runtime = bus_conformance::current_thread_runtime().unwrap();
        let config = options.config.clone();
        let client = runtime.block_on(async move {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            client
        });
        Some(Self {
            bus,
            runtime,
            client,
        })
    }

    /// Publishes `n` in a transaction of the caller's, then commits or
    /// rolls back; the ack the publish gave.
    fn publish(
        &mut self,
        n: u64,
        uid: Option<&str>,
        headers: &Headers,
        commit: bool,
    ) -> PublishAck {
        let (bus, client) = (&self.bus, &mut self.client);
        self.runtime.block_on(async move {
            let mut tx = client.transaction().await.unwrap();
            let ack = bus
                .publish_in_transaction(&mut tx, TOPIC, "k", &json!({"n": n}), uid, headers)
                .await
                .unwrap();
            if commit {
                tx.commit().await.unwrap();
            } else {
                tx.rollback().await.unwrap();
            }
            ack
        })
    }
}

#[test]
fn a_rolled_back_publish_stores_nothing_and_leaves_no_hole() {
    let Some(mut db) = Db::new("a_rolled_back_publish_stores_nothing_and_leaves_no_hole") else {
        return;
    };
    let ack = db.publish(0, Some("u-1"), &Headers::new(), false);
    assert_eq!(ack.offset, 0);
    assert_eq!(db.bus.offsets(TOPIC, 0).unwrap().next, 0, "nothing stored");
    assert!(db.bus.fetch(TOPIC, 0, 0, 10).unwrap().is_empty());
    assert_eq!(db.bus.find_event_by_uid(TOPIC, "k", "u-1").unwrap(), None);
    // The offset and the UID are free again: a plain publish takes both.
    let again = db
        .bus
        .publish_idempotent(TOPIC, "k", &json!({"n": 1}), "u-1")
        .unwrap();
    assert_eq!(again.offset, 0);
}

#[test]
fn a_committed_publish_is_an_ordinary_record_seen_after_the_commit() {
    let Some(mut db) = Db::new("a_committed_publish_is_an_ordinary_record_seen_after_the_commit")
    else {
        return;
    };
    db.bus.publish(TOPIC, "k", &json!({"n": 0})).unwrap();
    let mut sub = db
        .bus
        .subscribe(
            TOPIC,
            Selector::Partition(0),
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .unwrap();
    let headers = Headers::try_from_pairs([("traceparent", "00-ab-cd-01")]).unwrap();
    // Published in a transaction held open: invisible until it commits.
    let (bus, client) = (&db.bus, &mut db.client);
    let ack = db.runtime.block_on(async {
        let mut tx = client.transaction().await.unwrap();
        let ack = bus
            .publish_in_transaction(&mut tx, TOPIC, "k", &json!({"n": 1}), Some("u-2"), &headers)
            .await
            .unwrap();
        assert_eq!(ack.offset, 1);
        // The subscription reads through the bus's own connector, not
        // this runtime, so waiting here blocks nothing it needs.
        assert!(
            sub.recv_timeout(Duration::from_millis(300))
                .unwrap()
                .is_none()
        );
        tx.commit().await.unwrap();
        ack
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let item = loop {
        if let Some(item) = sub.recv_timeout(Duration::from_millis(200)).unwrap() {
            break item;
        }
        assert!(Instant::now() < deadline, "no delivery after the commit");
    };
    assert_eq!(item.event().unwrap().offset, ack.offset);
    assert_eq!(item.headers(), Some(&headers));
    // Same tag as any publish (the control key verifies it on fetch), same
    // dedup: the UID answers with the committed offset, in or out of a
    // transaction.
    let records = db.bus.fetch_with_headers(TOPIC, 0, 1, 10).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].headers, headers);
    let retry = db.publish(9, Some("u-2"), &headers, true);
    assert_eq!(
        retry.offset, 1,
        "a retried UID gets the original offset (C6)"
    );
    assert_eq!(
        db.bus
            .publish_idempotent(TOPIC, "k", &json!({"n": 1}), "u-2")
            .unwrap()
            .offset,
        1
    );
    assert_eq!(db.bus.offsets(TOPIC, 0).unwrap().next, 2);
}
