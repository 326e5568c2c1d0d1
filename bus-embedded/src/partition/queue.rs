//! The publishers' queue of a partition: requests waiting for a writer
//! round, each publisher's slot (its turn to wait, lead or take its
//! answer), the commit thread's handle, and how much one round takes.

use bus_core::backend::sync::lock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bus_core::BusError;
use bus_core::auth::RecordAuth;

use crate::log::frame::{self, NewRecord};

/// Record bytes one writer round takes at most (it always takes one
/// request), so an oversized request never shares a frame with others.
pub(super) const ROUND_BYTES: usize = 8 << 20;

#[derive(Debug, Default)]
pub(super) struct Queue {
    pub(super) pending: Vec<Request>,
    /// A publisher is writing a round, or has been handed the lead.
    pub(super) leading: bool,
    /// The leader waits in [`Partition::gather`](super::Partition::gather) for `expected` requests.
    pub(super) gathering: bool,
    pub(super) expected: usize,
    pub(super) last_commit: Duration,
}

/// The thread that leads rounds for async publishers, started at the
/// partition's first async publish. It holds the partition weakly, so the
/// partition still closes cleanly when the bus drops it.
#[derive(Debug)]
pub(super) struct Committer {
    /// One message per call to lead; dropping it ends the thread.
    pub(super) bell: std::sync::mpsc::Sender<()>,
    pub(super) thread: std::thread::JoinHandle<()>,
}

#[derive(Debug)]
pub(super) struct Request {
    pub(super) records: Vec<NewRecord>,
    /// The publisher's key: stored UIDs count for dedup only when their
    /// record authenticates under it.
    pub(super) auth: Option<RecordAuth>,
    /// False for records written as given, the way a foreign writer would
    /// (test hook): their UIDs are not deduplicated.
    pub(super) dedup: bool,
    /// Where the publisher waits: only the publishers of a finished round
    /// are woken, and the next leader alone.
    pub(super) slot: Arc<Slot>,
}

#[derive(Debug)]
pub(super) enum Turn {
    Waiting,
    /// Lead the next round (the request is still queued).
    Lead,
    Done(Result<Vec<u64>, BusError>),
}

/// One waiting publisher's turn. Publishers wait on their partition's
/// [`Partition::answered`](super::Partition::answered) word, so a finished round wakes all its
/// publishers with one `futex` call.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) turn: Mutex<Turn>,
    /// An async publisher's task, woken when its turn is set.
    pub(super) waker: Mutex<Option<std::task::Waker>>,
    /// An async publisher: never handed the lead.
    pub(super) asynchronous: bool,
}

impl Slot {
    pub(super) fn new() -> Self {
        Self {
            turn: Mutex::new(Turn::Waiting),
            waker: Mutex::new(None),
            asynchronous: false,
        }
    }

    /// Sets the turn; a sync publisher sees it after the next
    /// [`Partition::wake`](super::Partition::wake), an async one is woken now.
    pub(super) fn set(&self, turn: Turn) {
        *lock(&self.turn) = turn;
        if self.asynchronous
            && let Some(waker) = lock(&self.waker).take()
        {
            waker.wake();
        }
    }

    /// Blocks until the request is answered or its publisher must lead.
    pub(super) fn wait(&self, answered: &AtomicU32) -> Option<Result<Vec<u64>, BusError>> {
        loop {
            // Read before looking, so a wake between the look and the wait
            // makes the wait return at once.
            let seen = answered.load(Ordering::Acquire);
            let turn = std::mem::replace(&mut *lock(&self.turn), Turn::Waiting);
            match turn {
                Turn::Waiting => atomic_wait::wait(answered, seen),
                Turn::Lead => return None,
                Turn::Done(result) => return Some(result),
            }
        }
    }
}

/// Whom [`Partition::pass_lead`](super::Partition::pass_lead) handed the lead to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lead {
    /// Nobody: the queue is empty.
    Ended,
    /// A sync publisher, to be woken.
    Publisher,
    /// The commit thread, to be called (only async publishers wait).
    Committer,
}

/// The answer to an async publish (see [`Partition::append_async`](super::Partition::append_async)).
#[cfg(feature = "async")]
#[derive(Debug)]
pub(crate) struct Answer(pub(super) Option<Arc<Slot>>);

#[cfg(feature = "async")]
impl std::future::Future for Answer {
    type Output = Result<Vec<u64>, BusError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let Some(slot) = &self.0 else {
            return std::task::Poll::Ready(Ok(Vec::new()));
        };
        let mut turn = lock(&slot.turn);
        match std::mem::replace(&mut *turn, Turn::Waiting) {
            Turn::Done(result) => std::task::Poll::Ready(result),
            // An async publisher is never handed the lead.
            Turn::Lead => std::task::Poll::Ready(Err(BusError::backend(
                "embedded",
                "an async publisher was handed the writer's lead",
            ))),
            Turn::Waiting => {
                // Registered while the turn is locked: `set` takes the
                // waker only after it changed the turn.
                *lock(&slot.waker) = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }
}

pub(super) fn take_round(pending: &mut Vec<Request>) -> Vec<Request> {
    let mut bytes = 0;
    let mut take = 0;
    for request in pending.iter() {
        let size = request
            .records
            .iter()
            .map(frame::record_size)
            .sum::<usize>();
        if take > 0 && bytes + size > ROUND_BYTES {
            break;
        }
        bytes += size;
        take += 1;
    }
    pending.drain(..take).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn request(id: u64, value_bytes: usize) -> Request {
        Request {
            records: vec![NewRecord {
                key: id.to_string(),
                uid: None,
                tag: None,
                headers: Vec::new(),
                value: vec![b'1'; value_bytes],
            }],
            auth: None,
            dedup: true,
            slot: Arc::new(Slot::new()),
        }
    }

    #[test]
    fn an_oversized_request_gets_a_round_of_its_own() {
        let mut pending = vec![request(0, 10), request(1, ROUND_BYTES), request(2, 10)];
        let ids = |round: Vec<Request>| {
            round
                .iter()
                .map(|r| r.records[0].key.parse::<u64>().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(take_round(&mut pending)), vec![0]);
        assert_eq!(ids(take_round(&mut pending)), vec![1]);
        assert_eq!(ids(take_round(&mut pending)), vec![2]);
    }
}
