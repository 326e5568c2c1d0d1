//! The shared conformance suite against a real Kafka broker
//! (`BUS_KAFKA_BROKERS`). Each case gets its own manifest topic, so its
//! topics are its own; a reopen is a new `KafkaBus` on the same broker.

mod common;

bus_conformance::suite!(common::harness::Kafka {
    through_async: false
});
