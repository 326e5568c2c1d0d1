//! What a backend provides to run the suite.

pub use bus_core::backend::RawRecord;
use bus_core::{BusError, EventBus};

/// Why a harness cannot run here (its broker is not configured or reachable).
#[derive(Debug, Clone)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

/// A fresh random id for one case's namespace (stream prefix, schema,
/// manifest topic): the first `len` hex digits of a v4 UUID.
///
/// # Panics
/// If `len` is over 32.
pub fn namespace_id(len: usize) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    id[..len].to_owned()
}

/// A current-thread tokio runtime with every driver on, for a namespace that
/// drives an async client (a raw writer, a cleanup) from the suite's
/// synchronous cases.
///
/// # Errors
/// [`Unavailable`] when the runtime cannot be built.
pub fn current_thread_runtime() -> Result<tokio::runtime::Runtime, Unavailable> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| Unavailable(format!("runtime: {error}")))
}

/// How the suite reaches a backend.
pub trait Harness {
    /// Backend name, for messages.
    fn backend(&self) -> &'static str;

    /// A fresh, empty namespace (temp directory, topic prefix) for one case,
    /// or why the backend is not available here.
    fn namespace(&self) -> Result<Box<dyn Namespace>, Unavailable>;
}

/// One case's storage: every [`Namespace::open`] reaches the same data.
pub trait Namespace {
    /// Opens a bus on this namespace's storage.
    fn open(&mut self) -> Result<Box<dyn EventBus>, BusError>;

    /// Whether a closed bus can be opened again with its data (false for a
    /// backend whose data lives and dies with one handle).
    fn can_reopen(&self) -> bool {
        true
    }

    /// Appends `raw` to `topic`/`partition` without the bus. The harness may
    /// close the bus for this (set `bus` to `None`); the suite then reopens
    /// it. [`BusError::Unsupported`] makes the calling case not applicable.
    fn inject_raw(
        &mut self,
        _bus: &mut Option<Box<dyn EventBus>>,
        _topic: &str,
        _partition: u32,
        _raw: &RawRecord,
    ) -> Result<(), BusError> {
        Err(BusError::Unsupported {
            operation: "inject_raw".to_owned(),
            backend: "harness".to_owned(),
        })
    }
}
