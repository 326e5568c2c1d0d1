//! The conformance suite against a real nats-server (`BUS_NATS_URL`),
//! through the async surface of a bus made by `NatsBus::connect_async`
//! (feature `async`; see `bus_conformance::ThroughAsync`). Each case owns a
//! stream prefix; its streams are deleted when it ends.

mod common;

bus_conformance::suite!(common::harness::Nats {
    through_async: true
});
