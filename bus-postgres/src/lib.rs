#![doc = include_str!("../README.md")]

#[cfg(feature = "async")]
mod asynchronous;
mod bus;
mod consumer;
mod consumer_tx;
mod errors;
mod fetch;
mod inner;
mod listen;
mod listener;
mod options;
mod outbox;
mod publish;
mod queue;
mod shared;
mod sql;
mod subscribe;
mod tls;
mod topics;

pub use bus::PostgresBus;
pub use consumer_tx::{CallerTransaction, TransactionalAck};
/// The deadpool-postgres this crate is built with (its `Transaction` is a
/// [`CallerTransaction`] too).
pub use deadpool_postgres;
/// The tokio-postgres this crate is built with, for the transactions
/// [`PostgresBus::ack_in_transaction`] takes (the types must match).
pub use tokio_postgres;

/// URL schemes [`PostgresBus::connect`] accepts; the `bus` facade routes by
/// this list.
pub const SCHEMES: &[&str] = &["postgres", "postgresql"];
pub use options::{DEFAULT_POOL_SIZE, DEFAULT_SCHEMA, PostgresOptions};
pub use sql::Sql;
pub use tls::TlsFiles;
