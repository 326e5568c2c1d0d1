//! A partition's read cursor: the ephemeral pull consumer a fetch keeps at
//! the next sequence so that sequential replay reuses it (see
//! `fetch.rs`), with the read-ahead request it may have in flight.

use std::time::Instant;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::consumer::pull::Batch;

/// A partition's reader for sequential replay.
pub(crate) struct Cursor {
    pub(crate) consumer: PullConsumer,
    pub(crate) stream: String,
    /// The stream sequence the caller reads next (the consumer may have
    /// delivered further, into `ahead`).
    pub(crate) next: u64,
    pub(crate) used: Instant,
    /// Reads in a row that continued where the last one ended.
    pub(crate) sequential: u32,
    /// The pull request for the next pages, sent when the last one was
    /// used up; its messages arrive into its subscription meanwhile.
    pub(crate) ahead: Option<Ahead>,
}

/// A read-ahead pull request and how many messages it may still bring.
pub(crate) struct Ahead {
    pub(crate) batch: Batch,
    pub(crate) left: usize,
}

impl Cursor {
    /// The consumer's stream and name, for deleting it.
    pub(crate) fn id(&self) -> (String, String) {
        (
            self.stream.clone(),
            self.consumer.cached_info().name.clone(),
        )
    }
}

/// A partition's sequential-replay cursor, when one is open.
pub(crate) type CursorSlot = tokio::sync::Mutex<Option<Cursor>>;
