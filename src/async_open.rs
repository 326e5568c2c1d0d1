//! [`open_async`] and [`connect_async`]: the facade's URL routing for the
//! async surface (feature `async`).

use bus_core::{AsyncEventBus, BusError, Manifest, Traced};

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
