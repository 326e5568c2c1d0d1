//! The conformance suite on the in-memory backend.

mod common;

bus_conformance::suite!(common::harness::Memory {
    through_async: false
});
