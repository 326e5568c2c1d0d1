//! `bus`: one synchronous, durable, partitioned event-bus trait in front of
//! an embedded file log, NATS JetStream and Kafka.
//!
//! [`open`] picks the backend by URL and provisions the manifest:
//!
//! ```
//! use bus::{Manifest, TopicSpec};
//!
//! let manifest = Manifest::new([TopicSpec::new("audit", 4)]);
//! let bus = bus::open("memory://", &manifest).unwrap();
//! let ack = bus.publish("audit", "agent-1", &serde_json::json!({"event": "start"})).unwrap();
//! let events = bus.fetch("audit", ack.partition, 0, 10).unwrap();
//! assert_eq!(events[0].value["event"], "start");
//! ```
//!
//! | cargo feature | backend | URL |
//! |---|---|---|
//! | `embedded` (default) | segmented file log | `file://DIR` or a bare path; `file://DIR?read_only=true` follows a directory another process writes |
//! | `nats` | NATS JetStream | `nats://HOST:PORT[,HOST:PORT]` |
//! | `kafka` | Apache Kafka | `kafka://HOST:PORT[,HOST:PORT]` |
//! | `postgres` | PostgreSQL | `postgres://USER:PASSWORD@HOST:PORT/DB[?schema=NAME]` (also `postgresql://`) |
//! | (always) | in-memory | `memory://` |

pub use bus_core::*;

pub mod memory;

/// Opens the bus named by `url` and provisions `manifest` on it.
///
/// A URL whose backend was not compiled in fails with
/// [`BusError::FeatureDisabled`] naming the cargo feature to enable.
pub fn open(url: &str, manifest: &Manifest) -> Result<Box<dyn EventBus>, BusError> {
    manifest.validate()?;
    let bus = connect(url)?;
    bus.provision(manifest)?;
    Ok(bus)
}

/// Opens the bus named by `url` without provisioning anything.
pub fn connect(url: &str) -> Result<Box<dyn EventBus>, BusError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        // A bare path is taken whole: no query.
        return open_embedded(url, false);
    };
    match scheme {
        "memory" => Ok(Box::new(memory::MemoryBus::new())),
        "file" => open_file(rest),
        "nats" | "tls" => open_nats(url),
        "kafka" => open_kafka(url),
        "postgres" | "postgresql" => open_postgres(url),
        other => Err(BusError::invalid(
            "url",
            format!(
                "unknown scheme {other:?}; use file://DIR, memory://, nats://HOST:PORT, kafka://HOST:PORT or postgres://USER:PASSWORD@HOST:PORT/DB"
            ),
        )),
    }
}

/// `file://DIR[?read_only=true|false]`.
fn open_file(rest: &str) -> Result<Box<dyn EventBus>, BusError> {
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut read_only = false;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        read_only = match pair.split_once('=') {
            Some(("read_only", "true" | "1")) => true,
            Some(("read_only", "false" | "0")) => false,
            _ => {
                return Err(BusError::invalid(
                    "url",
                    format!(
                        "unknown file:// option {pair:?}; the one option is read_only=true|false"
                    ),
                ));
            }
        };
    }
    open_embedded(path, read_only)
}

#[cfg(feature = "embedded")]
fn open_embedded(path: &str, read_only: bool) -> Result<Box<dyn EventBus>, BusError> {
    if path.is_empty() {
        return Err(BusError::invalid(
            "url",
            "file:// needs a directory, e.g. file://./bus-data",
        ));
    }
    Ok(Box::new(if read_only {
        bus_embedded::EmbeddedBus::open_read_only(path)?
    } else {
        bus_embedded::EmbeddedBus::open(path)?
    }))
}

#[cfg(not(feature = "embedded"))]
fn open_embedded(_path: &str, _read_only: bool) -> Result<Box<dyn EventBus>, BusError> {
    Err(disabled("file", "embedded"))
}

#[cfg(feature = "nats")]
fn open_nats(url: &str) -> Result<Box<dyn EventBus>, BusError> {
    Ok(Box::new(bus_nats::NatsBus::connect(url)?))
}

#[cfg(not(feature = "nats"))]
fn open_nats(_url: &str) -> Result<Box<dyn EventBus>, BusError> {
    Err(disabled("nats", "nats"))
}

#[cfg(feature = "kafka")]
fn open_kafka(url: &str) -> Result<Box<dyn EventBus>, BusError> {
    Ok(Box::new(bus_kafka::KafkaBus::connect(url)?))
}

#[cfg(not(feature = "kafka"))]
fn open_kafka(_url: &str) -> Result<Box<dyn EventBus>, BusError> {
    Err(disabled("kafka", "kafka"))
}

#[cfg(feature = "postgres")]
fn open_postgres(url: &str) -> Result<Box<dyn EventBus>, BusError> {
    Ok(Box::new(bus_postgres::PostgresBus::connect(url)?))
}

#[cfg(not(feature = "postgres"))]
fn open_postgres(_url: &str) -> Result<Box<dyn EventBus>, BusError> {
    Err(disabled("postgres", "postgres"))
}

#[allow(dead_code)]
fn disabled(scheme: &str, feature: &str) -> BusError {
    BusError::FeatureDisabled {
        scheme: scheme.to_owned(),
        feature: feature.to_owned(),
    }
}

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
