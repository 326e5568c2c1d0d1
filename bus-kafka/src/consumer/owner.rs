//! The owner's side of the cursor topic: its record, the transactional
//! producer that writes it (one `transactional.id` per consumer, so a new
//! owner fences the old one, C23), and the lease renewal thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bus_core::backend::sync::lock;
use bus_core::consumer::CursorState;
use bus_core::{BusError, now_ms};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
use serde::{Deserialize, Serialize};

use super::{KafkaCursorStore, LEASE, RENEW, TXN_TIMEOUT};
use crate::KafkaOptions;
use crate::client;
use crate::errors::map_error;

/// One consumer's record in the cursor topic.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Stored {
    pub(super) state: CursorState,
    /// Wall-clock ms until which `state.owner` counts as alive.
    pub(super) lease_until_ms: u64,
}

/// The cursor topic's key of (topic, consumer): a JSON pair, so no name
/// can run into the next.
pub(super) fn key(topic: &str, name: &str) -> Result<String, BusError> {
    Ok(serde_json::to_string(&(topic, name))?)
}

/// Why a transactional write did not happen.
pub(super) enum WriteError {
    /// The producer can write no more: fenced by a newer epoch of its
    /// `transactional.id` (`by_epoch`), or failed fatally for another
    /// reason (which a new producer may get past).
    Fenced { why: String, by_epoch: bool },
    /// Anything else (broker down, timeout): the write may be retried.
    Other(BusError),
}

/// The transactional producer of one (topic, consumer).
pub(super) struct TxnWriter {
    producer: BaseProducer,
    cursor_topic: String,
    key: String,
    options: KafkaOptions,
}

impl TxnWriter {
    /// A producer of the consumer's `transactional.id`, initialised: every
    /// earlier producer of that id is fenced from here on.
    pub(super) fn open(
        store: &KafkaCursorStore,
        topic: &str,
        name: &str,
    ) -> Result<Self, BusError> {
        let options = store.bus.core.options.clone();
        let mut config = client::producer_config(&options, client::Delivery::Plain);
        config
            .set(
                "transactional.id",
                format!("bus-consumer {} {topic:?} {name:?}", store.topic),
            )
            .set(
                "transaction.timeout.ms",
                TXN_TIMEOUT.as_millis().to_string(),
            )
            // One record per transaction, waited for before the commit:
            // nothing can join a batch, so lingering only delays the ack.
            .set("linger.ms", "0");
        let producer: BaseProducer = config
            .create()
            .map_err(|error| map_error(&options, "creating the cursor producer", error))?;
        init_transactions(&producer, &options)?;
        Ok(Self {
            producer,
            cursor_topic: store.topic.clone(),
            key: key(topic, name)?,
            options,
        })
    }

    /// Writes `value` (`None`: a tombstone) in one committed transaction.
    pub(super) fn write(&self, value: Option<&[u8]>) -> Result<(), WriteError> {
        let timeout = self.options.timeout;
        let outcome = self.producer.begin_transaction().and_then(|()| {
            let record = BaseRecord::<str, [u8]>::to(&self.cursor_topic)
                .partition(0)
                .key(self.key.as_str());
            let record = match value {
                Some(value) => record.payload(value),
                None => record,
            };
            self.producer
                .send(record)
                .map_err(|(error, _)| error)
                .and_then(|()| {
                    self.deliver(timeout);
                    self.producer.commit_transaction(timeout)
                })
        });
        let Err(error) = outcome else {
            return Ok(());
        };
        let fatal_code = self.producer.client().fatal_error().map(|(code, _)| code);
        if fatal_code.is_some() || fatal(&error) {
            let by_epoch = [fatal_code, error.rdkafka_error_code()]
                .into_iter()
                .flatten()
                .any(|code| {
                    matches!(
                        code,
                        RDKafkaErrorCode::Fenced
                            | RDKafkaErrorCode::ProducerFenced
                            | RDKafkaErrorCode::InvalidProducerEpoch
                    )
                });
            return Err(WriteError::Fenced {
                why: error.to_string(),
                by_epoch,
            });
        }
        // An abortable or retriable failure: end the transaction so the
        // next write can begin one.
        let _ = self.producer.abort_transaction(timeout);
        Err(WriteError::Other(map_error(
            &self.options,
            "writing the consumer's cursor",
            error,
        )))
    }
}

impl TxnWriter {
    /// Waits for the record's delivery before the commit. rdkafka's
    /// `commit_transaction` flushes first, and its flush polls in steps of
    /// 100 ms when the queue is not empty at once: every cursor write took
    /// 100 ms (measured on the local broker: 102 ms per transaction,
    /// 5–20 ms with this loop). Polled in 1 ms steps here, so the commit's
    /// own flush finds nothing left.
    fn deliver(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.producer.in_flight_count() > 0 && Instant::now() < deadline {
            self.producer.poll(Duration::from_millis(1));
        }
    }
}

/// Whether a transaction error leaves the producer unusable (fenced by a
/// newer epoch of its `transactional.id`, above all).
/// `init_transactions` within the bus's timeout, asked again while the
/// broker answers with an error librdkafka marks retriable (a broker that
/// just started answers `NOT_COORDINATOR` until it has loaded its
/// transaction state, as Kafka's own clients retry it).
fn init_transactions(producer: &BaseProducer, options: &KafkaOptions) -> Result<(), BusError> {
    let deadline = Instant::now() + options.timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match producer.init_transactions(left) {
            Ok(()) => return Ok(()),
            Err(KafkaError::Transaction(ref inner))
                if inner.is_retriable() && Instant::now() + RETRY_PAUSE < deadline =>
            {
                std::thread::sleep(RETRY_PAUSE);
            }
            Err(error) => return Err(map_error(options, "taking the consumer's cursor", error)),
        }
    }
}

/// The pause before `init_transactions` is asked again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

fn fatal(error: &KafkaError) -> bool {
    matches!(error, KafkaError::Transaction(inner) if inner.is_fatal())
}

/// What an owner holds while it lives: its producer, the last state it
/// wrote (renewed by a thread) and whether it was fenced.
pub(super) struct OwnerShared {
    pub(super) writer: Mutex<Owned>,
    pub(super) fenced: AtomicBool,
    pub(super) stop: Mutex<bool>,
    pub(super) wake: Condvar,
}

pub(super) struct Owned {
    pub(super) writer: TxnWriter,
    pub(super) last: Stored,
    pub(super) written_at: Instant,
}

impl OwnerShared {
    /// Writes `state` with a fresh lease. A fenced write is not remembered
    /// here: the cursor store's `store` tells a real fencing from a
    /// producer that failed for another reason.
    pub(super) fn write(&self, state: CursorState) -> Result<(), WriteError> {
        let mut owned = lock(&self.writer);
        if self.fenced.load(Ordering::SeqCst) {
            return Err(WriteError::Fenced {
                why: "fenced earlier".to_owned(),
                by_epoch: true,
            });
        }
        let stored = Stored {
            state,
            lease_until_ms: now_ms() + millis(LEASE),
        };
        let bytes = serde_json::to_vec(&stored).map_err(|e| WriteError::Other(e.into()))?;
        match owned.writer.write(Some(&bytes)) {
            Ok(()) => {
                owned.last = stored;
                owned.written_at = Instant::now();
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// The renewal loop: rewrites the last state with a fresh lease when
    /// nothing was written for [`RENEW`], until stopped or fenced.
    pub(super) fn renew_until_stopped(&self) {
        let mut stopped = lock(&self.stop);
        loop {
            stopped = self
                .wake
                .wait_timeout(stopped, RENEW / 4)
                .map_or_else(|poisoned| poisoned.into_inner().0, |(guard, _)| guard);
            if *stopped || self.fenced.load(Ordering::SeqCst) {
                return;
            }
            let due = {
                let owned = lock(&self.writer);
                (owned.written_at.elapsed() >= RENEW).then(|| owned.last.state.clone())
            };
            // A failed renewal is tried again next round (the lease lasts
            // three); a fenced producer fails at once, until the next
            // `store` finds out whether it was fenced or can recover.
            if let Some(state) = due
                && let Err(WriteError::Other(error)) = self.write(state)
            {
                tracing::warn!(%error, "kafka: renewing a consumer's lease failed");
            }
        }
    }
}

/// The `OwnerToken::hold` of a Kafka owner: stops and joins the renewal
/// thread when dropped.
pub(super) struct Hold {
    pub(super) shared: Arc<OwnerShared>,
    pub(super) renewer: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        *lock(&self.shared.stop) = true;
        self.shared.wake.notify_all();
        if let Some(renewer) = self.renewer.take() {
            let _ = renewer.join();
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
