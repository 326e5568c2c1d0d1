//! The shared conformance suite on the embedded backend.

mod support;

bus_conformance::suite!(support::harness::Embedded {
    through_async: false
});
