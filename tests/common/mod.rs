//! Shared by the facade's integration tests (a directory, so Cargo does not
//! build it as a test of its own): the conformance suite's harness for the
//! in-memory backend (`harness`).

pub mod harness;
