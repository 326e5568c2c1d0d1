#![doc = include_str!("../README.md")]

use std::io::Write as _;

pub use bus_core;
use bus_core::{BusError, Capabilities, EventBus, Manifest, TopicSpec};

#[macro_use]
pub mod cases;
pub mod brokers;
#[cfg(feature = "cold")]
pub mod cold;
#[cfg(feature = "cold")]
pub mod cold_consumers;
pub mod consumers;
pub mod faults;
mod harness;
pub mod outage;
#[cfg(feature = "async")]
mod through_async;
pub mod tls;
pub mod util;

pub use harness::{
    Harness, Namespace, RawRecord, Unavailable, current_thread_runtime, namespace_id,
};
#[cfg(feature = "async")]
pub use through_async::ThroughAsync;

/// Why a case does not apply to a backend (a capability it lacks).
#[derive(Debug)]
pub struct NotApplicable(pub String);

/// What a case returns: `Ok` when it ran (failures panic), or why it did not apply.
pub type CaseResult = Result<(), NotApplicable>;

/// A case of the suite.
pub type Case = fn(&mut Ctx) -> CaseResult;

/// Whether `BUS_REQUIRE_BROKERS=1` is set (CI and the README's test command).
pub fn brokers_required() -> bool {
    std::env::var("BUS_REQUIRE_BROKERS").is_ok_and(|value| value == "1")
}

/// Writes a line to the real stderr, past libtest's capture, so skips are seen.
pub fn loud(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// What one case sees: its own bus, namespace and topic prefix.
pub struct Ctx {
    backend: &'static str,
    namespace: Box<dyn Namespace>,
    bus: Option<Box<dyn EventBus>>,
    prefix: String,
    control_key: Option<[u8; 32]>,
}

/// The replication factor the suite provisions topics at:
/// `BUS_REPLICATION_FACTOR` (e.g. 3 on a three-node cluster), default 1.
///
/// # Panics
/// If the variable is set but not a number from 1 to 255.
pub fn replication_factor() -> u16 {
    match std::env::var("BUS_REPLICATION_FACTOR") {
        Ok(text) if !text.trim().is_empty() => match text.trim().parse::<u16>() {
            Ok(factor @ 1..=255) => factor,
            _ => panic!("BUS_REPLICATION_FACTOR={text:?} is not a number from 1 to 255"),
        },
        _ => 1,
    }
}

impl Ctx {
    /// Opens the namespace's first bus.
    pub fn new(backend: &'static str, mut namespace: Box<dyn Namespace>) -> Result<Self, BusError> {
        let bus = namespace.open()?;
        Ok(Self {
            backend,
            namespace,
            bus: Some(bus),
            prefix: format!("c{}", namespace_id(12)),
            control_key: None,
        })
    }

    /// The backend's name.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// The case's bus.
    ///
    /// # Panics
    /// If a failed reopen left no bus.
    pub fn bus(&self) -> &dyn EventBus {
        match &self.bus {
            Some(bus) => bus.as_ref(),
            None => panic!("the bus was closed by a failed reopen"),
        }
    }

    /// A topic name private to this case.
    pub fn topic(&self, base: &str) -> String {
        format!("{}-{base}", self.prefix)
    }

    /// The bus's capabilities report.
    pub fn caps(&self) -> Capabilities {
        self.bus().capabilities()
    }

    /// `Ok` when `yes`, else not applicable because of `why`.
    pub fn require(&self, yes: bool, why: &str) -> CaseResult {
        if yes {
            Ok(())
        } else {
            Err(NotApplicable(why.to_owned()))
        }
    }

    /// A manifest of `specs`, those at the default replication factor (1)
    /// raised to [`replication_factor`] so the suite can run on a cluster.
    pub fn manifest(&self, specs: impl IntoIterator<Item = TopicSpec>) -> Manifest {
        let factor = replication_factor();
        Manifest::new(specs.into_iter().map(|mut spec| {
            if spec.replication_factor == 1 {
                spec.replication_factor = factor;
            }
            spec
        }))
    }

    /// Provisions `specs` (see [`Ctx::manifest`]).
    ///
    /// # Panics
    /// If provisioning fails.
    pub fn provision(&self, specs: impl IntoIterator<Item = TopicSpec>) {
        let manifest = self.manifest(specs);
        if let Err(error) = self.bus().provision(&manifest) {
            panic!("provision {manifest:?} failed: {error}");
        }
    }

    /// Provisions one topic `base` with `partitions` and returns its name.
    pub fn simple_topic(&self, base: &str, partitions: u32) -> String {
        let name = self.topic(base);
        self.provision([TopicSpec::new(name.clone(), partitions)]);
        name
    }

    /// Sets the control key on the bus, and on every bus reopened later.
    ///
    /// # Panics
    /// If the backend refuses the key.
    pub fn set_control_key(&mut self, key: [u8; 32]) {
        self.control_key = Some(key);
        if let Err(error) = self.bus().set_control_key(key) {
            panic!("set_control_key failed: {error}");
        }
    }

    /// Forgets the remembered control key (the current bus keeps its own).
    pub fn forget_control_key(&mut self) {
        self.control_key = None;
    }

    /// Closes the bus and opens it again on the same storage, as a new
    /// process would.
    ///
    /// # Panics
    /// If the reopen fails.
    pub fn reopen(&mut self) -> CaseResult {
        self.require(
            self.namespace.can_reopen(),
            "the backend cannot be reopened",
        )?;
        self.bus = None;
        let bus = match self.namespace.open() {
            Ok(bus) => bus,
            Err(error) => panic!("reopen failed: {error}"),
        };
        if let Some(key) = self.control_key
            && let Err(error) = bus.set_control_key(key)
        {
            panic!("set_control_key after reopen failed: {error}");
        }
        self.bus = Some(bus);
        Ok(())
    }

    /// Opens a second bus on the same storage while the first is alive.
    pub fn open_second(&mut self) -> Result<Box<dyn EventBus>, BusError> {
        self.namespace.open()
    }

    /// Writes `raw` into a partition around the bus, as a foreign client would.
    pub fn inject_raw(&mut self, topic: &str, partition: u32, raw: &RawRecord) -> CaseResult {
        match self
            .namespace
            .inject_raw(&mut self.bus, topic, partition, raw)
        {
            Ok(()) => {}
            Err(BusError::Unsupported { .. }) => {
                return Err(NotApplicable(
                    "the harness cannot write raw records".to_owned(),
                ));
            }
            Err(error) => panic!("inject_raw failed: {error}"),
        }
        if self.bus.is_none() {
            self.reopen()?;
        }
        Ok(())
    }
}

/// Runs `case` against a fresh namespace of `harness`; called by [`suite!`].
///
/// # Panics
/// When the case fails, or its broker is missing while [`brokers_required`].
pub fn run<H: Harness>(harness: &H, name: &str, case: Case) {
    let backend = harness.backend();
    let namespace = match harness.namespace() {
        Ok(namespace) => namespace,
        Err(Unavailable(why)) => {
            if brokers_required() {
                panic!("{backend}::{name}: BUS_REQUIRE_BROKERS=1 but {why}");
            }
            loud(&format!("SKIPPED {backend}::{name}: {why}"));
            return;
        }
    };
    let mut ctx = match Ctx::new(backend, namespace) {
        Ok(ctx) => ctx,
        Err(error) => panic!("{backend}::{name}: opening the bus failed: {error}"),
    };
    if let Err(NotApplicable(why)) = case(&mut ctx) {
        loud(&format!("N/A {backend}::{name}: {why}"));
    }
}

/// Expands to one `#[test]` per case of the suite, run against `$harness`
/// (an expression evaluated afresh for each test).
#[macro_export]
macro_rules! suite {
    ($harness:expr) => {
        $crate::__for_each_case!([$crate::__case_test], $harness);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __case_test {
    ($harness:expr, $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                $crate::run(&$harness, stringify!($name), $crate::cases::$name);
            }
        )*
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __case_name_list {
    ($($name:ident),*) => {
        [$(stringify!($name)),*]
    };
}
