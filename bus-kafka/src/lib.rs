#![doc = include_str!("../README.md")]

#[cfg(feature = "async")]
mod asynchronous;
mod bus;
mod client;
mod consumer;
mod dedup;
mod errors;
mod fetch;
mod flush;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod locate;
#[cfg(test)]
mod locate_check;
mod options;
mod publish;
mod reader;
mod registry;
#[cfg(test)]
mod settings_check;
mod subscribe;
mod topics;
mod waker;

pub use client::kafka_topic_name;

/// URL schemes [`KafkaBus::connect`] accepts (all but `kafka` turn TLS on);
/// the `bus` facade routes by this list.
pub const SCHEMES: &[&str] = &["kafka", "kafkas", "kafka+tls", "kafka+ssl"];
pub use bus::KafkaBus;
pub use options::{DEFAULT_MANIFEST_TOPIC, KafkaOptions, SaslMechanism};

// The bus's shared state and its cluster probe, named from the crate root
// by the modules that work on them.
use bus::Core;
#[cfg(feature = "async")]
use bus::cluster_facts;
