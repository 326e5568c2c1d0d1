//! The conformance suite against a real PostgreSQL (`BUS_POSTGRES_URL`).
//! Each case owns a schema; it is dropped when the case ends.

mod common;

bus_conformance::suite!(common::harness::Postgres {
    through_async: false
});
