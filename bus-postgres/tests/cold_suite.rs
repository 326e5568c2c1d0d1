//! The conformance suite's read cases on PostgreSQL with a cold tier under
//! the bus (C24): a partition keeps 2 to 4 records hot (older ones archived,
//! then deleted by `delete_below`, which records the partition's log start),
//! so reads below that come from the tier (local files, or the S3 server
//! when `BUS_S3_ENDPOINT` is set).

mod common;

bus_conformance::cold_read_suite!(common::harness::Postgres {
    through_async: false
});
