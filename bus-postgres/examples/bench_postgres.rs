//! bus-postgres beside a raw tokio-postgres client doing the same SQL in the
//! same run: serial and 16-thread publish, batch publish, replay, find by
//! UID and subscription delivery latency.
//!
//! ```text
//! BUS_POSTGRES_URL=postgres://bus:bus@127.0.0.1:5433/bus \
//!   cargo run --release -p bus-postgres --example bench_postgres [RECORDS]
//! ```
//!
//! Every phase writes to one-partition topics, so concurrent publishers meet
//! on one counter row: the bus shares one transaction among them (group
//! commit); the raw reference commits each record on its own.

#![allow(clippy::unwrap_used, clippy::cast_precision_loss)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bus_core::{
    BatchRecord, EventBus, EventBusExt, Manifest, Selector, StartAt, SubscribeOptions, TopicSpec,
};
use bus_postgres::{PostgresBus, PostgresOptions};
use futures::StreamExt;
use serde_json::json;
use tokio_postgres::{AsyncMessage, Client, NoTls};

const THREADS: usize = 16;
const BATCH: usize = 100;

fn value(n: usize) -> serde_json::Value {
    json!({"n": n, "agent": "agent-1", "kind": "audit", "pad": "x".repeat(100)})
}

struct Row {
    phase: &'static str,
    unit: &'static str,
    bus: f64,
    raw: f64,
}

fn per_s(count: usize, took: Duration) -> f64 {
    count as f64 / took.as_secs_f64().max(1e-9)
}

fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort_unstable();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

/// The raw reference: the bus's tables, written with the bus's own
/// statements, one transaction per call.
struct Raw {
    schema: String,
    topic_id: i32,
}

impl Raw {
    async fn connect(options: &PostgresOptions) -> Client {
        let (client, connection) = options.config.connect(NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }

    async fn topic(&self, client: &Client, name: &str) -> i32 {
        let s = &self.schema;
        client
            .query_one(
                &format!("SELECT id FROM \"{s}\".topics WHERE name = $1"),
                &[&name],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Lock the counter, insert `count` records, advance, notify, commit.
    async fn append(&self, client: &mut Client, first: usize, count: usize) -> i64 {
        let s = &self.schema;
        let tx = client.transaction().await.unwrap();
        let lock = tx
            .prepare(&format!(
                "SELECT next_offset FROM \"{s}\".partitions WHERE topic_id = $1 AND partition = 0 FOR UPDATE"
            ))
            .await
            .unwrap();
        let next: i64 = tx.query_one(&lock, &[&self.topic_id]).await.unwrap().get(0);
        let offsets: Vec<i64> = (0..count as i64).map(|i| next + i).collect();
        let keys: Vec<String> = (0..count).map(|i| format!("k{}", first + i)).collect();
        let uids: Vec<Option<String>> = (0..count)
            .map(|i| Some(format!("raw-{}", first + i)))
            .collect();
        let values: Vec<Vec<u8>> = (0..count)
            .map(|i| serde_json::to_vec(&value(first + i)).unwrap())
            .collect();
        let tags: Vec<Option<Vec<u8>>> = vec![None; count];
        // The bus's UID lookup before it assigns offsets.
        let claims = tx
            .prepare(&format!(
                "SELECT uid, \"offset\", key, value, tag, claim IS NOT NULL FROM \"{s}\".records
                 WHERE topic_id = $1 AND partition = 0 AND uid = ANY($2) ORDER BY \"offset\""
            ))
            .await
            .unwrap();
        let known = tx.query(&claims, &[&self.topic_id, &uids]).await.unwrap();
        assert!(known.is_empty());
        let stored_at = i64::try_from(bus_core::now_ms()).unwrap();
        let insert = tx
            .prepare(&format!(
                "INSERT INTO \"{s}\".records (topic_id, partition, \"offset\", key, uid, claim, value, tag, stored_at)
                 SELECT $1, 0, o, k, u, u, v, t, $7
                 FROM unnest($2::bigint[], $3::text[], $4::text[], $5::bytea[], $6::bytea[]) AS r (o, k, u, v, t)"
            ))
            .await
            .unwrap();
        tx.execute(
            &insert,
            &[
                &self.topic_id,
                &offsets,
                &keys,
                &uids,
                &values,
                &tags,
                &stored_at,
            ],
        )
        .await
        .unwrap();
        let advance = tx
            .prepare(&format!(
                "UPDATE \"{s}\".partitions SET next_offset = $2 WHERE topic_id = $1 AND partition = 0"
            ))
            .await
            .unwrap();
        tx.execute(&advance, &[&self.topic_id, &(next + count as i64)])
            .await
            .unwrap();
        tx.execute("SELECT pg_notify('bench_raw', $1)", &[&next.to_string()])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        next
    }
}

fn main() {
    let url = std::env::var("BUS_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://bus:bus@127.0.0.1:5433/bus".to_owned());
    let records: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    let schema = format!("bench_{}", std::process::id());
    let options = PostgresOptions::from_url(&url).unwrap().schema(&schema);
    let bus = PostgresBus::connect_with(options.clone()).unwrap();
    let names = [
        "serial",
        "concurrent",
        "batch",
        "raw-serial",
        "raw-concurrent",
        "raw-batch",
    ];
    bus.provision(&Manifest::new(names.map(|n| TopicSpec::new(n, 1))))
        .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let raw_for = |name: &str| {
        runtime.block_on(async {
            let client = Raw::connect(&options).await;
            let probe = Raw {
                schema: schema.clone(),
                topic_id: 0,
            };
            Raw {
                schema: schema.clone(),
                topic_id: probe.topic(&client, name).await,
            }
        })
    };
    let mut rows = Vec::new();

    // Serial publish.
    let started = Instant::now();
    for n in 0..records {
        bus.publish_idempotent("serial", &format!("k{n}"), &value(n), &format!("s-{n}"))
            .unwrap();
    }
    let bus_serial = per_s(records, started.elapsed());
    let raw = raw_for("raw-serial");
    let raw_serial = runtime.block_on(async {
        let mut client = Raw::connect(&options).await;
        let started = Instant::now();
        for n in 0..records {
            raw.append(&mut client, n, 1).await;
        }
        per_s(records, started.elapsed())
    });
    rows.push(Row {
        phase: "serial publish",
        unit: "rec/s",
        bus: bus_serial,
        raw: raw_serial,
    });

    // 16 threads publishing to one partition.
    let per_thread = records / THREADS;
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let bus = &bus;
            scope.spawn(move || {
                for i in 0..per_thread {
                    let n = t * per_thread + i;
                    bus.publish_idempotent(
                        "concurrent",
                        &format!("k{n}"),
                        &value(n),
                        &format!("c-{n}"),
                    )
                    .unwrap();
                }
            });
        }
    });
    let bus_concurrent = per_s(per_thread * THREADS, started.elapsed());
    let raw = Arc::new(raw_for("raw-concurrent"));
    let raw_concurrent = runtime.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..THREADS {
            clients.push(Raw::connect(&options).await);
        }
        let started = Instant::now();
        let tasks: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(t, mut client)| {
                let raw = Arc::clone(&raw);
                tokio::spawn(async move {
                    for i in 0..per_thread {
                        raw.append(&mut client, t * per_thread + i, 1).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        per_s(per_thread * THREADS, started.elapsed())
    });
    rows.push(Row {
        phase: "16-thread publish",
        unit: "rec/s",
        bus: bus_concurrent,
        raw: raw_concurrent,
    });

    // Batches of 100.
    let started = Instant::now();
    for b in 0..records / BATCH {
        let batch: Vec<_> = (0..BATCH)
            .map(|i| {
                let n = b * BATCH + i;
                BatchRecord::new(format!("k{n}"), value(n)).with_uid(format!("b-{n}"))
            })
            .collect();
        bus.publish_batch("batch", &batch).unwrap();
    }
    let bus_batch = per_s(records / BATCH * BATCH, started.elapsed());
    let raw = raw_for("raw-batch");
    let raw_batch = runtime.block_on(async {
        let mut client = Raw::connect(&options).await;
        let started = Instant::now();
        for b in 0..records / BATCH {
            raw.append(&mut client, b * BATCH, BATCH).await;
        }
        per_s(records / BATCH * BATCH, started.elapsed())
    });
    rows.push(Row {
        phase: "batch publish (100)",
        unit: "rec/s",
        bus: bus_batch,
        raw: raw_batch,
    });

    // Replay of the serial topic, pages of 500.
    let started = Instant::now();
    let replayed = bus.fetch_all("serial", 0, 0, 500).unwrap().len();
    let bus_replay = per_s(replayed, started.elapsed());
    let raw = raw_for("serial");
    let raw_replay = runtime.block_on(async {
        let client = Raw::connect(&options).await;
        let fetch = client
            .prepare(&format!(
                "SELECT \"offset\", key, uid, value, tag, stored_at FROM \"{schema}\".records
                 WHERE topic_id = $1 AND partition = 0 AND \"offset\" >= $2 ORDER BY \"offset\" LIMIT 500"
            ))
            .await
            .unwrap();
        let started = Instant::now();
        let (mut from, mut count) = (0i64, 0usize);
        loop {
            let rows = client.query(&fetch, &[&raw.topic_id, &from]).await.unwrap();
            let Some(last) = rows.last() else { break };
            from = last.get::<_, i64>(0) + 1;
            for row in &rows {
                let value: &[u8] = row.get(3);
                let _: serde_json::Value = serde_json::from_slice(value).unwrap();
            }
            count += rows.len();
        }
        per_s(count, started.elapsed())
    });
    rows.push(Row {
        phase: "replay (pages of 500)",
        unit: "rec/s",
        bus: bus_replay,
        raw: raw_replay,
    });

    // Find by UID.
    let lookups = records.min(1_000);
    let started = Instant::now();
    for n in 0..lookups {
        let found = bus
            .find_event_by_uid("serial", &format!("k{n}"), &format!("s-{n}"))
            .unwrap();
        assert!(found.is_some());
    }
    let bus_find = per_s(lookups, started.elapsed());
    let raw_find = runtime.block_on(async {
        let client = Raw::connect(&options).await;
        let find = client
            .prepare(&format!(
                "SELECT \"offset\", key, value, tag FROM \"{schema}\".records
                 WHERE topic_id = $1 AND partition = 0 AND uid = $2 ORDER BY \"offset\" LIMIT 64"
            ))
            .await
            .unwrap();
        let started = Instant::now();
        for n in 0..lookups {
            let rows = client
                .query(&find, &[&raw.topic_id, &format!("s-{n}")])
                .await
                .unwrap();
            assert!(!rows.is_empty());
        }
        per_s(lookups, started.elapsed())
    });
    rows.push(Row {
        phase: "find by UID",
        unit: "lookups/s",
        bus: bus_find,
        raw: raw_find,
    });

    // Delivery latency: publish, then the subscriber's recv returns it.
    let samples = 200;
    let mut subscription = bus
        .subscribe(
            "batch",
            Selector::Partition(0),
            StartAt::Now,
            SubscribeOptions::default(),
        )
        .unwrap();
    let publisher = PostgresBus::connect_with(options.clone()).unwrap();
    let mut latencies = Vec::new();
    for n in 0..samples {
        let started = Instant::now();
        publisher.publish("batch", "lat", &value(n)).unwrap();
        let item = subscription.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(item.is_some());
        latencies.push(started.elapsed());
    }
    let bus_latency = median(latencies);
    let raw = raw_for("raw-batch");
    let raw_latency = runtime.block_on(async {
        let (listener, mut connection) = options.config.connect(NoTls).await.unwrap();
        let (notes, mut received) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(_) = message {
                    let _ = notes.send(());
                }
            }
        });
        listener.batch_execute("LISTEN bench_raw").await.unwrap();
        let mut client = Raw::connect(&options).await;
        let fetch = client
            .prepare(&format!(
                "SELECT \"offset\", value FROM \"{schema}\".records
                 WHERE topic_id = $1 AND partition = 0 AND \"offset\" >= $2 ORDER BY \"offset\" LIMIT 500"
            ))
            .await
            .unwrap();
        let mut latencies = Vec::new();
        for n in 0..samples {
            let started = Instant::now();
            let offset = raw.append(&mut client, 1_000_000 + n, 1).await;
            received.recv().await.unwrap();
            // Like the bus: the notification is a wake-up; read the record.
            let rows = client.query(&fetch, &[&raw.topic_id, &offset]).await.unwrap();
            assert!(!rows.is_empty());
            latencies.push(started.elapsed());
        }
        drop(listener);
        median(latencies)
    });
    rows.push(Row {
        phase: "subscription delivery p50",
        unit: "us",
        bus: bus_latency,
        raw: raw_latency,
    });

    println!(
        "bus-postgres vs raw tokio-postgres, same SQL, same run ({records} records, one partition, {THREADS} threads)"
    );
    println!("| phase | unit | bus-postgres | raw tokio-postgres | bus / raw |");
    println!("|---|---|---:|---:|---:|");
    for row in &rows {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.2} |",
            row.phase,
            row.unit,
            row.bus,
            row.raw,
            row.bus / row.raw
        );
    }
    println!(
        "16-thread / serial publish on bus-postgres: {:.1}x (raw: {:.1}x)",
        bus_concurrent / bus_serial,
        raw_concurrent / raw_serial
    );
    drop(subscription);
    drop(publisher);
    drop(bus);
    runtime.block_on(async {
        let client = Raw::connect(&options).await;
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .await
            .unwrap();
    });
}
