//! The conformance suite against a real nats-server (`BUS_NATS_URL`).
//! Each case owns a stream prefix; its streams are deleted when it ends.

mod common;

bus_conformance::suite!(common::harness::Nats {
    through_async: false
});
