//! A partition's publish queue: the records waiting for the next group
//! commit round (see `publish.rs`, which runs the rounds).

use std::sync::Mutex;

use bus_core::BusError;
use tokio::sync::oneshot;

/// A checked and encoded record, not yet stored (nor signed: its tag covers
/// the offset it gets).
pub(crate) struct Prepared {
    pub(crate) partition: u32,
    pub(crate) key: String,
    pub(crate) uid: Option<String>,
    pub(crate) value: Vec<u8>,
    /// The caller's headers (C25), covered by the tag made at commit.
    pub(crate) headers: bus_core::Headers,
}

pub(crate) struct Request {
    pub(crate) records: Vec<Prepared>,
    pub(crate) reply: oneshot::Sender<Result<Vec<u64>, BusError>>,
}

/// The pending publishes of one partition.
#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) state: Mutex<QueueState>,
}

#[derive(Default)]
pub(crate) struct QueueState {
    pub(crate) pending: Vec<Request>,
    pub(crate) flushing: bool,
    /// The counter as the last round of this process left it: the offset
    /// the next round's tags are made for (`None`: read it under the lock).
    pub(crate) next: Option<u64>,
}
