//! The async surface of a durable consumer: a `Stream` of deliveries with
//! `ack`/`nack` futures (C21 through it), on the memory bus.
#![allow(clippy::unwrap_used)]

use bus_core::consumer::{ConsumeOptions, DurableConsumers};
use bus_core::memory::MemoryBus;
use bus_core::{EventBus, Manifest, Selector, StartAt, TopicSpec};
use futures::StreamExt as _;
use futures::executor::block_on;

#[test]
fn a_consumer_stream_delivers_acks_and_its_acks_hold_after_a_restart() {
    let bus = MemoryBus::new();
    bus.provision(&Manifest::new([TopicSpec::new("jobs", 1)]))
        .unwrap();
    for n in 0..3 {
        bus.publish("jobs", "k", &serde_json::json!({ "n": n }))
            .unwrap();
    }
    let open = || {
        bus.consume(
            "jobs",
            "worker",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default(),
        )
        .unwrap()
    };
    let mut stream = open().into_stream().unwrap();
    block_on(async {
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(stream.next().await.unwrap().unwrap());
        }
        assert_eq!(
            got.iter().map(|d| d.offset).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        stream.ack(&got[0]).await.unwrap();
        stream.ack(&got[2]).await.unwrap();
        // Without a dead-letter topic a nack makes the record due again.
        stream.nack(&got[1], "later").await.unwrap();
        let again = stream.next().await.unwrap().unwrap();
        assert_eq!((again.offset, again.delivery_count), (1, 2));
        stream.flush().await.unwrap();
    });
    drop(stream);
    // The acks hold for the next instance; the unacked record comes back.
    let mut consumer = open();
    let back = consumer.try_recv().unwrap().unwrap();
    assert_eq!((back.offset, back.delivery_count), (1, 3));
    assert!(consumer.try_recv().unwrap().is_none());
}

#[test]
fn a_stream_whose_bus_is_dropped_ends() {
    let bus = MemoryBus::new();
    bus.provision(&Manifest::new([TopicSpec::new("jobs", 1)]))
        .unwrap();
    let consumer = bus
        .consume(
            "jobs",
            "worker",
            Selector::Topic,
            StartAt::Now,
            ConsumeOptions::default(),
        )
        .unwrap();
    let mut stream = consumer.into_stream().unwrap();
    let waiting = std::thread::spawn(move || block_on(stream.next()).is_none());
    drop(bus);
    assert!(waiting.join().unwrap(), "the stream ended");
}

/// `consume_async` opens the consumer on the blocking pool of a tokio
/// runtime; what the stream acked is not delivered to the next instance
/// (C21), what it did not ack is.
#[cfg(feature = "async")]
#[test]
fn consume_async_opens_on_the_blocking_pool_and_its_acks_hold() {
    use bus_core::consumer::{
        consume_async, consumers_async, delete_consumer_async, reset_consumer_async,
    };
    use std::sync::Arc;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    let bus = Arc::new(MemoryBus::new());
    bus.provision(&Manifest::new([TopicSpec::new("jobs", 1)]))
        .unwrap();
    for n in 0..5 {
        bus.publish("jobs", "k", &serde_json::json!({ "n": n }))
            .unwrap();
    }
    let open = |bus: &Arc<MemoryBus>| {
        consume_async(
            Arc::clone(bus),
            "jobs",
            "worker",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default(),
        )
    };
    runtime.block_on(async {
        let mut stream = open(&bus).await.unwrap();
        for expected in 0..3 {
            let delivery = stream.next().await.unwrap().unwrap();
            assert_eq!(delivery.offset, expected);
            stream.ack(&delivery).await.unwrap();
        }
        // Delivered, not acknowledged: due again after the restart.
        let unacked = stream.next().await.unwrap().unwrap();
        assert_eq!(unacked.offset, 3);
        drop(stream);

        let mut stream = open(&bus).await.unwrap();
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(first.offset, 3, "acked 0..3 came back: {first:?}");
        stream.ack(&first).await.unwrap();
        drop(stream);

        let listed = consumers_async(Arc::clone(&bus), "jobs").await.unwrap();
        assert_eq!(listed[0].partitions[0].cursor, 4);
        reset_consumer_async(Arc::clone(&bus), "jobs", "worker", StartAt::Beginning)
            .await
            .unwrap();
        let mut stream = open(&bus).await.unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap().offset, 0);
        drop(stream);
        assert!(
            delete_consumer_async(Arc::clone(&bus), "jobs", "worker")
                .await
                .unwrap()
        );
        assert!(consumers_async(Arc::clone(&bus), "jobs")
            .await
            .unwrap()
            .is_empty());
        // Refusals come back through the future, unchanged (C20).
        let bad = consume_async(
            Arc::clone(&bus),
            "jobs",
            "bad name",
            Selector::Topic,
            StartAt::Beginning,
            ConsumeOptions::default(),
        )
        .await;
        assert!(
            matches!(bad, Err(bus_core::BusError::InvalidArgument { ref field, .. }) if field == "consumer"),
            "{bad:?}"
        );
    });
}
