//! Durable consumers on Kafka (C20–C23): the shared engine of
//! `bus_core::consumer` over a **compacted cursor topic** written by
//! **transactional producers**.
//!
//! Why this and not a consumer group's committed offsets: the state the
//! engine stores ([`CursorState`]: the next offset per partition, the
//! ranges acknowledged above it, the delivery counts of records in flight)
//! is more than an offset, and the only room a group commit has for the
//! rest is its metadata string, capped by the broker's
//! `offset.metadata.max.bytes` (4,096 bytes by default; so on the local
//! 4.4 broker, checked with kafka-configs), which a consumer
//! with many out-of-order acks outgrows. Fencing by the group generation
//! needs a real group membership (a rebalance protocol run by the client),
//! which the bus's positioned readers do not have. A compacted topic keeps
//! any size of state, and Kafka's transactions fence natively:
//!
//! - One cursor topic per bus namespace, `<manifest topic>-consumers`
//!   (compacted, one partition, the manifest's replication factor), one
//!   record per consumer keyed by the JSON pair `[topic, name]`, holding
//!   the state and its owner's lease; a tombstone deletes it.
//! - Every write is a transaction of a producer whose `transactional.id` is
//!   derived from (cursor topic, topic, consumer). A new owner's
//!   `init_transactions` bumps the producer epoch, so the previous
//!   instance's next commit fails (`ProducerFenced`, fatal): its ack is
//!   [`BusError::Fenced`] and writes nothing (C23). Reset and delete fence
//!   the same way (they init a producer of that id too). The new owner
//!   reads the state only after its `init_transactions`, so nothing the
//!   old owner commits can slip in between.
//! - Reads use `isolation.level=read_committed` from the start of the
//!   cursor topic to its end (partition EOF): the latest committed state
//!   per consumer; a fenced instance's aborted writes are never seen.
//! - Liveness for [`OwnerPolicy::Fail`] and [`OwnerPolicy::Wait`]: a lease
//!   in the record (`lease_until_ms`), renewed every [`RENEW`] by a thread
//!   held in the [`OwnerToken`] while the instance lives, and by every
//!   cursor write. A process that dies (kill -9) keeps the consumer for at
//!   most [`LEASE`] past its last write; then another `consume` takes it
//!   (and its `init_transactions` aborts a transaction the dead process
//!   left open). A live instance whose renewals stall past the lease can
//!   lose the consumer to a `Fail`/`Wait` opener: it is then fenced, so
//!   two instances never both advance. The lease compares wall clocks of
//!   the two hosts: clock skew lengthens or shortens the window.
//! - How long a take-over after a kill -9 may take: with
//!   [`OwnerPolicy::TakeOver`] no lease is waited for; the opener's
//!   `init_transactions` aborts what the dead process left open (bounded
//!   by the bus timeout), then its settled read ends at once unless a
//!   transaction of *another* consumer of the namespace is open (then up
//!   to the bus timeout plus [`SETTLE_WAIT`], see the known limit below).
//!   With `Fail`/`Wait`: [`LEASE`] past the dead owner's last write.
//!   Measured by `tests/consumer_faults.rs` on a fresh single broker of
//!   this 2-core machine under other builds: a new child process took
//!   over and handled its first record 2.2–4.0 s after it was spawned
//!   (process start and connect included; 250 rounds), and `Wait` got a
//!   killed owner's consumer 7.2–7.7 s after the kill.
//!
//! What a crash can take back: acknowledgements not yet written (with
//! `ack_every(n)` / `ack_interval`, those since the last durable write;
//! with the default `ack_every(1)` none: `ack` returns after the commit),
//! redelivered with their delivery counts as of the last write (C21).
//!
//! Known limit: all consumers of a namespace share the cursor topic's one
//! partition, and a read_committed read stops at the first open
//! transaction, which may be another consumer's write in flight. An owner
//! builds only on a settled read (after its `init_transactions`, read on
//! until no transaction below the high watermark is open), so it never
//! starts from a stale state. A process killed inside a cursor write leaves
//! its transaction open until its consumer is opened again or the broker
//! aborts it (`transaction.timeout.ms` = [`TXN_TIMEOUT`] plus the broker's
//! sweep, 10 s by default): meanwhile an opener of *another* consumer of
//! the namespace waits (up to the bus timeout plus 25 s), and
//! `consumers()` may show cursors as of before that transaction.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bus_core::backend::sync::lock;
use bus_core::consumer::{
    ConsumeOptions, Consumer, ConsumerInfo, CursorState, CursorStore, DurableConsumers,
    OwnerPolicy, OwnerToken, StoredSelector, check_owner, delete_consumer, fenced_error,
    list_consumers, open_consumer, reset_consumer,
};
use bus_core::{BusError, Selector, StartAt, now_ms};
use rdkafka::consumer::BaseConsumer;

use crate::KafkaBus;
use crate::client;

/// How long an owner keeps a consumer past its last cursor write when it
/// stops renewing (a dead process): the wait a `Fail`/`Wait` opener sees
/// after a kill -9 (C23).
pub const LEASE: Duration = Duration::from_secs(6);

/// How often a live owner renews its lease when it wrote nothing else.
pub const RENEW: Duration = Duration::from_secs(2);

/// How long the broker keeps a cursor transaction open before aborting it
/// itself (a process killed inside a write); `init_transactions` by the
/// next opener of the same consumer aborts it sooner.
pub const TXN_TIMEOUT: Duration = Duration::from_secs(10);

/// How much longer than the bus timeout a settled read of the cursor topic
/// may wait for an open transaction to end: [`TXN_TIMEOUT`], plus the
/// broker's sweep for timed-out transactions
/// (`transaction.abort.timed.out.transaction.cleanup.interval.ms`, 10 s by
/// default), plus slack.
const SETTLE_WAIT: Duration = Duration::from_secs(25);

/// How often a `Wait` owner policy looks again.
const WAIT_POLL: Duration = Duration::from_millis(100);

mod owner;
mod read;

use owner::{Hold, Owned, OwnerShared, Stored, TxnWriter, WriteError};

fn random_id() -> Result<u64, BusError> {
    use std::io::Read as _;
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

/// The cursor store of one bus namespace.
struct KafkaCursorStore {
    bus: KafkaBus,
    topic: String,
    /// The cursor topic is known to exist (created or seen).
    exists: AtomicBool,
    /// A read_uncommitted client for the cursor topic's high watermark.
    watermarks: OnceLock<BaseConsumer>,
}

fn busy(topic: &str, name: &str) -> BusError {
    BusError::ConsumerBusy {
        topic: topic.to_owned(),
        consumer: name.to_owned(),
    }
}

impl KafkaCursorStore {
    fn deadline(&self) -> Instant {
        self.bus.deadline()
    }

    /// Creates the cursor topic if missing (on the connector: the admin
    /// client's calls are futures).
    fn ensure_topic(&self) -> Result<(), BusError> {
        if self.exists.load(Ordering::SeqCst) {
            return Ok(());
        }
        let topic = self.topic.clone();
        self.bus
            .blocking("creating the cursor topic", move |core, deadline| {
                crate::topics::ensure_compacted_topic(&core.options, &core.admin, &topic, deadline)
            })?;
        self.exists.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Whether the cursor topic exists (without creating it).
    fn topic_exists(&self) -> Result<bool, BusError> {
        if self.exists.load(Ordering::SeqCst) {
            return Ok(true);
        }
        let core = &self.bus.core;
        let found = client::list_topics(&core.options, core.admin.inner(), self.deadline())?
            .contains_key(&self.topic);
        if found {
            self.exists.store(true, Ordering::SeqCst);
        }
        Ok(found)
    }

    /// One attempt to take the consumer; `Ok(None)` when it is busy.
    fn try_acquire(
        &self,
        topic: &str,
        name: &str,
        policy: OwnerPolicy,
        selector: &StoredSelector,
    ) -> Result<Option<(OwnerToken, CursorState)>, BusError> {
        if policy != OwnerPolicy::TakeOver
            && let Some(stored) = self.read_one(topic, name)?
            && stored.state.owner.is_some()
            && stored.lease_until_ms > now_ms()
        {
            return Ok(None);
        }
        // From here every earlier instance is fenced: the state read next
        // is the last one any of them committed.
        let writer = TxnWriter::open(self, topic, name)?;
        let mut state = match self.read_settled(topic, name)? {
            Some(stored) => stored.state,
            None => CursorState {
                selector: selector.clone(),
                partitions: BTreeMap::new(),
                owner: None,
            },
        };
        let id = random_id()?;
        state.owner = Some(id);
        let shared = Arc::new(OwnerShared {
            writer: Mutex::new(Owned {
                writer,
                last: Stored {
                    state: state.clone(),
                    lease_until_ms: 0,
                },
                written_at: Instant::now(),
            }),
            fenced: AtomicBool::new(false),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        match shared.write(state.clone()) {
            Ok(()) => {}
            // Another opener initialised the same id after us.
            Err(WriteError::Fenced { .. }) => return Ok(None),
            // Racing another opener's `init_transactions`, the commit can
            // fail as abortable (see `store`): once more, and a stale
            // epoch's refusal means that opener won.
            Err(WriteError::Other(BusError::BackendFailure { .. })) => {
                match shared.write(state.clone()) {
                    Ok(()) => {}
                    Err(WriteError::Fenced { .. }) => return Ok(None),
                    Err(WriteError::Other(error)) => return Err(error),
                }
            }
            Err(WriteError::Other(error)) => return Err(error),
        }
        let renewing = Arc::clone(&shared);
        let renewer = std::thread::Builder::new()
            .name("bus-kafka-lease".to_owned())
            .spawn(move || renewing.renew_until_stopped())?;
        let hold = Hold {
            shared,
            renewer: Some(renewer),
        };
        Ok(Some((
            OwnerToken {
                id,
                hold: Some(Box::new(hold)),
            },
            state,
        )))
    }

    /// After a write failed as fenced: when the latest committed record
    /// still names `token` as owner, the producer failed for another
    /// reason (librdkafka can declare a transactional producer fatally
    /// failed across a broker restart), so a new producer of the same id
    /// replaces it, and the record is read again after its
    /// `init_transactions` (from then on nobody else can commit): still
    /// `token`'s, the owner goes on; otherwise it is fenced for good.
    fn recover(
        &self,
        topic: &str,
        name: &str,
        token: &OwnerToken,
        shared: &OwnerShared,
        why: &str,
    ) -> Result<(), BusError> {
        let fenced = |stored: Option<Stored>| {
            check_owner(stored.as_ref().map(|s| &s.state), token).map_err(|reason| {
                shared.fenced.store(true, Ordering::SeqCst);
                fenced_error(topic, name, reason)
            })
        };
        if shared.fenced.load(Ordering::SeqCst) {
            return Err(self.fence_reason(topic, name, token, why));
        }
        fenced(self.read_one(topic, name)?)?;
        let writer = TxnWriter::open(self, topic, name)?;
        fenced(self.read_settled(topic, name)?)?;
        tracing::warn!(
            topic,
            consumer = name,
            cause = why,
            "kafka: a consumer's cursor producer failed; replaced by a new one"
        );
        lock(&shared.writer).writer = writer;
        Ok(())
    }

    /// `error` from a write that failed without fencing the producer, or
    /// [`BusError::Fenced`] when the latest committed record shows that
    /// another instance, a reset or a delete took the consumer: a commit
    /// racing a new owner's `init_transactions` can fail as abortable (the
    /// broker answers e.g. `TRANSACTION_ABORTABLE`) rather than fenced.
    fn unless_fenced(
        &self,
        topic: &str,
        name: &str,
        token: &OwnerToken,
        shared: &OwnerShared,
        error: BusError,
    ) -> BusError {
        match self.read_one(topic, name) {
            Ok(stored) => match check_owner(stored.as_ref().map(|s| &s.state), token) {
                Ok(()) => error,
                Err(reason) => {
                    shared.fenced.store(true, Ordering::SeqCst);
                    fenced_error(topic, name, reason)
                }
            },
            // The broker is out of reach: the write's own error says more.
            Err(_) => error,
        }
    }

    /// Why `token` may not write, from the latest committed record.
    fn fence_reason(&self, topic: &str, name: &str, token: &OwnerToken, why: &str) -> BusError {
        let reason = match self.read_one(topic, name) {
            Ok(stored) => match check_owner(stored.as_ref().map(|s| &s.state), token) {
                Err(reason) => reason.to_owned(),
                Ok(()) => {
                    format!("another instance is taking over, or the cursor producer failed: {why}")
                }
            },
            Err(_) => format!("the cursor producer was fenced: {why}"),
        };
        fenced_error(topic, name, &reason)
    }
}

fn shared_of(token: &OwnerToken) -> Option<&Arc<OwnerShared>> {
    token
        .hold
        .as_ref()
        .and_then(|hold| hold.downcast_ref::<Hold>())
        .map(|hold| &hold.shared)
}

impl CursorStore for KafkaCursorStore {
    fn acquire(
        &self,
        topic: &str,
        name: &str,
        policy: OwnerPolicy,
        selector: &StoredSelector,
    ) -> Result<(OwnerToken, CursorState), BusError> {
        self.ensure_topic()?;
        let started = Instant::now();
        loop {
            if let Some(acquired) = self.try_acquire(topic, name, policy, selector)? {
                return Ok(acquired);
            }
            match policy {
                OwnerPolicy::Wait(wait) if started.elapsed() < wait => {
                    std::thread::sleep(WAIT_POLL.min(wait.saturating_sub(started.elapsed())));
                }
                OwnerPolicy::Wait(wait) => {
                    return Err(BusError::timeout(
                        format!("waiting for consumer {name:?} of topic {topic:?} to be released"),
                        wait,
                    ));
                }
                // Lost a race with another opener that took it over: a
                // random pause, so two takers do not fence each other in
                // step for ever.
                OwnerPolicy::TakeOver if started.elapsed() < self.bus.core.options.timeout => {
                    std::thread::sleep(Duration::from_millis(random_id()? % 50));
                }
                _ => return Err(busy(topic, name)),
            }
        }
    }

    fn store(
        &self,
        topic: &str,
        name: &str,
        token: &OwnerToken,
        state: &CursorState,
    ) -> Result<(), BusError> {
        let Some(shared) = shared_of(token) else {
            return Err(fenced_error(topic, name, "not a Kafka owner token"));
        };
        let mut state = state.clone();
        state.owner = Some(token.id);
        let why = match shared.write(state.clone()) {
            Ok(()) => return Ok(()),
            // A newer epoch of the id: another opener, a reset or a
            // delete. Never recovered from (a new producer would fence
            // that opener in turn, and two takers could fence each other
            // for ever).
            Err(WriteError::Fenced {
                why,
                by_epoch: true,
            }) => {
                shared.fenced.store(true, Ordering::SeqCst);
                return Err(self.fence_reason(topic, name, token, &why));
            }
            Err(WriteError::Fenced { why, .. }) => why,
            // A commit racing a new owner's `init_transactions` can fail as
            // abortable before any record shows the new owner (Kafka 4
            // answers TRANSACTION_ABORTABLE, which this librdkafka reports
            // as an unknown broker error): the cursor record still names
            // this instance, yet its epoch is stale. Write once more (a
            // whole-state replace, harmless to repeat): a producer whose
            // epoch was bumped is refused, and that is `Fenced` (C23).
            Err(WriteError::Other(error @ BusError::BackendFailure { .. })) => {
                return match shared.write(state) {
                    Ok(()) => Ok(()),
                    Err(WriteError::Fenced { why, .. }) => {
                        shared.fenced.store(true, Ordering::SeqCst);
                        Err(self.fence_reason(topic, name, token, &why))
                    }
                    Err(WriteError::Other(_)) => {
                        Err(self.unless_fenced(topic, name, token, shared, error))
                    }
                };
            }
            Err(WriteError::Other(error)) => {
                return Err(self.unless_fenced(topic, name, token, shared, error));
            }
        };
        self.recover(topic, name, token, shared, &why)?;
        match shared.write(state) {
            Ok(()) => Ok(()),
            Err(WriteError::Fenced { why, .. }) => {
                shared.fenced.store(true, Ordering::SeqCst);
                Err(self.fence_reason(topic, name, token, &why))
            }
            Err(WriteError::Other(error)) => {
                Err(self.unless_fenced(topic, name, token, shared, error))
            }
        }
    }

    fn release(&self, _topic: &str, _name: &str, token: OwnerToken) {
        let Some(hold) = token.hold else {
            return;
        };
        let Ok(hold) = hold.downcast::<Hold>() else {
            return;
        };
        let shared = Arc::clone(&hold.shared);
        drop(hold); // stops the renewals first
        // Written with no owner so the next `consume` finds it free at
        // once; a fenced instance writes nothing (its producer refuses).
        let last = lock(&shared.writer).last.state.clone();
        let mut state = last;
        state.owner = None;
        let mut owned = lock(&shared.writer);
        if shared.fenced.load(Ordering::SeqCst) {
            return;
        }
        let stored = Stored {
            state,
            lease_until_ms: 0,
        };
        if let Ok(bytes) = serde_json::to_vec(&stored)
            && owned.writer.write(Some(&bytes)).is_ok()
        {
            owned.last = stored;
        }
    }

    fn list(&self, topic: &str) -> Result<Vec<(String, CursorState)>, BusError> {
        Ok(self
            .read_all(false)?
            .into_iter()
            .filter(|((t, _), _)| t == topic)
            .map(|((_, name), stored)| (name, stored.state))
            .collect())
    }

    fn load(&self, topic: &str, name: &str) -> Result<Option<CursorState>, BusError> {
        Ok(self.read_one(topic, name)?.map(|stored| stored.state))
    }

    fn replace(
        &self,
        topic: &str,
        name: &str,
        state: Option<&CursorState>,
    ) -> Result<bool, BusError> {
        self.ensure_topic()?;
        // Fences a running instance (and aborts what it left open) first.
        let writer = TxnWriter::open(self, topic, name)?;
        let existed = self.read_settled(topic, name)?.is_some();
        let bytes = match state {
            Some(state) => {
                let mut state = state.clone();
                state.owner = None;
                Some(serde_json::to_vec(&Stored {
                    state,
                    lease_until_ms: 0,
                })?)
            }
            None => None,
        };
        match writer.write(bytes.as_deref()) {
            Ok(()) => Ok(existed),
            Err(WriteError::Fenced { why, .. }) => Err(BusError::unavailable(
                "kafka",
                format!(
                    "consumer {name:?} of topic {topic:?} was taken by another opener during the reset: {why}"
                ),
            )),
            Err(WriteError::Other(error)) => Err(error),
        }
    }
}

impl KafkaBus {
    /// The compacted topic holding this bus's durable-consumer cursors:
    /// `<manifest topic>-consumers` (created on the first `consume`).
    pub fn cursor_topic(&self) -> String {
        format!("{}-consumers", self.core.options.manifest_topic)
    }

    /// Another handle on the same clients (dead-letter writes, the cursor
    /// store's admin work); it owns no subscriptions.
    fn consumer_handle(&self) -> Self {
        Self {
            executor: Arc::clone(&self.executor),
            core: Arc::clone(&self.core),
            subscriptions: Arc::default(),
            waker: Arc::clone(&self.waker),
        }
    }

    fn cursor_store(&self) -> KafkaCursorStore {
        KafkaCursorStore {
            bus: self.consumer_handle(),
            topic: self.cursor_topic(),
            exists: AtomicBool::new(false),
            watermarks: OnceLock::new(),
        }
    }
}

impl DurableConsumers for KafkaBus {
    fn consume(
        &self,
        topic: &str,
        name: &str,
        selector: Selector,
        start_if_new: StartAt,
        options: ConsumeOptions,
    ) -> Result<Consumer, BusError> {
        open_consumer(
            self,
            Arc::new(self.consumer_handle()),
            Arc::new(self.cursor_store()),
            topic,
            name,
            selector,
            start_if_new,
            options,
        )
    }

    fn consumers(&self, topic: &str) -> Result<Vec<ConsumerInfo>, BusError> {
        list_consumers(self, &self.cursor_store(), topic)
    }

    fn reset_consumer(&self, topic: &str, name: &str, start: StartAt) -> Result<(), BusError> {
        reset_consumer(self, &self.cursor_store(), topic, name, start)
    }

    fn delete_consumer(&self, topic: &str, name: &str) -> Result<bool, BusError> {
        delete_consumer(self, &self.cursor_store(), topic, name)
    }

    fn shared_cursor_store(&self) -> Option<Arc<dyn bus_core::consumer::CursorStore>> {
        Some(Arc::new(self.cursor_store()))
    }
}
