//! UID deduplication (contracts C6, C7): an in-process index per partition,
//! warmed on first use from the partition's tail covering the topic's dedup
//! window (`offsets_for_times`), and caught up to the high watermark before
//! each check, so records written by other buses since are seen too. Its
//! lock is held across check and produce, so concurrent retries of one UID
//! in one process store one record; waiting for it ends at the caller's
//! deadline (contract C10). A UID record whose caller gave up before its
//! delivery report stays tracked until the report comes, so a retry gets
//! that record's offset instead of storing a second copy.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use bus_core::auth::RecordAuth;
use bus_core::{BusError, now_ms};

use crate::client::Late;
use crate::reader::RawMessage;
use crate::{Core, KafkaOptions};
use bus_core::backend::sync::lock;

/// Records read per step of an index scan.
const SCAN_PAGE: usize = 2_000;
/// How far below the warmed window `find_event_by_uid` looks, newest first.
pub(crate) const FIND_TAIL: u64 = 100_000;

/// How index scans check records: a record that fails its tag while a
/// control key is set never holds a UID (a forgery must not answer for the
/// genuine event).
#[derive(Clone, Copy)]
pub(crate) struct Checker<'a> {
    /// The bus topic name the tags cover.
    pub topic: &'a str,
    /// The bus partition.
    pub partition: u32,
    /// The control key, if set.
    pub auth: Option<&'a RecordAuth>,
}

impl Checker<'_> {
    fn uid_of(self, message: RawMessage<'_>) -> (u64, Option<String>) {
        let authentic = self.auth.is_none_or(|auth| {
            crate::fetch::tag_verifies(self.topic, self.partition, &message, auth)
        });
        (
            message.offset,
            message.uid.filter(|_| authentic).map(str::to_owned),
        )
    }
}

/// One partition's dedup state.
#[derive(Default)]
pub(crate) struct PartitionState {
    pub(crate) index: Mutex<UidIndex>,
    /// Whether a [`IndexGuard`] is out; `freed` rings when it returns.
    busy: Mutex<bool>,
    freed: Condvar,
}

impl PartitionState {
    /// The index, once no other call holds it, or a timeout at `deadline`:
    /// a `std` mutex would let a waiter queue behind one holder after
    /// another (it is not fair) well past its own deadline while a
    /// partition leader fails over and each holder waits out its own.
    pub(crate) fn lock_until(
        &self,
        options: &KafkaOptions,
        deadline: Instant,
    ) -> Result<IndexGuard<'_>, BusError> {
        let mut busy = lock(&self.busy);
        while *busy {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(crate::errors::timed_out(options, "publish"));
            }
            busy = self
                .freed
                .wait_timeout(busy, left)
                .map_or_else(|poisoned| poisoned.into_inner().0, |(busy, _)| busy);
        }
        *busy = true;
        drop(busy);
        Ok(IndexGuard {
            index: Some(lock(&self.index)),
            state: self,
        })
    }
}

/// Exclusive use of one partition's [`UidIndex`].
pub(crate) struct IndexGuard<'a> {
    index: Option<MutexGuard<'a, UidIndex>>,
    state: &'a PartitionState,
}

impl Deref for IndexGuard<'_> {
    type Target = UidIndex;
    fn deref(&self) -> &UidIndex {
        self.index.as_deref().unwrap_or_else(|| unreachable!())
    }
}

impl DerefMut for IndexGuard<'_> {
    fn deref_mut(&mut self) -> &mut UidIndex {
        self.index.as_deref_mut().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for IndexGuard<'_> {
    fn drop(&mut self) {
        self.index = None;
        *lock(&self.state.busy) = false;
        self.state.freed.notify_one();
    }
}

/// UIDs of one partition's records within `from..to`, first offset wins.
#[derive(Default)]
pub(crate) struct UidIndex {
    uids: HashMap<String, u64>,
    from: u64,
    to: u64,
    warmed: bool,
    /// UIDs produced by a call that gave up before the delivery report.
    in_flight: HashMap<String, Arc<Late>>,
}

impl UidIndex {
    /// Forgets everything, so the next use warms again (the control key
    /// changed, and with it which records are authentic).
    pub(crate) fn reset(&mut self) {
        let in_flight = std::mem::take(&mut self.in_flight);
        *self = Self {
            in_flight,
            ..Self::default()
        };
    }

    /// The unfinished earlier publish of `uid`, if any.
    pub(crate) fn in_flight(&self, uid: &str) -> Option<Arc<Late>> {
        self.in_flight.get(uid).cloned()
    }

    /// Notes a record of `uid` whose delivery report has not come yet.
    pub(crate) fn track(&mut self, uid: &str, late: Arc<Late>) {
        self.in_flight.insert(uid.to_owned(), late);
    }

    /// Takes in the reports that came for tracked records: a stored one
    /// gives its UID's offset, a failed one is forgotten (a retry produces
    /// the UID again).
    pub(crate) fn settle(&mut self) {
        let uids = &mut self.uids;
        self.in_flight.retain(|uid, late| match late.peek() {
            None => true,
            Some(Ok(offset)) => {
                if let Ok(offset) = u64::try_from(offset) {
                    uids.entry(uid.clone()).or_insert(offset);
                }
                false
            }
            Some(Err(_)) => false,
        });
    }

    /// The first stored offset of `uid`, as far as indexed.
    pub(crate) fn get(&self, uid: &str) -> Option<u64> {
        self.uids.get(uid).copied()
    }

    /// Notes a record this bus just stored.
    pub(crate) fn record(&mut self, uid: &str, offset: u64) {
        self.uids.entry(uid.to_owned()).or_insert(offset);
        if offset == self.to {
            self.to = offset + 1;
        }
    }

    /// Indexes everything up to the high watermark (on first use, from the
    /// first record within `window_ms` of now).
    pub(crate) fn catch_up(
        &mut self,
        core: &Core,
        topic: &str,
        partition: i32,
        window_ms: u64,
        deadline: Instant,
        checker: Checker<'_>,
    ) -> Result<(), BusError> {
        let options = &core.options;
        let (low, high) = core.pool.watermarks(options, topic, partition, deadline)?;
        if !self.warmed {
            let since = i64::try_from(now_ms().saturating_sub(window_ms)).unwrap_or(0);
            let start = core
                .pool
                .offset_for_time(options, topic, partition, since, deadline)?
                .clamp(low, high);
            self.from = start;
            self.to = start;
            self.warmed = true;
        }
        self.to = self.to.max(low);
        while self.to < high {
            let page = core.pool.read(
                options,
                topic,
                partition,
                self.to,
                SCAN_PAGE,
                deadline,
                |message| checker.uid_of(message),
            )?;
            let Some(last) = page.last().map(|(offset, _)| *offset) else {
                break;
            };
            for (offset, uid) in page {
                if let Some(uid) = uid {
                    self.uids.entry(uid).or_insert(offset);
                }
            }
            self.to = last + 1;
        }
        Ok(())
    }

    /// Looks for `uid` below the indexed range, newest page first, down to
    /// [`FIND_TAIL`] records below it (never from offset 0 of a long log).
    pub(crate) fn search_tail(
        &mut self,
        core: &Core,
        topic: &str,
        partition: i32,
        uid: &str,
        deadline: Instant,
        checker: Checker<'_>,
    ) -> Result<Option<u64>, BusError> {
        let options = &core.options;
        let (low, _) = core.pool.watermarks(options, topic, partition, deadline)?;
        let floor = low.max(self.from.saturating_sub(FIND_TAIL));
        while self.from > floor {
            let start = floor.max(self.from.saturating_sub(SCAN_PAGE as u64));
            let count = usize::try_from(self.from - start).unwrap_or(SCAN_PAGE);
            let page = core.pool.read(
                options,
                topic,
                partition,
                start,
                count,
                deadline,
                |message| checker.uid_of(message),
            )?;
            for (offset, found) in page.into_iter().filter(|(offset, _)| *offset < self.from) {
                if let Some(found) = found {
                    let slot = self.uids.entry(found).or_insert(offset);
                    *slot = (*slot).min(offset);
                }
            }
            self.from = start;
            if let Some(offset) = self.get(uid) {
                return Ok(Some(offset));
            }
        }
        Ok(None)
    }
}
