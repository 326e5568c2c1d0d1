//! UID subjects (contracts C6, C7, C14). Each UID has its own subject in
//! the partition's stream; the record that answers for a UID is the FIRST
//! one on that subject that carries the UID (and, with a control key set, a
//! tag that verifies). Anyone who can publish onto a partition's subjects can
//! put messages there: a forgery before the bus's record must not answer,
//! and neither may a byte-exact replay of the record after it (its tag
//! verifies too: tags do not cover sequences). A genuine publish that finds
//! no authentic record is stored anyway, conditioned on the subject's last
//! sequence so that concurrent retries still store one record.

use bus_core::BusError;
use bus_core::auth::RecordAuth;

use crate::errors::unavailable_caused;
use crate::get::{ReadError, Reads};
use crate::record::{RawMessage, from_stream_message, is_authentic};

/// Messages read per UID subject looking for the first authentic one; past
/// this the subject's last message decides (a flood of forgeries cannot make
/// a lookup unbounded).
const MAX_SCAN: usize = 32;

/// What a UID's subject holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolved {
    /// The first authentic record, with this stream sequence.
    Authentic(u64),
    /// No authentic record; the subject's last sequence (0 when empty).
    Absent { last: u64 },
}

/// The UID record a subject's messages name, checked against its key.
pub(crate) struct UidSubject<'a> {
    pub(crate) reads: Reads<'a>,
    pub(crate) subject: &'a str,
    pub(crate) topic: &'a str,
    pub(crate) partition: u32,
    pub(crate) uid: &'a str,
    /// The control key; without one, any record carrying the UID counts.
    pub(crate) auth: Option<&'a RecordAuth>,
    pub(crate) what: &'a str,
}

impl UidSubject<'_> {
    fn authentic(&self, message: &RawMessage) -> bool {
        is_authentic(self.topic, self.partition, self.auth, self.uid, message)
    }

    fn failed(&self, error: ReadError) -> BusError {
        unavailable_caused(format!("{}: {error}", self.what), error)
    }

    /// The subject's last message, `None` when it is empty.
    async fn last(&self) -> Result<Option<RawMessage>, BusError> {
        match self.reads.last_on(self.subject).await {
            Ok(message) => Ok(message.map(from_stream_message)),
            Err(error) => Err(self.failed(error)),
        }
    }

    /// The message at or after `from` on the subject, `None` past its end.
    async fn next(&self, from: u64) -> Result<Option<RawMessage>, BusError> {
        match self.reads.next_on(self.subject, from).await {
            Ok(message) => Ok(message.map(from_stream_message)),
            Err(error) => Err(self.failed(error)),
        }
    }

    /// The common case first: the subject's first message is authentic (one
    /// get, answered from the server's per-subject index). Otherwise the
    /// subject is walked on, bounded, and then its last message decides.
    pub(crate) async fn resolve(&self) -> Result<Resolved, BusError> {
        let mut from = 1;
        let mut seen = 0;
        for _ in 0..MAX_SCAN {
            match self.next(from).await? {
                Some(message) if self.authentic(&message) => {
                    return Ok(Resolved::Authentic(message.sequence));
                }
                Some(message) => {
                    seen = message.sequence;
                    from = message.sequence + 1;
                }
                None => return Ok(Resolved::Absent { last: seen }),
            }
        }
        let Some(last) = self.last().await? else {
            return Ok(Resolved::Absent { last: 0 });
        };
        // Past the scan only the newest message is checked: behind a flood
        // of forgeries the bus stores its record last.
        if self.authentic(&last) {
            return Ok(Resolved::Authentic(last.sequence));
        }
        Ok(Resolved::Absent {
            last: last.sequence,
        })
    }
}
