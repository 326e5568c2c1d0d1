//! Point reads of a partition's stream: one message by sequence, or the
//! next or last message on a subject.
//!
//! A direct get is answered by any server that holds the stream, and on a
//! replicated stream a follower may not have applied yet what the leader
//! acked. A read there could miss a record its caller saw acked or read a
//! moment before: a fetch would see fewer records than an earlier one, and
//! a find could miss a record just published. So replicated streams are
//! read through the leader (JetStream's message-get API); a stream of one
//! replica has only one server to answer, and keeps the faster direct gets.

use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, LastRawMessageErrorKind, Stream};

/// How point reads reach one stream.
#[derive(Clone, Copy)]
pub(crate) struct Reads<'a> {
    stream: &'a Stream<()>,
    /// Whether every read must be answered by the stream's leader.
    leader: bool,
}

/// A read that failed for another reason than "no such message".
pub(crate) type ReadError = async_nats::Error;

impl<'a> Reads<'a> {
    /// Reads of `stream`, whose topic has `replicas` replicas.
    pub(crate) fn new(stream: &'a Stream<()>, replicas: u16) -> Self {
        Self {
            stream,
            leader: replicas > 1,
        }
    }

    /// The stream read.
    pub(crate) fn stream(&self) -> &'a Stream<()> {
        self.stream
    }

    /// The message with stream sequence `sequence`, `None` when there is
    /// none (never stored, or removed by retention).
    pub(crate) async fn sequence(&self, sequence: u64) -> Result<Option<StreamMessage>, ReadError> {
        if self.leader {
            leader(self.stream.get_raw_message(sequence).await)
        } else {
            direct(self.stream.direct_get(sequence).await)
        }
    }

    /// The first message on `subject` at or after sequence `from`.
    pub(crate) async fn next_on(
        &self,
        subject: &str,
        from: u64,
    ) -> Result<Option<StreamMessage>, ReadError> {
        if self.leader {
            leader(
                self.stream
                    .get_first_raw_message_by_subject(subject, from)
                    .await,
            )
        } else {
            direct(
                self.stream
                    .direct_get_next_for_subject(subject, Some(from))
                    .await,
            )
        }
    }

    /// The last message on `subject`.
    pub(crate) async fn last_on(&self, subject: &str) -> Result<Option<StreamMessage>, ReadError> {
        if self.leader {
            leader(self.stream.get_last_raw_message_by_subject(subject).await)
        } else {
            direct(self.stream.direct_get_last_for_subject(subject).await)
        }
    }
}

fn direct(
    answer: Result<StreamMessage, async_nats::jetstream::stream::DirectGetError>,
) -> Result<Option<StreamMessage>, ReadError> {
    match answer {
        Ok(message) => Ok(Some(message)),
        Err(error) if error.kind() == DirectGetErrorKind::NotFound => Ok(None),
        Err(error) => Err(error.into()),
    }
}

fn leader(
    answer: Result<StreamMessage, async_nats::jetstream::stream::LastRawMessageError>,
) -> Result<Option<StreamMessage>, ReadError> {
    match answer {
        Ok(message) => Ok(Some(message)),
        Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(error) => Err(error.into()),
    }
}
