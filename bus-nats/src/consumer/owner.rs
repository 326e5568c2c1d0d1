//! Liveness of a consumer's owner (C23) by core NATS: the owner answers
//! requests on its own subject while it lives; an acquirer asks there.

use std::time::Duration;

use async_nats::{Client, RequestErrorKind};
use bus_core::BusError;
use futures::StreamExt;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::errors::unavailable_caused;

/// Longest wait for a live owner's answer: it answers from its
/// connection's runtime at once, so a silence this long means a stalled
/// owner, which is still taken as live (see `owner_alive`).
const ASK_LIMIT: Duration = Duration::from_secs(2);

/// The owner's side: a task answering every request on its subject.
pub(super) struct Responder {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Responder {
    /// Subscribes on `subject` and returns once the server has the
    /// subscription (a flush), so an acquirer asking after the cursor
    /// names this owner finds it.
    pub(super) async fn start(client: Client, subject: String) -> Result<Self, BusError> {
        let mut subscriber = client.subscribe(subject).await.map_err(|error| {
            unavailable_caused(format!("subscribing the consumer owner: {error}"), error)
        })?;
        client.flush().await.map_err(|error| {
            unavailable_caused(format!("subscribing the consumer owner: {error}"), error)
        })?;
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    message = subscriber.next() => match message {
                        Some(message) => {
                            if let Some(reply) = message.reply {
                                let _ = client.publish(reply, bytes::Bytes::from_static(b"live")).await;
                            }
                        }
                        None => return,
                    },
                    _ = &mut stopped => {
                        let _ = subscriber.unsubscribe().await;
                        let _ = client.flush().await;
                        return;
                    }
                }
            }
        });
        Ok(Self {
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// Unsubscribes and returns once the server was told.
    pub(super) async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Responder {
    /// Dropped without `stop` (a token dropped without release): the task
    /// ends, its subscription with it.
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Whether the owner answering on `subject` lives: an answer, or a
/// subscription that does not answer within the limit, is a live owner;
/// "no responders" (no subscription: the owner let go, or its connection,
/// and so its process, is gone) is a dead one.
pub(super) async fn owner_alive(
    client: &Client,
    subject: String,
    timeout: Duration,
) -> Result<bool, BusError> {
    let limit = ASK_LIMIT.min(timeout);
    let request = async_nats::Request::new()
        .payload(bytes::Bytes::new())
        .timeout(Some(limit));
    match client.send_request(subject, request).await {
        Ok(_) => Ok(true),
        Err(error) => match error.kind() {
            RequestErrorKind::NoResponders => Ok(false),
            RequestErrorKind::TimedOut => Ok(true),
            _ => Err(unavailable_caused(
                format!("asking a consumer owner whether it lives: {error}"),
                error,
            )),
        },
    }
}
