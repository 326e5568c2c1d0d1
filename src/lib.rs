#![doc = include_str!("../README.md")]

// The user API of bus-core, named one by one: what a backend author needs
// besides (`bus_core::backend`, the backend kit) is not the user's.
/// CloudEvents in binary content mode over record headers (feature
/// `cloudevents`).
#[cfg(feature = "cloudevents")]
pub use bus_core::cloudevents;
/// W3C trace context and OpenTelemetry messaging spans (feature `otel`).
#[cfg(feature = "otel")]
pub use bus_core::otel;
pub use bus_core::{
    AckDurability, BatchRecord, BatchRecordWithHeaders, BusError, Capabilities, ColdSpec,
    Compression, DEFAULT_DEDUP_WINDOW_MS, DEFAULT_MAX_RECORD_BYTES, DedupHorizon, EventBus,
    EventBusExt, Headers, InvalidName, MAX_HEADER_NAME_BYTES, MAX_HEADER_VALUE_BYTES, MAX_HEADERS,
    MAX_HEADERS_BYTES, MAX_JSON_DEPTH, MAX_KEY_BYTES, MAX_PARTITIONS, MAX_RECORD_BYTES_LIMIT,
    MAX_UID_BYTES, Manifest, PartitionOffsets, PublishAck, Selector, StartAt, StoredEvent,
    StoredRecord, SubscribeOptions, Subscription, SubscriptionItem, SubscriptionStream, TopicSpec,
    Traced, auth, consumer, embedded_uid, memory, now_ms, partition_for, resolve_uid,
    validate_topic_name,
};
#[cfg(feature = "async")]
pub use bus_core::{AsyncEventBus, BoxFuture};

#[cfg(feature = "async")]
mod async_open;
#[cfg(feature = "async")]
pub use async_open::{connect_async, connect_consumers_async, open_async, open_consumers_async};

#[cfg(feature = "cold")]
mod cold_open;
mod consumers;
pub use consumers::{Bus, connect_consumers, open_consumers};

// Each backend crate, and its bus and options types, under the facade: a
// user who builds a backend by hand (`bus::NatsOptions::new(..)`) needs no
// second dependency.
#[cfg(feature = "embedded")]
pub use bus_embedded::{self as embedded, Durability, EmbeddedBus, Options as EmbeddedOptions};
#[cfg(feature = "kafka")]
pub use bus_kafka::{self as kafka, KafkaBus, KafkaOptions, SaslMechanism};
#[cfg(feature = "nats")]
pub use bus_nats::{self as nats, NatsBus, NatsOptions};
#[cfg(feature = "postgres")]
pub use bus_postgres::{self as postgres, PostgresBus, PostgresOptions};
// The cold tier (C24): `ColdBus` over any bus, the tier and its locations.
#[cfg(feature = "cold")]
pub use bus_cold::{self as cold, ColdBus, ColdBusOptions, ColdLocation, ColdTier};

/// Opens the bus named by `url` and provisions `manifest` on it.
///
/// The bus comes wrapped in [`Traced`]: each operation runs in a span of
/// the bus span schema (`bus.publish{backend topic}`, ...). A backend built
/// by hand (`EmbeddedBus::open(dir)`) opens no spans until wrapped with
/// `Traced::new`.
///
/// A URL whose backend was not compiled in fails with
/// [`BusError::FeatureDisabled`] naming the cargo feature to enable.
///
/// A manifest that declares cold tiers (`[topics.cold]`, C24) on a broker
/// backend, with feature `cold`: the bus comes wrapped in a
/// `ColdBus` (`bus::cold::ColdBus`) on the declared location (one location
/// per bus; it must answer), whose durable consumers are served from the
/// tier too. Without the feature such a manifest is refused, never ignored.
///
/// To consume durably (C20–C23) from a bus opened by URL, use
/// [`open_consumers`]: the same bus as a [`Bus`] (see there why this
/// function still returns `Box<dyn EventBus>`).
pub fn open(url: &str, manifest: &Manifest) -> Result<Box<dyn EventBus>, BusError> {
    // One routing for both (see `connect`).
    let bus: Box<dyn EventBus> = open_consumers(url, manifest)?;
    Ok(bus)
}

/// Opens the bus named by `url` without provisioning anything (wrapped in
/// [`Traced`], as [`open`]'s). [`connect_consumers`] opens the same bus as
/// a [`Bus`].
pub fn connect(url: &str) -> Result<Box<dyn EventBus>, BusError> {
    // One routing for both: the `Bus` upcast to the plain trait (trait
    // upcasting, Rust 1.86; the workspace needs 1.89).
    let bus: Box<dyn EventBus> = connect_consumers(url)?;
    Ok(bus)
}

/// A backend the facade routes to, with the URL schemes it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    /// `memory`, `embedded`, `nats`, `kafka` or `postgres`.
    pub name: &'static str,
    /// The cargo feature of `bus` that compiles it in.
    pub feature: &'static str,
    /// The URL schemes it accepts, as the backend crate itself lists them.
    pub schemes: &'static [&'static str],
    /// Whether it is compiled in.
    pub enabled: bool,
}

/// Every backend the facade knows, compiled in or not.
///
/// Each compiled-in backend's schemes come from its own crate's `SCHEMES`,
/// the list its URL parser checks, so routing cannot drift from parsing.
pub fn backends() -> [Backend; 5] {
    [
        Backend {
            name: "memory",
            feature: "(always)",
            schemes: &["memory"],
            enabled: true,
        },
        Backend {
            name: "embedded",
            feature: "embedded",
            schemes: schemes::EMBEDDED,
            enabled: cfg!(feature = "embedded"),
        },
        Backend {
            name: "nats",
            feature: "nats",
            schemes: schemes::NATS,
            enabled: cfg!(feature = "nats"),
        },
        Backend {
            name: "kafka",
            feature: "kafka",
            schemes: schemes::KAFKA,
            enabled: cfg!(feature = "kafka"),
        },
        Backend {
            name: "postgres",
            feature: "postgres",
            schemes: schemes::POSTGRES,
            enabled: cfg!(feature = "postgres"),
        },
    ]
}

/// The backend `url` routes to (a bare path is the embedded log).
pub fn backend_of(url: &str) -> Result<Backend, BusError> {
    match url.split_once("://") {
        Some((scheme, _)) => backend_of_scheme(scheme),
        None => backend_of_scheme("file"),
    }
}

fn backend_of_scheme(scheme: &str) -> Result<Backend, BusError> {
    let all = backends();
    let Some(backend) = all.iter().find(|b| b.schemes.contains(&scheme)) else {
        let known: Vec<String> = all
            .iter()
            .flat_map(|b| b.schemes.iter().map(|s| format!("{s}://")))
            .collect();
        return Err(BusError::invalid(
            "url",
            format!(
                "unknown scheme {scheme:?}; use one of {} (or a bare directory path)",
                known.join(", ")
            ),
        ));
    };
    if !backend.enabled {
        return Err(disabled(scheme, backend.feature));
    }
    Ok(*backend)
}

/// The schemes of each backend: its crate's own list when compiled in, else
/// the list that crate had when this one was built (a test compares them).
mod schemes {
    #[cfg(feature = "embedded")]
    pub const EMBEDDED: &[&str] = bus_embedded::SCHEMES;
    #[cfg(not(feature = "embedded"))]
    pub const EMBEDDED: &[&str] = EMBEDDED_WHEN_DISABLED;
    #[cfg(feature = "nats")]
    pub const NATS: &[&str] = bus_nats::SCHEMES;
    #[cfg(not(feature = "nats"))]
    pub const NATS: &[&str] = NATS_WHEN_DISABLED;
    #[cfg(feature = "kafka")]
    pub const KAFKA: &[&str] = bus_kafka::SCHEMES;
    #[cfg(not(feature = "kafka"))]
    pub const KAFKA: &[&str] = KAFKA_WHEN_DISABLED;
    #[cfg(feature = "postgres")]
    pub const POSTGRES: &[&str] = bus_postgres::SCHEMES;
    #[cfg(not(feature = "postgres"))]
    pub const POSTGRES: &[&str] = POSTGRES_WHEN_DISABLED;

    #[allow(dead_code)]
    pub const EMBEDDED_WHEN_DISABLED: &[&str] = &["file"];
    #[allow(dead_code)]
    pub const NATS_WHEN_DISABLED: &[&str] = &["nats", "tls"];
    #[allow(dead_code)]
    pub const KAFKA_WHEN_DISABLED: &[&str] = &["kafka", "kafkas", "kafka+tls", "kafka+ssl"];
    #[allow(dead_code)]
    pub const POSTGRES_WHEN_DISABLED: &[&str] = &["postgres", "postgresql"];

    #[cfg(test)]
    mod tests {
        #[cfg(feature = "embedded")]
        #[test]
        fn embedded_fallback_matches_the_crate() {
            assert_eq!(super::EMBEDDED_WHEN_DISABLED, bus_embedded::SCHEMES);
        }
        #[cfg(feature = "nats")]
        #[test]
        fn nats_fallback_matches_the_crate() {
            assert_eq!(super::NATS_WHEN_DISABLED, bus_nats::SCHEMES);
        }
        #[cfg(feature = "kafka")]
        #[test]
        fn kafka_fallback_matches_the_crate() {
            assert_eq!(super::KAFKA_WHEN_DISABLED, bus_kafka::SCHEMES);
        }
        #[cfg(feature = "postgres")]
        #[test]
        fn postgres_fallback_matches_the_crate() {
            assert_eq!(super::POSTGRES_WHEN_DISABLED, bus_postgres::SCHEMES);
        }
    }
}

/// The directory and `read_only` of `file://DIR[?read_only=true|false]`.
fn file_target(rest: &str) -> Result<(&str, bool), BusError> {
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
    Ok((path, read_only))
}

fn disabled(scheme: &str, feature: &str) -> BusError {
    BusError::FeatureDisabled {
        scheme: scheme.to_owned(),
        feature: feature.to_owned(),
    }
}

// The examples of the docs pages, compiled and run as doctests like the
// README's (which is the crate documentation above), so a page cannot show
// code that no longer builds.
/// docs/subscriptions.md
#[doc = include_str!("../docs/subscriptions.md")]
#[cfg(doctest)]
pub struct SubscriptionsDoctests;

/// docs/async.md
#[doc = include_str!("../docs/async.md")]
#[cfg(doctest)]
pub struct AsyncDoctests;

/// docs/security.md
#[doc = include_str!("../docs/security.md")]
#[cfg(doctest)]
pub struct SecurityDoctests;
