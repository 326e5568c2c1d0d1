//! The shared conformance suite against a real Kafka broker
//! (`BUS_KAFKA_BROKERS`), through the async surface of a bus made by
//! `KafkaBus::connect_async` (feature `async`; see
//! `bus_conformance::ThroughAsync`). Each case gets its own manifest topic, so its
//! topics are its own; a reopen is a new `KafkaBus` on the same broker.

mod common;

bus_conformance::suite!(common::harness::Kafka {
    through_async: true
});
