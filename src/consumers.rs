//! Durable consumers (C20–C23) through the facade: [`Bus`],
//! [`open_consumers`], [`connect_consumers`], and the URL routing that
//! [`crate::open`] and [`crate::connect`] share with them.

use bus_core::consumer::DurableConsumers;
use bus_core::{BusError, EventBus, Manifest, Traced};

/// A bus that also consumes durably: [`EventBus`] and
/// [`DurableConsumers`] (named cursors, acknowledgement, redelivery, one
/// owner, dead letters: C20–C23), as [`open_consumers`] returns it.
///
/// Every type with both traits is a `Bus` (a blanket implementation).
/// `Box<dyn Bus>` is usable wherever the plain trait is wanted: `&*bus` or
/// `bus.as_ref()` coerce to `&dyn EventBus`, and `Box<dyn Bus>` to
/// `Box<dyn EventBus>`, by trait upcasting (Rust 1.86).
///
/// Why [`crate::open`] and [`crate::connect`] still return
/// `Box<dyn EventBus>` rather than `Box<dyn Bus>`: upcasting is a coercion,
/// and coercions do not reach inside a `Result` or through inference. Code
/// such as `fn connect(url: &str) -> Result<Box<dyn EventBus>, BusError> {
/// bus::connect(url) }` (the `bus` command had exactly that), a
/// `match bus::connect(url) { .. other => return other }`, or
/// `bus::connect(url).map(Arc::from)` into an `Arc<dyn EventBus>` would no
/// longer compile. So the existing functions keep their type and the
/// consuming bus has functions of its own; both route URLs the same way
/// (one routing: [`crate::connect`] is [`connect_consumers`] upcast).
///
/// # How to consume after a crash
///
/// A consumer's position is stored by the bus under (topic, consumer
/// name). Acknowledge a record once it is handled: it is never delivered
/// to that consumer again (C21). A record delivered and not acknowledged
/// when the process died is delivered again when the consumer is opened
/// next, with its `delivery_count`. So after a crash, open the same
/// consumer again and go on:
///
/// ```
/// # use std::sync::{Mutex, atomic::{AtomicBool, Ordering}};
/// # use bus::{BusError, StoredEvent};
/// # static HANDLED: Mutex<Vec<i64>> = Mutex::new(Vec::new());
/// # // Crashes the first time record 2 is handled; stops the run at `stop`.
/// # fn handle(event: &StoredEvent) -> Result<(), BusError> {
/// #     static CRASHED: AtomicBool = AtomicBool::new(false);
/// #     if event.value["n"] == 2 && !CRASHED.swap(true, Ordering::SeqCst) {
/// #         return Err(BusError::backend("demo", "crash while handling"));
/// #     }
/// #     if event.value["stop"] == true {
/// #         return Err(BusError::backend("demo", "end of the demo"));
/// #     }
/// #     HANDLED.lock().unwrap().push(event.value["n"].as_i64().unwrap());
/// #     Ok(())
/// # }
/// # let dir = tempfile::tempdir().unwrap();
/// # let url = format!("file://{}", dir.path().display());
/// use bus::consumer::ConsumeOptions;
/// use bus::{Manifest, Selector, StartAt, TopicSpec};
///
/// fn run(url: &str) -> Result<(), BusError> {
///     let bus = bus::open_consumers(url, &Manifest::new([TopicSpec::new("orders", 4)]))?;
///     let mut consumer = bus.consume("orders", "billing", Selector::Topic,
///         StartAt::Beginning, ConsumeOptions::default())?; // resumes after its last ack
///     while let Some(delivery) = consumer.recv()? {
///         handle(&delivery.event)?;  // killed here: delivered again on the next run
///         consumer.ack(&delivery)?;  // durable when it returns: never delivered again
///     }
///     Ok(())
/// }
/// # let bus = bus::open_consumers(&url, &Manifest::new([TopicSpec::new("orders", 4)])).unwrap();
/// # for n in 0..4 {
/// #     bus.publish("orders", "k", &serde_json::json!({ "n": n })).unwrap();
/// # }
/// # bus.publish("orders", "k", &serde_json::json!({ "stop": true })).unwrap();
/// # drop(bus);
/// // The first run dies while handling record 2; the second goes on there.
/// assert!(run(&url).is_err());
/// # assert_eq!(*HANDLED.lock().unwrap(), [0, 1]);
/// assert!(run(&url).is_err()); // (the demo's last record stops it)
/// # // 0 and 1 were acknowledged: not handled again; 2 was not: handled now.
/// # assert_eq!(*HANDLED.lock().unwrap(), [0, 1, 2, 3]);
/// ```
pub trait Bus: EventBus + DurableConsumers {}

impl<T: EventBus + DurableConsumers + ?Sized> Bus for T {}

/// [`crate::open`] for durable consumers: opens the bus named by `url`,
/// provisions `manifest`, and returns it as a [`Bus`] (wrapped in
/// [`Traced`]: its consumer calls run in the spans `bus.consume`,
/// `bus.consumers`, `bus.consumer.reset`, `bus.consumer.delete`).
///
/// Every backend consumes with its own cursor store (memory, files of the
/// embedded directory, a NATS KV bucket, a Kafka compacted topic, a
/// PostgreSQL table); with a cold tier the manifest declares (feature
/// `cold`), through the tier (see [`crate::open`]).
pub fn open_consumers(url: &str, manifest: &Manifest) -> Result<Box<dyn Bus>, BusError> {
    manifest.validate()?;
    let bus = connect_consumers(url)?;
    // A cold tier the manifest declares (C24; see `crate::open`).
    #[cfg(feature = "cold")]
    let bus = crate::cold_open::keep_declared(url, bus, manifest)?;
    bus.provision(manifest)?;
    Ok(bus)
}

/// [`crate::connect`] for durable consumers (see [`open_consumers`]): opens
/// the bus named by `url` without provisioning anything.
pub fn connect_consumers(url: &str) -> Result<Box<dyn Bus>, BusError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        // A bare path is taken whole: no query.
        return open_embedded(url, false);
    };
    let backend = crate::backend_of_scheme(scheme)?;
    match backend.name {
        "memory" => Ok(Box::new(Traced::new(bus_core::memory::MemoryBus::new()))),
        "embedded" => {
            let (path, read_only) = crate::file_target(rest)?;
            open_embedded(path, read_only)
        }
        "nats" => open_nats(url),
        "kafka" => open_kafka(url),
        _ => open_postgres(url),
    }
}

#[cfg(feature = "embedded")]
fn open_embedded(path: &str, read_only: bool) -> Result<Box<dyn Bus>, BusError> {
    if path.is_empty() {
        return Err(BusError::invalid(
            "url",
            "file:// needs a directory, e.g. file://./bus-data",
        ));
    }
    Ok(Box::new(Traced::new(if read_only {
        bus_embedded::EmbeddedBus::open_read_only(path)?
    } else {
        bus_embedded::EmbeddedBus::open(path)?
    })))
}

#[cfg(not(feature = "embedded"))]
fn open_embedded(_path: &str, _read_only: bool) -> Result<Box<dyn Bus>, BusError> {
    Err(crate::disabled("file", "embedded"))
}

#[cfg(feature = "nats")]
fn open_nats(url: &str) -> Result<Box<dyn Bus>, BusError> {
    Ok(Box::new(Traced::new(bus_nats::NatsBus::connect(url)?)))
}

#[cfg(not(feature = "nats"))]
fn open_nats(_url: &str) -> Result<Box<dyn Bus>, BusError> {
    Err(crate::disabled("nats", "nats"))
}

#[cfg(feature = "kafka")]
fn open_kafka(url: &str) -> Result<Box<dyn Bus>, BusError> {
    Ok(Box::new(Traced::new(bus_kafka::KafkaBus::connect(url)?)))
}

#[cfg(not(feature = "kafka"))]
fn open_kafka(_url: &str) -> Result<Box<dyn Bus>, BusError> {
    Err(crate::disabled("kafka", "kafka"))
}

#[cfg(feature = "postgres")]
fn open_postgres(url: &str) -> Result<Box<dyn Bus>, BusError> {
    Ok(Box::new(Traced::new(bus_postgres::PostgresBus::connect(
        url,
    )?)))
}

#[cfg(not(feature = "postgres"))]
fn open_postgres(_url: &str) -> Result<Box<dyn Bus>, BusError> {
    Err(crate::disabled("postgres", "postgres"))
}
