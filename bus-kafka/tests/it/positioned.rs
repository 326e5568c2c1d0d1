//! C5 through the reader pool: positioned reads from many threads at
//! random offsets of one partition each get exactly the record asked for
//! (each read takes its own consumer and seeks it), and a read at an end
//! seen before still finds the records published since.

use crate::common;

use bus_core::{BatchRecord, EventBus, Manifest, TopicSpec};
use bus_kafka::{KafkaBus, KafkaOptions};
use serde_json::json;

#[test]
fn concurrent_positioned_reads_get_their_own_records() {
    let brokers = match common::brokers() {
        Ok(brokers) => brokers,
        Err(why) => return common::skip("concurrent_positioned_reads_get_their_own_records", &why),
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let manifest_topic = format!("bus-test-manifest-{}", &id[..16]);
    let topic = format!("positioned-{}", &id[..16]);
    let bus = KafkaBus::connect_with(
        KafkaOptions::new([brokers.clone()]).manifest_topic(manifest_topic.clone()),
    )
    .unwrap_or_else(|e| panic!("connect: {e}"));
    bus.provision(&Manifest::new([TopicSpec::new(topic.clone(), 2)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    let records: Vec<BatchRecord> = (0..300)
        .map(|i| BatchRecord::new("k", json!({"n": i})))
        .collect();
    let partition = bus
        .publish_batch(&topic, &records)
        .unwrap_or_else(|e| panic!("publish: {e}"))[0]
        .partition;

    std::thread::scope(|scope| {
        for thread in 0..8u64 {
            let (bus, topic) = (&bus, &topic);
            scope.spawn(move || {
                let mut at = thread * 37 % 300;
                for _ in 0..25 {
                    let got = bus
                        .fetch(topic, partition, at, 1)
                        .unwrap_or_else(|e| panic!("fetch at {at}: {e}"));
                    assert_eq!(got.len(), 1, "one record at {at}");
                    assert_eq!(got[0].offset, at);
                    assert_eq!(got[0].value["n"], json!(at));
                    at = (at * 7 + 13) % 300;
                }
            });
        }
    });

    // The end seen by the reads above moved on: a read there is not empty.
    assert!(bus.fetch(&topic, partition, 300, 10).unwrap().is_empty());
    let ack = bus
        .publish(&topic, "k", &json!({"n": 300}))
        .unwrap_or_else(|e| panic!("publish: {e}"));
    assert_eq!(ack.offset, 300);
    let got = bus.fetch(&topic, partition, 300, 10).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].value["n"], json!(300));
    // Sequential pages after random reads: gap-free, in order.
    let mut offset = 0;
    loop {
        let page = bus.fetch(&topic, partition, offset, 64).unwrap();
        let Some(last) = page.last() else { break };
        for (i, event) in page.iter().enumerate() {
            assert_eq!(event.offset, offset + i as u64, "gap-free");
            assert_eq!(event.value["n"], json!(event.offset));
        }
        offset = last.offset + 1;
    }
    assert_eq!(offset, 301);

    let _ = bus.delete_topics(&[topic]);
    common::delete_raw_topics(&brokers, &[manifest_topic]);
}
