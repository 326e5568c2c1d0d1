//! The shared conformance suite on the embedded backend, through its async
//! surface (feature `async`; see `bus_conformance::ThroughAsync`).

mod support;

bus_conformance::suite!(support::harness::Embedded {
    through_async: true
});
