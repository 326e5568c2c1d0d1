//! The async adapter: a [`Subscription`] as a `futures::Stream`.
//!
//! The subscription's reads may block (a file read, a wait on its doorbell),
//! so they run on a thread of its own, never on a runtime worker. The thread
//! reads only when the consumer asks (a poll with no item on its way): it
//! hands over one item per request and then waits, so nothing is read ahead
//! of the consumer and `max_lag` decides on what the task has seen, as the
//! synchronous handle does, whatever the timing of the polls. It ends when
//! the stream is dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::channel::mpsc;
use futures::{Stream, StreamExt as _};

use super::{Doorbell, Subscription, SubscriptionItem};
use crate::BusError;

/// A [`Subscription`] as a `Stream` of items, for tokio (or any async) code.
pub struct SubscriptionStream {
    items: mpsc::UnboundedReceiver<Result<SubscriptionItem, BusError>>,
    /// One message per item the consumer is waiting for.
    requests: Option<std::sync::mpsc::Sender<()>>,
    /// A request is out and its item has not come back yet.
    asked: bool,
    bell: Arc<Doorbell>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The `process` span of the item handed out last (feature `otel`).
    #[cfg(feature = "otel")]
    pub(super) deliveries: Option<crate::otel::Deliveries>,
}

impl std::fmt::Debug for SubscriptionStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionStream")
            .field("asked", &self.asked)
            .finish_non_exhaustive()
    }
}

impl SubscriptionStream {
    /// Moves `subscription` onto its own thread and streams its items.
    pub fn new(mut subscription: Subscription) -> Result<Self, BusError> {
        let bell = subscription.doorbell();
        let (sender, items) = mpsc::unbounded();
        let (requests, asked) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("bus-subscription".to_owned())
            .spawn(move || {
                // Each request is answered by exactly one item; the channel
                // closes when the stream is dropped.
                while asked.recv().is_ok() {
                    let Some(item) = subscription.recv() else {
                        break;
                    };
                    if sender.unbounded_send(item).is_err() {
                        break;
                    }
                }
            })
            .map_err(BusError::Io)?;
        Ok(Self {
            items,
            requests: Some(requests),
            asked: false,
            bell,
            thread: Some(thread),
            #[cfg(feature = "otel")]
            deliveries: None,
        })
    }
}

impl Stream for SubscriptionStream {
    type Item = Result<SubscriptionItem, BusError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if !self.asked {
            // A new request: the task is done with the item before.
            #[cfg(feature = "otel")]
            if let Some(deliveries) = &mut self.deliveries {
                deliveries.end();
            }
            let sent = self
                .requests
                .as_ref()
                .is_some_and(|requests| requests.send(()).is_ok());
            // A thread that is gone has sent all it will: the channel
            // below then ends.
            self.asked = sent;
        }
        let polled = self.items.poll_next_unpin(cx);
        if matches!(polled, Poll::Ready(_)) {
            self.asked = false;
        }
        #[cfg(feature = "otel")]
        if let (
            Some(deliveries),
            Poll::Ready(Some(Ok(SubscriptionItem::Record {
                topic,
                event,
                headers,
            }))),
        ) = (&mut self.deliveries, &polled)
        {
            deliveries.begin(topic, event, headers);
        }
        polled
    }
}

impl Drop for SubscriptionStream {
    fn drop(&mut self) {
        // Wake the thread out of its wait (the bell) or out of waiting for
        // a request (the channel), then join it so nothing outlives the
        // stream.
        self.bell.close();
        self.requests = None;
        self.items.close();
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
