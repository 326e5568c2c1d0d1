//! The durable-consumer cases (C20–C23, and C25 through consumers), a suite of their own: they run
//! only on a backend that implements [`DurableConsumers`] and plugs in with
//! [`consumer_suite!`](crate::consumer_suite). A backend without durable
//! consumers does not expand the macro, so it counts none of these cases
//! as passed.

pub mod cases;
pub mod crash;

use bus_core::consumer::DurableConsumers;
use bus_core::{BusError, EventBus, Manifest, TopicSpec};

use crate::{Unavailable, brokers_required, loud, namespace_id};

/// A bus with durable consumers.
pub trait ConsumerBus: EventBus + DurableConsumers {
    /// The same bus as a plain [`EventBus`].
    fn as_bus(&self) -> &dyn EventBus;
}

impl<T: EventBus + DurableConsumers> ConsumerBus for T {
    fn as_bus(&self) -> &dyn EventBus {
        self
    }
}

/// How the consumer cases reach a backend.
pub trait ConsumerHarness {
    /// Backend name, for messages.
    fn backend(&self) -> &'static str;
    /// A fresh namespace for one case, or why the backend is unavailable.
    fn namespace(&self) -> Result<Box<dyn ConsumerNamespace>, Unavailable>;
}

/// One case's storage: every open reaches the same data.
pub trait ConsumerNamespace {
    /// Opens a bus on this namespace (the previous one is closed first
    /// when the backend needs that, as a restarted process would).
    fn open(&mut self) -> Result<Box<dyn ConsumerBus>, BusError>;
}

/// What one consumer case sees.
pub struct ConsumerCtx {
    namespace: Box<dyn ConsumerNamespace>,
    bus: Option<Box<dyn ConsumerBus>>,
    prefix: String,
}

impl ConsumerCtx {
    /// The case's bus.
    ///
    /// # Panics
    /// If a failed reopen left no bus.
    pub fn bus(&self) -> &dyn ConsumerBus {
        match &self.bus {
            Some(bus) => bus.as_ref(),
            None => panic!("the bus was closed by a failed reopen"),
        }
    }

    /// A topic name private to this case.
    pub fn topic(&self, base: &str) -> String {
        format!("{}-{base}", self.prefix)
    }

    /// Provisions `base` with `partitions` and returns its name.
    ///
    /// # Panics
    /// If provisioning fails.
    pub fn simple_topic(&self, base: &str, partitions: u32) -> String {
        let name = self.topic(base);
        let manifest = Manifest::new([TopicSpec::new(name.clone(), partitions)]);
        if let Err(error) = self.bus().provision(&manifest) {
            panic!("provision {name} failed: {error}");
        }
        name
    }

    /// Closes the bus and opens it again on the same storage, as a
    /// restarted process would (every consumer of the old bus must have
    /// been dropped or forgotten by the case).
    ///
    /// # Panics
    /// If the reopen fails.
    pub fn reopen(&mut self) {
        self.bus = None;
        match self.namespace.open() {
            Ok(bus) => self.bus = Some(bus),
            Err(error) => panic!("reopen failed: {error}"),
        }
    }
}

/// A case of the consumer suite.
pub type ConsumerCase = fn(&mut ConsumerCtx);

/// Runs `case` on a fresh namespace of `harness`; called by
/// [`consumer_suite!`](crate::consumer_suite).
///
/// # Panics
/// When the case fails, or its broker is missing while
/// [`brokers_required`].
pub fn run_consumer_case<H: ConsumerHarness>(harness: &H, name: &str, case: ConsumerCase) {
    let backend = harness.backend();
    let mut namespace = match harness.namespace() {
        Ok(namespace) => namespace,
        Err(Unavailable(why)) => {
            if brokers_required() {
                panic!("{backend}::{name}: BUS_REQUIRE_BROKERS=1 but {why}");
            }
            loud(&format!("SKIPPED {backend}::{name}: {why}"));
            return;
        }
    };
    let bus = match namespace.open() {
        Ok(bus) => bus,
        Err(error) => panic!("{backend}::{name}: opening the bus failed: {error}"),
    };
    let mut ctx = ConsumerCtx {
        namespace,
        bus: Some(bus),
        prefix: format!("c{}", namespace_id(12)),
    };
    case(&mut ctx);
}

/// One `#[test]` per durable-consumer case (C20–C23), run against
/// `$harness`, a [`ConsumerHarness`].
#[macro_export]
macro_rules! consumer_suite {
    ($harness:expr) => {
        $crate::__consumer_cases!(
            $harness,
            c20_new_consumer_starts_at_start_if_new,
            c20_restart_continues_after_the_acked_offset_per_partition,
            c20_consumers_show_lag_in_records_and_time,
            c20_reset_and_delete,
            c20_key_consumer_resumes_past_other_keys,
            c20_bad_input_is_refused_and_changes_nothing,
            c21_acked_records_are_never_delivered_again,
            c21_unacked_records_come_back_after_ack_wait_with_their_count,
            c21_a_crash_takes_back_only_acks_not_yet_durable,
            c21_ack_interval_writes_pending_acks_while_recv_waits,
            c21_refused_acks_change_nothing_stored,
            c22_nack_dead_letters_with_metadata_then_acks,
            c22_max_deliver_dead_letters,
            c22_unprovisioned_dead_letter_topic_is_refused_naming_it,
            c22_dead_letter_topic_must_be_another_valid_topic,
            c23_second_owner_fails_waits_or_takes_over,
            c23_fenced_instance_acks_nothing,
            c23_two_instances_race_with_take_over,
            c25_deliveries_and_dead_letters_carry_headers
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __consumer_cases {
    ($harness:expr, $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                $crate::consumers::run_consumer_case(
                    &$harness,
                    stringify!($name),
                    $crate::consumers::cases::$name,
                );
            }
        )*
    };
}
