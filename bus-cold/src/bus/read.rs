//! [`ColdBus`]'s read path: hot and cold pages joined gap-free across a
//! moving boundary, and the waker of its subscriptions.

use std::sync::Weak;

use bus_core::backend::Doorbell;
use bus_core::{BusError, EventBus, StoredRecord, Subscription};

use super::{ColdBus, READ_ATTEMPTS, WAKER_POLL};

impl<B: EventBus + 'static> ColdBus<B> {
    /// `fetch_with_headers`: below the inner bus's hot start from the tier,
    /// then the hot log. A hot page that starts past the offset asked for
    /// (a trim ran since the hot start was read) sends the read back to
    /// the tier, so a page is never short in the middle or gapped; a page
    /// ends where a hole in the tier begins, and the read from there is
    /// `Corrupt` naming it.
    pub(super) fn read_through(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        let inner = &self.shared.inner;
        if max == 0 {
            // Checked by the inner bus (C2), empty (C5).
            return inner.fetch_with_headers(topic, partition, offset, 0);
        }
        let mut out: Vec<StoredRecord> = Vec::new();
        let mut next = offset;
        for _ in 0..READ_ATTEMPTS {
            if out.len() >= max {
                return Ok(out);
            }
            let hot = inner.offsets(topic, partition)?;
            if next >= hot.first {
                let page = inner.fetch_with_headers(topic, partition, next, max - out.len())?;
                match page.first() {
                    // A trim may have moved the hot start past `next`
                    // since it was read: the tier has those records now.
                    None if inner.offsets(topic, partition)?.first > next => continue,
                    None => return Ok(out),
                    Some(first) if first.event.offset == next => {
                        out.extend(page);
                        return Ok(out);
                    }
                    // Trimmed since `offsets` was read: those records are
                    // in the tier now; read them from there.
                    Some(_) => continue,
                }
            }
            let want = usize::try_from(hot.first - next)
                .unwrap_or(usize::MAX)
                .min(max - out.len());
            let cold = self.cold_page(topic, partition, next, want)?;
            match cold.first() {
                // A page ends where a hole in the tier begins; the read
                // from there names it.
                None if !out.is_empty() => return Ok(out),
                None => {
                    let manifest = self.shared.tier.manifest(topic, partition)?;
                    if !manifest.ever_archived()
                        || (manifest.ranges.is_empty() && manifest.end() >= hot.first)
                    {
                        // Nothing archived (the hot log alone, as without a
                        // tier), or all the tier held below the hot start
                        // has expired: the read begins at the hot start.
                        return inner.fetch_with_headers(
                            topic,
                            partition,
                            next.max(hot.first),
                            max,
                        );
                    }
                    let from = manifest.end().max(next);
                    return Err(missing(topic, partition, from, hot.first));
                }
                Some(first) if !out.is_empty() && first.event.offset != next => return Ok(out),
                Some(_) => {}
            }
            next = cold.last().map_or(next, |r| r.event.offset + 1);
            out.extend(cold);
        }
        Err(BusError::unavailable(
            "cold",
            format!(
                "{topic}/{partition}: the hot log start kept moving under the read at {offset}"
            ),
        ))
    }

    /// Up to `max` cold records from `from`, verified, as the bus returns them.
    fn cold_page(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        let auth = self.auth();
        self.shared
            .tier
            .read(topic, partition, from, max)?
            .into_iter()
            .map(|record| crate::to_record(topic, partition, record, auth.as_ref()))
            .collect()
    }
}

/// Rings `bell` on each item of the inner bus's live tail; ends with the
/// subscription (its bell dropped or closed) or with the inner bus.
pub(super) fn wake(mut waker: Subscription, bell: &Weak<Doorbell>) {
    loop {
        match bell.upgrade() {
            Some(bell) if !bell.is_closed() => {}
            _ => return,
        }
        let item = waker.recv_timeout(WAKER_POLL);
        let Some(bell) = bell.upgrade() else { return };
        match item {
            Ok(Some(_)) | Err(_) => bell.ring(),
            Ok(None) if waker.is_closed() => {
                bell.close();
                return;
            }
            Ok(None) => {}
        }
    }
}

fn missing(topic: &str, partition: u32, from: u64, end: u64) -> BusError {
    BusError::Corrupt {
        location: format!("cold range {topic}/{partition} [{from}, {end})"),
        offset: from,
        reason:
            "below the hot log start and not in the cold tier (dropped before it was archived?)"
                .into(),
    }
}
