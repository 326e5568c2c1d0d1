//! The async surface of a durable consumer: a `Stream` of deliveries with
//! `ack`/`nack` futures.
//!
//! As with [`SubscriptionStream`](crate::SubscriptionStream), the consumer's
//! blocking reads and cursor writes run on a thread of its own, never on a
//! runtime worker; it reads only when the task asks for a delivery (nothing
//! is read ahead), and it ends, joined, when the stream is dropped.

use std::pin::Pin;
use std::sync::mpsc::{self as std_mpsc, TryRecvError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::channel::{mpsc, oneshot};
use futures::{Stream, StreamExt as _};

use super::{Consumer, Delivery};
use crate::BusError;

/// While a delivery is asked for and none arrives, the thread looks at its
/// commands this often, so an `ack` sent meanwhile is not held up behind
/// the wait (the subscription's wait cannot be interrupted from outside).
const COMMAND_SLICE: Duration = Duration::from_millis(50);

type Reply = oneshot::Sender<Result<(), BusError>>;

enum Command {
    Next,
    Ack(Box<Delivery>, Reply),
    AckThrough(u32, u64, Reply),
    Nack(Box<Delivery>, String, Reply),
    Flush(Reply),
}

/// A [`Consumer`] as a `Stream` of deliveries, for tokio (or any async)
/// code; [`ConsumerStream::ack`] and friends return futures answered by the
/// consumer's thread, in the order they were called.
pub struct ConsumerStream {
    deliveries: mpsc::UnboundedReceiver<Result<Delivery, BusError>>,
    commands: Option<std_mpsc::Sender<Command>>,
    asked: bool,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for ConsumerStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerStream")
            .field("asked", &self.asked)
            .finish_non_exhaustive()
    }
}

fn closed() -> BusError {
    BusError::backend("bus", "the consumer stream's thread is gone")
}

impl ConsumerStream {
    /// Moves `consumer` onto its own thread.
    pub fn new(mut consumer: Consumer) -> Result<Self, BusError> {
        let (sender, deliveries) = mpsc::unbounded();
        let (commands, received) = std_mpsc::channel::<Command>();
        let thread = std::thread::Builder::new()
            .name("bus-consumer".to_owned())
            .spawn(move || {
                let mut wanted = false;
                loop {
                    let command = if wanted {
                        match received.try_recv() {
                            Ok(command) => Some(command),
                            Err(TryRecvError::Empty) => None,
                            Err(TryRecvError::Disconnected) => break,
                        }
                    } else {
                        match received.recv() {
                            Ok(command) => Some(command),
                            Err(_) => break,
                        }
                    };
                    match command {
                        Some(Command::Next) => wanted = true,
                        Some(Command::Ack(delivery, reply)) => {
                            let _ = reply.send(consumer.ack(&delivery));
                        }
                        Some(Command::AckThrough(partition, offset, reply)) => {
                            let _ = reply.send(consumer.ack_through(partition, offset));
                        }
                        Some(Command::Nack(delivery, reason, reply)) => {
                            let _ = reply.send(consumer.nack(&delivery, &reason));
                        }
                        Some(Command::Flush(reply)) => {
                            let _ = reply.send(consumer.flush());
                        }
                        None => {
                            let item = match consumer.recv_timeout(COMMAND_SLICE) {
                                Ok(Some(delivery)) => Ok(delivery),
                                Ok(None) if consumer.is_closed() => break,
                                Ok(None) => continue,
                                Err(error) => Err(error),
                            };
                            wanted = false;
                            if sender.unbounded_send(item).is_err() {
                                break;
                            }
                        }
                    }
                }
                // Dropping the consumer here writes its pending acks and
                // gives up ownership, on this thread.
                drop(consumer);
            })
            .map_err(BusError::Io)?;
        Ok(Self {
            deliveries,
            commands: Some(commands),
            asked: false,
            thread: Some(thread),
        })
    }

    fn send(
        &self,
        command: impl FnOnce(Reply) -> Command,
    ) -> oneshot::Receiver<Result<(), BusError>> {
        let (reply, answer) = oneshot::channel();
        if let Some(commands) = &self.commands {
            // A thread that is gone drops the reply: the future says so.
            let _ = commands.send(command(reply));
        }
        answer
    }

    /// Acknowledges `delivery` ([`Consumer::ack`]).
    pub fn ack(
        &self,
        delivery: &Delivery,
    ) -> impl Future<Output = Result<(), BusError>> + Send + 'static {
        let answer = self.send(|reply| Command::Ack(Box::new(delivery.clone()), reply));
        async move { answer.await.unwrap_or_else(|_| Err(closed())) }
    }

    /// Acknowledges through `offset` of `partition` ([`Consumer::ack_through`]).
    pub fn ack_through(
        &self,
        partition: u32,
        offset: u64,
    ) -> impl Future<Output = Result<(), BusError>> + Send + 'static {
        let answer = self.send(|reply| Command::AckThrough(partition, offset, reply));
        async move { answer.await.unwrap_or_else(|_| Err(closed())) }
    }

    /// Rejects `delivery` ([`Consumer::nack`]).
    pub fn nack(
        &self,
        delivery: &Delivery,
        reason: &str,
    ) -> impl Future<Output = Result<(), BusError>> + Send + 'static {
        let answer =
            self.send(|reply| Command::Nack(Box::new(delivery.clone()), reason.to_owned(), reply));
        async move { answer.await.unwrap_or_else(|_| Err(closed())) }
    }

    /// Writes pending acknowledgements ([`Consumer::flush`]).
    pub fn flush(&self) -> impl Future<Output = Result<(), BusError>> + Send + 'static {
        let answer = self.send(Command::Flush);
        async move { answer.await.unwrap_or_else(|_| Err(closed())) }
    }
}

impl Stream for ConsumerStream {
    type Item = Result<Delivery, BusError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if !self.asked {
            let sent = self
                .commands
                .as_ref()
                .is_some_and(|commands| commands.send(Command::Next).is_ok());
            self.asked = sent;
        }
        let polled = self.deliveries.poll_next_unpin(cx);
        if matches!(polled, Poll::Ready(_)) {
            self.asked = false;
        }
        polled
    }
}

impl Drop for ConsumerStream {
    fn drop(&mut self) {
        // Closing the command channel ends the thread within one slice.
        self.commands = None;
        self.deliveries.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Consumer {
    /// This consumer as an async `Stream` of deliveries (see
    /// [`ConsumerStream`]).
    pub fn into_stream(self) -> Result<ConsumerStream, BusError> {
        ConsumerStream::new(self)
    }
}
