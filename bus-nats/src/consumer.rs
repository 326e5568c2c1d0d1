//! Durable consumers on NATS JetStream (C20–C23): the shared engine of
//! `bus_core::consumer` over a cursor store kept with JetStream's own means.
//!
//! **Where the cursor lives.** One JetStream KV bucket per bus prefix,
//! [`consumer_bucket`] (`{prefix}_consumers`, history 1, file storage),
//! one key per (topic, consumer) ([`consumer_key`]: the topic and the name
//! escaped as stream names escape them), the value the cursor as JSON
//! (per partition the first offset not acknowledged, the ranges
//! acknowledged above it, the delivery counts in flight, the owner id),
//! beside the topic and name it belongs to. The bucket is made on the first
//! `consume` with the consumed topic's replication factor, and raised when
//! a more replicated topic is consumed, so on a cluster it survives what
//! the topic survives.
//!
//! **Why a KV bucket and not a durable pull consumer per partition.** A
//! JetStream consumer keeps one ack floor per stream and its own delivery
//! counts and redelivery timer; the engine shared by every backend needs
//! out-of-order acknowledgement ranges, `ack_through`, delivery counts that
//! survive an instance change, batching of durable writes and, above all,
//! fencing (C23): JetStream lets any client ack any message of a consumer,
//! so a fenced instance could not be stopped from advancing it. A KV
//! update carries the revision the writer read
//! (`Nats-Expected-Last-Subject-Sequence`): the server refuses it when
//! anything was written since, which gives the compare-and-set the engine
//! needs. Every write names the writer as owner inside the value and is a
//! compare-and-set on the revision the writer last wrote; when it is
//! refused, the writer reads the entry again: if it still names it as
//! owner (its own earlier write whose ack was lost, say across a leader
//! change), it writes again on the new revision; otherwise it is fenced
//! (`BusError::Fenced`) and writes nothing.
//!
//! **Liveness of an owner (C23).** The owner keeps a core-NATS
//! subscription on [`owner_subject`] (`{prefix}.consumer-owner.{topic}.
//! {name}.{owner id}`) for as long as it lives, answering every request on
//! it. An acquirer that finds an owner named in the cursor sends a request
//! there: an answer means the owner lives (`Fail`: `ConsumerBusy`;
//! `Wait`: ask again every 50 ms until the deadline, then `Timeout`);
//! "no responders" means it is gone (dropped, or its process died, kill -9
//! included: the server drops a dead connection's subscriptions), and the
//! acquirer takes over by compare-and-set. Two acquirers racing are
//! settled by that compare-and-set: one update with the revision both read
//! wins, the other reads again and finds a live owner. A request that gets
//! no answer in time is taken as a live owner (a subscription exists), so
//! a slow owner is never robbed; `TakeOver` skips the question.
//!
//! **What a crash can take back (C21).** With `ack_every(1)` nothing: an
//! ack returns once the server acknowledged the KV write (stored, and
//! replicated to a quorum on a cluster; fsynced before the ack under the
//! server's `sync_interval: always`, as scripts/nats*.sh configure it).
//! With batching, the acks since the last durable write; those records are
//! delivered again.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{Config as KvConfig, Operation, Store, UpdateErrorKind};
use async_nats::jetstream::stream::StorageType;
use bus_core::consumer::{
    ConsumeOptions, Consumer, ConsumerInfo, CursorState, CursorStore, DurableConsumers,
    OwnerPolicy, OwnerToken, StoredSelector, check_owner, delete_consumer, fenced_error,
    list_consumers, open_consumer, reset_consumer,
};
use bus_core::{BusError, Selector, StartAt};
use futures::StreamExt;

use crate::NatsBus;
use crate::errors::{unavailable, unavailable_caused};
use crate::naming::{consumer_bucket, consumer_key, owner_subject};
use crate::shared::Shared;

mod owner;

use owner::{Responder, owner_alive};

/// How often a `Wait` owner policy asks the owner again (nothing here is
/// told when it goes: its subscription belongs to another connection).
const WAIT_POLL: Duration = Duration::from_millis(50);

/// A compare-and-set refused while the entry still names this instance as
/// owner is retried on the new revision at most this often (each retry
/// follows a fresh read, so only a read served by a lagging replica makes
/// more than one).
const MAX_OWN_RETRIES: usize = 20;

/// The cursor store of one consumer instance (or of one admin call).
pub(crate) struct NatsCursorStore {
    bus: NatsBus,
    /// The bucket's handle once opened: the hot path (an ack) then costs
    /// one KV update and no look-up.
    bucket: Mutex<Option<Store>>,
}

/// What an owner token holds: its responder, and the revision it last
/// wrote (the expected revision of its next compare-and-set).
struct OwnerHold {
    responder: Responder,
    revision: Mutex<u64>,
}

enum Attempt {
    Got(u64, CursorState),
    Busy,
    Raced,
}

fn backend(what: &str, error: impl std::fmt::Display) -> BusError {
    BusError::backend("nats", format!("{what}: {error}"))
}

fn random_id() -> Result<u64, BusError> {
    use std::io::Read as _;
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

/// The stored value: the cursor beside the topic and name it belongs to
/// (keys may hold a hash of a long name, so listing reads names from here).
fn encode(topic: &str, name: &str, state: &CursorState) -> Result<bytes::Bytes, BusError> {
    let value = serde_json::json!({"topic": topic, "name": name, "state": state});
    Ok(bytes::Bytes::from(serde_json::to_vec(&value)?))
}

fn decode(bytes: &[u8]) -> Result<(String, CursorState), BusError> {
    let unreadable =
        |error: &dyn std::fmt::Display| backend("consumer cursor is not readable", error);
    let mut value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| unreadable(&e))?;
    let name = value["name"]
        .as_str()
        .ok_or_else(|| unreadable(&"no name"))?
        .to_owned();
    let state = serde_json::from_value(value["state"].take()).map_err(|e| unreadable(&e))?;
    Ok((name, state))
}

/// The bucket, `None` when it does not exist and `replicas` is `None`;
/// made (or raised to `replicas` when it has fewer) otherwise.
async fn open_bucket(shared: &Shared, replicas: Option<usize>) -> Result<Option<Store>, BusError> {
    let name = consumer_bucket(&shared.prefix);
    let stream = format!("KV_{name}");
    let what = format!("consumer bucket {name}");
    let info = crate::topics::stream_info(&shared.js, &stream)
        .await
        .map_err(|failure| failure.into_bus(&what, shared.timeout))?;
    match (info, replicas) {
        (None, None) => return Ok(None),
        (None, Some(replicas)) => {
            let config = KvConfig {
                bucket: name.clone(),
                description: "bus durable-consumer cursors (C20)".to_owned(),
                history: 1,
                storage: StorageType::File,
                num_replicas: replicas,
                ..KvConfig::default()
            };
            // Another process may make it meanwhile: then it is opened.
            if let Err(error) = shared.js.create_key_value(config).await {
                tracing::debug!(%error, bucket = %name, "creating the consumer bucket");
            }
        }
        (Some(info), Some(replicas)) if info.config.num_replicas < replicas => {
            let mut config = info.config;
            config.num_replicas = replicas;
            shared.js.update_stream(config).await.map_err(|error| {
                backend(&format!("raising {what} to {replicas} replicas"), error)
            })?;
        }
        (Some(_), _) => {}
    }
    shared
        .js
        .get_key_value(name)
        .await
        .map(Some)
        .map_err(|error| unavailable_caused(format!("opening {what}: {error}"), error))
}

fn kv_failure(what: &str, error: impl std::error::Error + Send + Sync + 'static) -> BusError {
    unavailable_caused(format!("{what}: {error}"), error)
}

impl NatsCursorStore {
    fn new(bus: &NatsBus) -> Self {
        Self {
            bus: bus.secondary(),
            bucket: Mutex::new(None),
        }
    }

    /// The bucket: from the cache, else opened (made, with `replicas`, when
    /// that is given).
    fn bucket(&self, replicas: Option<usize>) -> Result<Option<Store>, BusError> {
        if replicas.is_none()
            && let Some(store) = self
                .bucket
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        {
            return Ok(Some(store));
        }
        let opened = self
            .bus
            .run("opening the consumer bucket", move |shared| async move {
                open_bucket(&shared, replicas).await
            })?;
        if let Some(store) = &opened {
            *self.bucket.lock().unwrap_or_else(PoisonError::into_inner) = Some(store.clone());
        }
        Ok(opened)
    }

    fn make_bucket(&self, topic: &str) -> Result<Store, BusError> {
        let replicas = usize::from(self.bus.topic(topic)?.spec.replication_factor);
        self.bucket(Some(replicas))?
            .ok_or_else(|| unavailable("the consumer bucket was not made"))
    }
}

impl CursorStore for NatsCursorStore {
    fn acquire(
        &self,
        topic: &str,
        name: &str,
        policy: OwnerPolicy,
        selector: &StoredSelector,
    ) -> Result<(OwnerToken, CursorState), BusError> {
        let kv = self.make_bucket(topic)?;
        let id = random_id()?;
        let prefix = self.bus.prefix().to_owned();
        // The owner answers before the cursor names it, so nobody ever
        // finds it named and silent.
        let subject = owner_subject(&prefix, topic, name, id);
        let responder = self.bus.run("consumer acquire", move |shared| async move {
            Responder::start(shared.js.client(), subject).await
        })?;
        let started = Instant::now();
        loop {
            let (kv, key) = (kv.clone(), consumer_key(topic, name));
            let (topic_s, name_s, fresh) = (topic.to_owned(), name.to_owned(), selector.clone());
            let prefix = prefix.clone();
            let attempt = self.bus.run("consumer acquire", move |shared| async move {
                let entry = kv
                    .entry(key.as_str())
                    .await
                    .map_err(|e| kv_failure("reading a consumer cursor", e))?;
                let (mut state, expected) = match entry {
                    Some(entry) if entry.operation == Operation::Put => {
                        (decode(&entry.value)?.1, entry.revision)
                    }
                    other => (
                        CursorState {
                            selector: fresh,
                            partitions: Default::default(),
                            owner: None,
                        },
                        other.map_or(0, |entry| entry.revision),
                    ),
                };
                if let Some(owner) = state.owner
                    && policy != OwnerPolicy::TakeOver
                {
                    let subject = owner_subject(&prefix, &topic_s, &name_s, owner);
                    if owner_alive(&shared.js.client(), subject, shared.timeout).await? {
                        return Ok(Attempt::Busy);
                    }
                }
                state.owner = Some(id);
                let value = encode(&topic_s, &name_s, &state)?;
                match kv.update(key.as_str(), value, expected).await {
                    Ok(revision) => Ok(Attempt::Got(revision, state)),
                    Err(error) if error.kind() == UpdateErrorKind::WrongLastRevision => {
                        Ok(Attempt::Raced)
                    }
                    Err(error) => Err(kv_failure("taking a consumer", error)),
                }
            })?;
            match attempt {
                Attempt::Got(revision, state) => {
                    let hold = OwnerHold {
                        responder,
                        revision: Mutex::new(revision),
                    };
                    let token = OwnerToken {
                        id,
                        hold: Some(Box::new(hold)),
                    };
                    return Ok((token, state));
                }
                // Another acquirer wrote first: read again.
                Attempt::Raced => {}
                Attempt::Busy => match policy {
                    OwnerPolicy::Wait(wait) if started.elapsed() < wait => {
                        std::thread::sleep(WAIT_POLL);
                    }
                    OwnerPolicy::Wait(wait) => {
                        return Err(BusError::timeout(
                            format!(
                                "waiting for consumer {name:?} of topic {topic:?} to be released"
                            ),
                            wait,
                        ));
                    }
                    _ => {
                        return Err(BusError::ConsumerBusy {
                            topic: topic.to_owned(),
                            consumer: name.to_owned(),
                        });
                    }
                },
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
        let hold = token
            .hold
            .as_ref()
            .and_then(|hold| hold.downcast_ref::<OwnerHold>())
            .ok_or_else(|| fenced_error(topic, name, "the owner token is not this store's"))?;
        let kv = self.make_or_cached(topic)?;
        let mut state = state.clone();
        state.owner = Some(token.id);
        let value = encode(topic, name, &state)?;
        let expected = *hold.revision.lock().unwrap_or_else(PoisonError::into_inner);
        let key = consumer_key(topic, name);
        let id = token.id;
        let outcome = self.bus.run("consumer ack", move |_| async move {
            let mut expected = expected;
            for _ in 0..MAX_OWN_RETRIES {
                match kv.update(key.as_str(), value.clone(), expected).await {
                    Ok(revision) => return Ok(Ok(revision)),
                    Err(error) if error.kind() == UpdateErrorKind::WrongLastRevision => {}
                    Err(error) => return Err(kv_failure("writing a consumer cursor", error)),
                }
                // Refused: fenced, unless the entry still names this
                // instance (its own earlier write, whose ack was lost).
                let entry = kv
                    .entry(key.as_str())
                    .await
                    .map_err(|e| kv_failure("reading a consumer cursor", e))?;
                let stored = match &entry {
                    Some(entry) if entry.operation == Operation::Put => {
                        Some(decode(&entry.value)?.1)
                    }
                    _ => None,
                };
                let probe = OwnerToken { id, hold: None };
                if let Err(reason) = check_owner(stored.as_ref(), &probe) {
                    return Ok(Err(reason));
                }
                expected = entry.map_or(0, |entry| entry.revision);
            }
            Err(unavailable(
                "writing a consumer cursor: the compare-and-set kept being refused while the \
                 cursor names this instance (a replica lagging?)",
            ))
        })?;
        match outcome {
            Ok(revision) => {
                *hold.revision.lock().unwrap_or_else(PoisonError::into_inner) = revision;
                Ok(())
            }
            Err(reason) => Err(fenced_error(topic, name, reason)),
        }
    }

    fn release(&self, _topic: &str, _name: &str, token: OwnerToken) {
        let Some(hold) = token.hold else {
            return;
        };
        let Ok(hold) = hold.downcast::<OwnerHold>() else {
            return;
        };
        // Unsubscribed and flushed before this returns, so the next
        // `consume` finds the owner gone at once ("no responders") rather
        // than a subscription nobody answers on.
        let responder = hold.responder;
        let _ = self.bus.run("consumer release", move |_| async move {
            responder.stop().await;
            Ok(())
        });
    }

    fn list(&self, topic: &str) -> Result<Vec<(String, CursorState)>, BusError> {
        let Some(kv) = self.bucket(None)? else {
            return Ok(Vec::new());
        };
        let filter = format!("{}{}.>", kv.prefix, crate::naming::topic_token(topic));
        let topic_s = topic.to_owned();
        self.bus.run("consumers", move |_| async move {
            let mut subjects = kv
                .stream
                .info_with_subjects(filter)
                .await
                .map_err(|e| kv_failure("listing consumers", e))?;
            let mut keys = Vec::new();
            while let Some(subject) = subjects.next().await {
                let (subject, _) = subject.map_err(|e| kv_failure("listing consumers", e))?;
                if let Some(key) = subject.strip_prefix(kv.prefix.as_str()) {
                    keys.push(key.to_owned());
                }
            }
            let mut out = Vec::new();
            for key in keys {
                let entry = kv
                    .entry(key)
                    .await
                    .map_err(|e| kv_failure("reading a consumer cursor", e))?;
                if let Some(entry) = entry
                    && entry.operation == Operation::Put
                {
                    let value: serde_json::Value = serde_json::from_slice(&entry.value)?;
                    // A hashed topic token could in theory be shared:
                    // only this topic's consumers are listed.
                    if value["topic"].as_str() == Some(topic_s.as_str()) {
                        out.push(decode(&entry.value)?);
                    }
                }
            }
            out.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(out)
        })
    }

    fn load(&self, topic: &str, name: &str) -> Result<Option<CursorState>, BusError> {
        let Some(kv) = self.bucket(None)? else {
            return Ok(None);
        };
        let key = consumer_key(topic, name);
        self.bus.run("consumer load", move |_| async move {
            match kv
                .entry(key)
                .await
                .map_err(|e| kv_failure("reading a consumer cursor", e))?
            {
                Some(entry) if entry.operation == Operation::Put => {
                    Ok(Some(decode(&entry.value)?.1))
                }
                _ => Ok(None),
            }
        })
    }

    fn replace(
        &self,
        topic: &str,
        name: &str,
        state: Option<&CursorState>,
    ) -> Result<bool, BusError> {
        let kv = match state {
            Some(_) => self.make_bucket(topic)?,
            None => match self.bucket(None)? {
                Some(kv) => kv,
                None => return Ok(false),
            },
        };
        let value = match state {
            Some(state) => {
                let mut state = state.clone();
                state.owner = None;
                Some(encode(topic, name, &state)?)
            }
            None => None,
        };
        let key = consumer_key(topic, name);
        self.bus.run("consumer reset", move |_| async move {
            let existed = kv
                .entry(key.as_str())
                .await
                .map_err(|e| kv_failure("reading a consumer cursor", e))?
                .is_some_and(|entry| entry.operation == Operation::Put);
            // Unconditional: any write moves the revision, so a running
            // owner's next compare-and-set is refused and it is fenced.
            match value {
                Some(value) => {
                    kv.put(key.as_str(), value)
                        .await
                        .map_err(|e| kv_failure("resetting a consumer", e))?;
                }
                None if existed => kv
                    .delete(key.as_str())
                    .await
                    .map_err(|e| kv_failure("deleting a consumer", e))?,
                None => {}
            }
            Ok(existed)
        })
    }
}

impl NatsCursorStore {
    /// The bucket for a cursor write: the cached handle (an ack costs one
    /// KV update and no look-up).
    fn make_or_cached(&self, topic: &str) -> Result<Store, BusError> {
        match self.bucket(None)? {
            Some(kv) => Ok(kv),
            None => self.make_bucket(topic),
        }
    }
}

impl NatsBus {
    /// A handle on the same connection that cleans nothing up when
    /// dropped: what a consumer keeps for its cursor writes and dead
    /// letters.
    fn secondary(&self) -> NatsBus {
        NatsBus {
            shared: Arc::clone(&self.shared),
            executor: Arc::clone(&self.executor),
            primary: false,
            on_runtime: self.on_runtime.clone(),
        }
    }
}

impl DurableConsumers for NatsBus {
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
            Arc::new(self.secondary()),
            Arc::new(NatsCursorStore::new(self)),
            topic,
            name,
            selector,
            start_if_new,
            options,
        )
    }

    fn consumers(&self, topic: &str) -> Result<Vec<ConsumerInfo>, BusError> {
        list_consumers(self, &NatsCursorStore::new(self), topic)
    }

    fn reset_consumer(&self, topic: &str, name: &str, start: StartAt) -> Result<(), BusError> {
        reset_consumer(self, &NatsCursorStore::new(self), topic, name, start)
    }

    fn delete_consumer(&self, topic: &str, name: &str) -> Result<bool, BusError> {
        delete_consumer(self, &NatsCursorStore::new(self), topic, name)
    }

    fn shared_cursor_store(&self) -> Option<Arc<dyn bus_core::consumer::CursorStore>> {
        Some(Arc::new(NatsCursorStore::new(self)))
    }
}
