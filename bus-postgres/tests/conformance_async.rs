//! The conformance suite against a real PostgreSQL (`BUS_POSTGRES_URL`),
//! through the async surface of a bus made by `PostgresBus::connect_async`
//! (feature `async`; see `bus_conformance::ThroughAsync`).
#![cfg(feature = "async")]

mod common;

bus_conformance::suite!(common::harness::Postgres {
    through_async: true
});
