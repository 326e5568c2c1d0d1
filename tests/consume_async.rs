//! Durable consumers from async code: a bus opened by URL on the blocking
//! pool, a consumer as a `Stream` with `ack` futures, and a restart that
//! delivers nothing acknowledged again (C20, C21).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bus::consumer::{ConsumeOptions, ConsumerStream, consume_async, consumers_async};
use bus::{Manifest, Selector, StartAt, TopicSpec};
use futures::StreamExt as _;

/// The next delivery, or a failure after 10 s (never a hang).
async fn next(stream: &mut ConsumerStream) -> bus::consumer::Delivery {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("a delivery within 10 s")
        .expect("the stream is open")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_stream_consumer_acks_and_a_restart_sees_nothing_acked_again() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let manifest = Manifest::new([TopicSpec::new("jobs", 2)]);
    let manifest = &manifest;
    let open = |url: String| async move {
        let bus = bus::open_consumers_async(&url, manifest).await.unwrap();
        let stream = consume_async(
            bus.clone(),
            "jobs",
            "worker",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default(),
        )
        .await
        .unwrap();
        (bus, stream)
    };

    let (bus, mut stream) = open(url.clone()).await;
    let mut published = Vec::new();
    for n in 0..6 {
        let key = format!("k{n}");
        let ack = bus
            .publish("jobs", &key, &serde_json::json!({ "n": n }))
            .unwrap();
        published.push((ack.partition, ack.offset));
    }
    let mut acked = Vec::new();
    for _ in 0..4 {
        let delivery = next(&mut stream).await;
        stream.ack(&delivery).await.unwrap();
        acked.push((delivery.partition, delivery.offset));
    }
    // Delivered and never acknowledged: the "crash" takes it with it.
    let unacked = next(&mut stream).await;
    drop(stream);
    drop(bus);

    // A new open of the directory: a restart of the process, as far as the
    // cursor files go.
    let (bus, mut stream) = open(url).await;
    let mut again = Vec::new();
    for _ in 0..2 {
        let delivery = next(&mut stream).await;
        stream.ack(&delivery).await.unwrap();
        again.push((delivery.partition, delivery.offset));
    }
    for record in &again {
        assert!(
            !acked.contains(record),
            "{record:?} was acked, then delivered again"
        );
    }
    assert!(
        again.contains(&(unacked.partition, unacked.offset)),
        "the unacknowledged delivery came back: {again:?}"
    );
    let mut all: Vec<_> = acked.iter().chain(&again).copied().collect();
    all.sort_unstable();
    published.sort_unstable();
    assert_eq!(all, published, "every record handled once, none lost");
    let listed = consumers_async(bus.clone(), "jobs").await.unwrap();
    let lag: u64 = listed[0].partitions.iter().map(|p| p.lag_records).sum();
    assert_eq!(lag, 0, "{listed:?}");
    drop(stream);
}
