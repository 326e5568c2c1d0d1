//! The conformance suite on the in-memory backend, through its async
//! surface (feature `async`; see `bus_conformance::ThroughAsync`).

mod common;

bus_conformance::suite!(common::harness::Memory {
    through_async: true
});
