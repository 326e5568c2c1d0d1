//! How a subscription reads a partition: from the push consumer's buffer
//! when it holds the next records, else a fetch from the stream (C17), and
//! the head for a bounded subscription (C18).

use std::sync::Arc;

use bus_core::backend::Feed;
use bus_core::backend::sync::lock;
use bus_core::{BusError, StoredEvent, StoredRecord};

/// The events of `records`, their headers dropped.
fn events(records: Vec<StoredRecord>) -> Vec<StoredEvent> {
    records.into_iter().map(|record| record.event).collect()
}

use super::NatsFeed;
use crate::errors::unavailable;
use crate::fetch;
use crate::record::RawMessage;

impl NatsFeed {
    /// Records of `partition` from `from` on: the push buffer's when it
    /// holds them, else a fetch from the stream. With `trust_end`, an offset
    /// past the end the push has shown reads as nothing yet (the bell rings
    /// when the push brings more) instead of a fetch.
    fn read_from(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
        trust_end: bool,
    ) -> Result<Vec<StoredRecord>, BusError> {
        let inner = &*self.inner;
        let part = inner.part(partition)?;
        let auth = inner.shared.auth();
        let name = inner.topic.spec.name.as_str();
        if !inner.connected() {
            lock(&part.live).stale = true;
            return Err(unavailable(format!(
                "subscription to topic {name:?} partition {partition}: the connection to NATS is down"
            )));
        }
        let wanted = from.saturating_add(1);
        let limit = {
            let mut live = lock(&part.live);
            while live.buffer.front().is_some_and(|m| m.sequence < wanted) {
                live.buffer.pop_front();
            }
            match live.buffer.front() {
                Some(front) if front.sequence == wanted => {
                    let count = live.buffer.len().min(max);
                    let taken: Vec<RawMessage> = live.buffer.drain(..count).collect();
                    drop(live);
                    return self.decode_buffered(partition, taken, auth.as_ref());
                }
                // The push started (or resumed) further on: fetch up to it.
                Some(front) => usize::try_from(front.sequence - wanted)
                    .unwrap_or(usize::MAX)
                    .min(max),
                None if trust_end && !live.stale && wanted > live.end => {
                    tracing::trace!(
                        partition,
                        wanted,
                        end = live.end,
                        "nats: subscription read at the known end"
                    );
                    return Ok(Vec::new());
                }
                None => max,
            }
        };
        let (shared, topic) = (Arc::clone(&inner.shared), Arc::clone(&inner.topic));
        let reader = Arc::clone(&self.inner);
        let messages =
            self.executor
                .run_watching(&inner.bell, "subscription read", shared.timeout, {
                    move || async move {
                        let part = reader.part(partition)?;
                        fetch::fetch_with(&shared, &topic, partition, from, limit, &part.cursor)
                            .await
                    }
                })??;
        {
            let mut live = lock(&part.live);
            match messages.last() {
                Some(last) => live.end = live.end.max(last.sequence),
                // The server was asked where the stream ends: nothing more.
                None => live.stale = false,
            }
        }
        fetch::decode_all(name, partition, auth.as_ref(), &messages)
    }
}

impl Feed for NatsFeed {
    fn read(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        Ok(events(self.read_from(partition, from, max, true)?))
    }

    /// Fetches from the stream when the push buffer has nothing at `from`,
    /// even past the end the push has shown: the push can trail the head
    /// [`Feed::head`] read, and its "nothing yet" would cut a key catch-up
    /// short (C18).
    fn read_below_head(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, BusError> {
        Ok(events(self.read_from(partition, from, max, false)?))
    }

    /// [`Feed::read`] with the headers (C25): what the subscription reads.
    fn read_records(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        self.read_from(partition, from, max, true)
    }

    /// [`Feed::read_below_head`] with the headers.
    fn read_records_below_head(
        &mut self,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        self.read_from(partition, from, max, false)
    }

    fn head(&mut self, partition: u32) -> Result<u64, BusError> {
        let inner = &*self.inner;
        inner.part(partition)?;
        if !inner.connected() {
            return Err(unavailable(format!(
                "subscription to topic {:?} partition {partition}: the connection to NATS is down",
                inner.topic.spec.name
            )));
        }
        let (shared, topic) = (Arc::clone(&inner.shared), Arc::clone(&inner.topic));
        let offsets = self.executor.run_watching(
            &inner.bell,
            "subscription head",
            shared.timeout,
            move || fetch::offsets(shared, topic, partition),
        )??;
        Ok(offsets.next)
    }
}

impl NatsFeed {
    /// Decodes buffered messages on the caller's thread; those after a
    /// forged one go back to the buffer's front for the next read.
    fn decode_buffered(
        &self,
        partition: u32,
        mut taken: Vec<RawMessage>,
        auth: Option<&bus_core::auth::RecordAuth>,
    ) -> Result<Vec<StoredRecord>, BusError> {
        let name = self.inner.topic.spec.name.as_str();
        let result = fetch::decode_all(name, partition, auth, &taken);
        let used = match &result {
            Ok(events) => events.len(),
            Err(_) => 0,
        };
        if used < taken.len() {
            let part = self.inner.part(partition)?;
            let mut live = lock(&part.live);
            for message in taken.drain(used..).rev() {
                live.buffer.push_front(message);
            }
        }
        result
    }
}
