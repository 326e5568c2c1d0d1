//! The async adapter: a [`Subscription`] as a `futures::Stream`.
//!
//! The subscription's reads may block (a file read, a wait on its doorbell),
//! so they run on a thread of its own, never on a runtime worker. The thread
//! hands items over through a rendezvous channel (at most one item ahead of
//! the consumer, so `max_lag` still measures what the task has seen) and
//! ends when the stream is dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::channel::mpsc;
use futures::{SinkExt as _, Stream, StreamExt as _};

use super::{Doorbell, Subscription, SubscriptionItem};
use crate::BusError;

/// A [`Subscription`] as a `Stream` of items, for tokio (or any async) code.
pub struct SubscriptionStream {
    items: mpsc::Receiver<Result<SubscriptionItem, BusError>>,
    bell: Arc<Doorbell>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for SubscriptionStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionStream").finish_non_exhaustive()
    }
}

impl SubscriptionStream {
    /// Moves `subscription` onto its own thread and streams its items.
    pub fn new(mut subscription: Subscription) -> Result<Self, BusError> {
        let bell = subscription.doorbell();
        let (mut sender, items) = mpsc::channel(0);
        let thread = std::thread::Builder::new()
            .name("bus-subscription".to_owned())
            .spawn(move || {
                while let Some(item) = subscription.recv() {
                    if futures::executor::block_on(sender.send(item)).is_err() {
                        break;
                    }
                }
            })
            .map_err(BusError::Io)?;
        Ok(Self {
            items,
            bell,
            thread: Some(thread),
        })
    }
}

impl Stream for SubscriptionStream {
    type Item = Result<SubscriptionItem, BusError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.items.poll_next_unpin(cx)
    }
}

impl Drop for SubscriptionStream {
    fn drop(&mut self) {
        // Wake the thread out of its wait and out of a pending send, then
        // join it so nothing outlives the stream.
        self.bell.close();
        self.items.close();
        while self.items.try_recv().is_ok() {}
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Subscription {
    /// This subscription as an async `Stream` (see [`SubscriptionStream`]).
    pub fn into_stream(self) -> Result<SubscriptionStream, BusError> {
        SubscriptionStream::new(self)
    }
}
