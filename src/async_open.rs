//! [`open_async`] and [`connect_async`]: the facade's URL routing for the
//! async surface (feature `async`).

use std::sync::Arc;

use bus_core::backend::on_blocking_pool;
use bus_core::{AsyncEventBus, BusError, Manifest, Traced};

use crate::Bus;

/// [`crate::open`] for async code: opens the bus named by `url` with its
/// async constructor (NATS, Kafka and PostgreSQL connect on the caller's
/// runtime and start no connector thread; the embedded log opens on its
/// blocking pool) and provisions `manifest`. Must be awaited inside a tokio
/// runtime. The bus comes wrapped in [`Traced`], so its futures run in the
/// same spans as the sync surface's calls.
pub async fn open_async(
    url: &str,
    manifest: &Manifest,
) -> Result<Box<dyn AsyncEventBus>, BusError> {
    manifest.validate()?;
    let bus = connect_async(url).await?;
    bus.provision(manifest).await?;
    Ok(bus)
}

/// [`crate::connect`] for async code (see [`open_async`]).
pub async fn connect_async(url: &str) -> Result<Box<dyn AsyncEventBus>, BusError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        // A bare path is taken whole: no query.
        return embedded(url.to_owned(), false).await;
    };
    let backend = crate::backend_of_scheme(scheme)?;
    match backend.name {
        "memory" => Ok(Box::new(Traced::new(bus_core::memory::MemoryBus::new()))),
        "embedded" => {
            let (path, read_only) = crate::file_target(rest)?;
            embedded(path.to_owned(), read_only).await
        }
        "nats" => nats(url).await,
        "kafka" => kafka(url).await,
        "postgres" => postgres(url).await,
        _ => Err(BusError::Unsupported {
            operation: "the async surface".to_owned(),
            backend: backend.name.to_owned(),
        }),
    }
}

#[cfg(feature = "embedded")]
async fn embedded(path: String, read_only: bool) -> Result<Box<dyn AsyncEventBus>, BusError> {
    if path.is_empty() {
        return Err(BusError::invalid(
            "url",
            "file:// needs a directory, e.g. file://./bus-data",
        ));
    }
    let bus = tokio::task::spawn_blocking(move || {
        if read_only {
            bus_embedded::EmbeddedBus::open_read_only(&path)
        } else {
            bus_embedded::EmbeddedBus::open(&path)
        }
    })
    .await
    .map_err(|error| BusError::backend("embedded", format!("open did not finish: {error}")))??;
    Ok(Box::new(Traced::new(bus)))
}

#[cfg(not(feature = "embedded"))]
async fn embedded(_path: String, _read_only: bool) -> Result<Box<dyn AsyncEventBus>, BusError> {
    Err(crate::disabled("file", "embedded"))
}

#[cfg(feature = "nats")]
async fn nats(url: &str) -> Result<Box<dyn AsyncEventBus>, BusError> {
    Ok(Box::new(Traced::new(
        bus_nats::NatsBus::connect_async(url).await?,
    )))
}

#[cfg(not(feature = "nats"))]
async fn nats(_url: &str) -> Result<Box<dyn AsyncEventBus>, BusError> {
    Err(crate::disabled("nats", "nats"))
}

#[cfg(feature = "kafka")]
async fn kafka(url: &str) -> Result<Box<dyn AsyncEventBus>, BusError> {
    Ok(Box::new(Traced::new(
        bus_kafka::KafkaBus::connect_async(url).await?,
    )))
}

#[cfg(not(feature = "kafka"))]
async fn kafka(_url: &str) -> Result<Box<dyn AsyncEventBus>, BusError> {
    Err(crate::disabled("kafka", "kafka"))
}

#[cfg(feature = "postgres")]
async fn postgres(url: &str) -> Result<Box<dyn AsyncEventBus>, BusError> {
    Ok(Box::new(Traced::new(
        bus_postgres::PostgresBus::connect_async(url).await?,
    )))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_url: &str) -> Result<Box<dyn AsyncEventBus>, BusError> {
    Err(crate::disabled("postgres", "postgres"))
}

/// [`crate::open_consumers`] for async code: opens the bus named by `url`
/// on the caller's runtime's blocking pool (never a worker thread),
/// provisions `manifest`, and returns it as an `Arc<dyn Bus>`, the form
/// [`bus_core::consumer::consume_async`] and its siblings take.
///
/// Why not the bus of [`open_async`]: an `AsyncEventBus` has no consumer
/// calls, and that trait cannot gain them without breaking code written
/// against the reference trait (see `bus_core::consumer::consume_async`).
/// The bus returned here is the sync one ([`crate::Bus`]); its consumers
/// run on their own threads ([`crate::consumer::ConsumerStream`]) and its
/// calls through the `*_async` functions run on the blocking pool. Open
/// both when a task also publishes: `open_async` for the publishes, this
/// for the consumers (on the embedded log, open one of them read-only or
/// in another process: a directory has one writer).
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use futures::StreamExt as _;
/// use bus::consumer::{ConsumeOptions, consume_async};
/// use bus::{Manifest, Selector, StartAt, TopicSpec};
///
/// let manifest = Manifest::new([TopicSpec::new("orders", 2)]);
/// let bus = bus::open_consumers_async("memory://", &manifest).await?;
/// bus.publish("orders", "k", &serde_json::json!({"n": 1}))?;
/// let mut deliveries = consume_async(bus.clone(), "orders", "billing",
///     Selector::Topic, StartAt::Beginning, ConsumeOptions::default()).await?;
/// let delivery = deliveries.next().await.expect("a delivery")?;
/// deliveries.ack(&delivery).await?; // never delivered to "billing" again (C21)
/// # Ok::<(), bus::BusError>(())
/// # }).unwrap();
/// ```
pub async fn open_consumers_async(
    url: &str,
    manifest: &Manifest,
) -> Result<Arc<dyn Bus>, BusError> {
    manifest.validate()?;
    let bus = connect_consumers_async(url).await?;
    let shared = Arc::clone(&bus);
    let manifest = manifest.clone();
    on_blocking_pool("bus", "provision", move || shared.provision(&manifest)).await?;
    Ok(bus)
}

/// [`crate::connect_consumers`] for async code (see
/// [`open_consumers_async`]).
pub async fn connect_consumers_async(url: &str) -> Result<Arc<dyn Bus>, BusError> {
    let url = url.to_owned();
    let bus = on_blocking_pool("bus", "connect", move || crate::connect_consumers(&url)).await?;
    Ok(Arc::from(bus))
}
