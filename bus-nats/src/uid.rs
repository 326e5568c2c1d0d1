//! UID subjects under a control key (contracts C6, C7, C14). Anyone who can
//! publish onto a partition's subjects can put a message on a UID's subject
//! before the bus does; without a valid tag it must not answer for the UID.
//! So with a key set, the record that answers is the first authentic one on
//! the subject, and a genuine publish that finds only forgeries is stored
//! anyway, conditioned on the subject's last sequence so that concurrent
//! retries still store one record.

use async_nats::jetstream::stream::{DirectGetErrorKind, Stream};
use bus_core::BusError;
use bus_core::auth::RecordAuth;

use crate::errors::unavailable;
use crate::record::{RawMessage, from_stream_message, is_authentic};

/// Messages read per UID subject looking for an authentic one; past this
/// the subject's last message decides (a flood of forgeries cannot make a
/// lookup unbounded).
const MAX_SCAN: usize = 32;

/// What a UID's subject holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolved {
    /// The authentic record with this stream sequence.
    Authentic(u64),
    /// No authentic record; the subject's last sequence (0 when empty).
    Absent { last: u64 },
}

/// The UID record a subject's messages name, checked against its key.
pub(crate) struct UidSubject<'a> {
    pub(crate) stream: &'a Stream<()>,
    pub(crate) subject: &'a str,
    pub(crate) topic: &'a str,
    pub(crate) partition: u32,
    pub(crate) uid: &'a str,
    pub(crate) auth: &'a RecordAuth,
    pub(crate) what: &'a str,
}

impl UidSubject<'_> {
    fn authentic(&self, message: &RawMessage) -> bool {
        is_authentic(self.topic, self.partition, self.auth, self.uid, message)
    }

    fn failed(&self, error: &impl std::fmt::Display) -> BusError {
        unavailable(format!("{}: {error}", self.what))
    }

    /// The subject's last message, `None` when it is empty.
    async fn last(&self) -> Result<Option<RawMessage>, BusError> {
        match self
            .stream
            .direct_get_last_for_subject(self.subject.to_owned())
            .await
        {
            Ok(message) => Ok(Some(from_stream_message(message))),
            Err(error) if error.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(error) => Err(self.failed(&error)),
        }
    }

    /// The message at or after `from` on the subject, `None` past its end.
    async fn next(&self, from: u64) -> Result<Option<RawMessage>, BusError> {
        match self
            .stream
            .direct_get_next_for_subject(self.subject.to_owned(), Some(from))
            .await
        {
            Ok(message) => Ok(Some(from_stream_message(message))),
            Err(error) if error.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(error) => Err(self.failed(&error)),
        }
    }

    /// The common case first: the last message is authentic (one get).
    /// Otherwise the subject is walked from its start, bounded.
    pub(crate) async fn resolve(&self) -> Result<Resolved, BusError> {
        let Some(last) = self.last().await? else {
            return Ok(Resolved::Absent { last: 0 });
        };
        // The bus stores a second record for a UID only after finding none
        // authentic, so an authentic last message is the UID's record (an
        // exact replay of it would be too: the tag does not cover offsets).
        if self.authentic(&last) {
            return Ok(Resolved::Authentic(last.sequence));
        }
        let mut from = 1;
        for _ in 0..MAX_SCAN {
            match self.next(from).await? {
                Some(message) if message.sequence >= last.sequence => break,
                Some(message) if self.authentic(&message) => {
                    return Ok(Resolved::Authentic(message.sequence));
                }
                Some(message) => from = message.sequence + 1,
                None => break,
            }
        }
        Ok(Resolved::Absent {
            last: last.sequence,
        })
    }
}
