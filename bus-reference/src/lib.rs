//! The raw-client references the bus benchmarks measure each network backend
//! against: plain async-nats, rdkafka and tokio-postgres doing the same work
//! as the bus (same broker, same records, same layout), so `bus bench` and
//! the `bench_*` examples can print what the bus costs on top of its client.
//!
//! A benchmark tool of this workspace, not a library (`publish = false`): it
//! reaches the backends only through their public API. One module per
//! backend, each behind the cargo feature of that name.
//!
//! | feature | module | raw client |
//! |---|---|---|
//! | `nats` | [`nats`] | async-nats (JetStream) |
//! | `kafka` | [`kafka`] | rdkafka |
//! | `postgres` | [`postgres`] | tokio-postgres, running the bus's own SQL |

#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "postgres")]
pub mod postgres;
