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
