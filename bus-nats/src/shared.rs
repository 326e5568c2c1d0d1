//! State shared between the caller-facing [`crate::NatsBus`] and the tasks
//! it runs on the connector: the client, the topic cache and the key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_nats::jetstream::Context;
use bus_core::auth::RecordAuth;
use bus_core::{BusError, TopicSpec};

use crate::cursor::Cursor;
use crate::naming::{UidSubjects, stream_name};

/// A topic as its partition-0 stream records it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Recorded {
    pub(crate) spec: TopicSpec,
    /// How its streams spell UID subjects.
    pub(crate) uid_subjects: UidSubjects,
}

/// One connection and what it has learnt about the server's topics.
pub(crate) struct Shared {
    pub(crate) js: Context,
    /// `js` with the ack wait of one attempt of a UID publish
    /// ([`RESEND_INTERVAL`]): such a publish is sent again, same message id,
    /// until the operation timeout, so a stream leader elected meanwhile
    /// (4 to 9 s after a leader dies) stores it without the caller retrying.
    pub(crate) resend_js: Context,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    /// The server's `max_payload`, learnt at connect.
    pub(crate) max_payload: usize,
    /// Whether the server is part of a cluster (learnt at connect): point
    /// reads then go through each stream's leader (see `get.rs`).
    pub(crate) clustered: bool,
    topics: RwLock<HashMap<String, Arc<TopicState>>>,
    auth: RwLock<Option<RecordAuth>>,
    /// The doorbells of the live subscriptions, closed when the bus drops
    /// so they end (C17).
    pub(crate) bells: bus_core::backend::DoorbellRegistry,
}

/// A provisioned topic as the server recorded it.
pub(crate) struct TopicState {
    pub(crate) spec: TopicSpec,
    /// How its streams spell UID subjects (recorded when they were created).
    pub(crate) uid_subjects: UidSubjects,
    pub(crate) partitions: Vec<PartitionState>,
}

/// One partition: its stream and the reader kept for sequential replay.
pub(crate) struct PartitionState {
    pub(crate) stream: String,
    pub(crate) cursor: tokio::sync::Mutex<Option<Cursor>>,
    /// The highest stream sequence known to be stored (0: none known).
    /// Sequences only grow, so reads below it need not ask the server
    /// where the stream ends.
    known_end: AtomicU64,
}

impl TopicState {
    /// The state of `partition` (which the caller checked against the spec).
    pub(crate) fn partition(&self, partition: u32) -> Result<&PartitionState, BusError> {
        self.partitions.get(partition as usize).ok_or_else(|| {
            BusError::backend(
                "nats",
                format!("topic {:?} lost partition {partition}", self.spec.name),
            )
        })
    }
}

impl PartitionState {
    pub(crate) fn known_end(&self) -> u64 {
        self.known_end.load(Ordering::Acquire)
    }

    /// Records that `sequence` is stored.
    pub(crate) fn saw(&self, sequence: u64) {
        self.known_end.fetch_max(sequence, Ordering::AcqRel);
    }

    /// Forgets what was known (the stream may have been replaced).
    pub(crate) fn reset_end(&self) {
        self.known_end.store(0, Ordering::Release);
    }
}

/// How long one attempt of a UID publish waits for its ack.
pub(crate) const RESEND_INTERVAL: Duration = Duration::from_secs(1);

impl Shared {
    pub(crate) fn new(js: Context, prefix: String, timeout: Duration, max_payload: usize) -> Self {
        let mut resend_js = js.clone();
        resend_js.set_timeout(RESEND_INTERVAL.min(timeout));
        Self {
            js,
            resend_js,
            prefix,
            timeout,
            max_payload,
            clustered: false,
            topics: RwLock::new(HashMap::new()),
            auth: RwLock::new(None),
            bells: bus_core::backend::DoorbellRegistry::new(),
        }
    }

    pub(crate) fn cached(&self, topic: &str) -> Option<Arc<TopicState>> {
        self.topics
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(topic)
            .cloned()
    }

    /// Caches a topic as recorded (keeping an entry already there, and its
    /// cursors).
    pub(crate) fn remember(&self, recorded: Recorded) -> Arc<TopicState> {
        let Recorded { spec, uid_subjects } = recorded;
        let mut topics = self
            .topics
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(existing) = topics.get(&spec.name)
            && existing.spec == spec
            && existing.uid_subjects == uid_subjects
        {
            return Arc::clone(existing);
        }
        let state = Arc::new(TopicState {
            partitions: (0..spec.partitions)
                .map(|partition| PartitionState {
                    stream: stream_name(&self.prefix, &spec.name, partition),
                    cursor: tokio::sync::Mutex::new(None),
                    known_end: AtomicU64::new(0),
                })
                .collect(),
            spec,
            uid_subjects,
        });
        topics.insert(state.spec.name.clone(), Arc::clone(&state));
        state
    }

    /// Forgets a topic whose streams turned out to be gone.
    pub(crate) fn forget(&self, topic: &str) {
        self.topics
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(topic);
    }

    pub(crate) fn cached_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .topics
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    pub(crate) fn all_cached(&self) -> Vec<Arc<TopicState>> {
        self.topics
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    pub(crate) fn auth(&self) -> Option<RecordAuth> {
        self.auth
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set_auth(&self, auth: RecordAuth) {
        *self
            .auth
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(auth);
    }
}
