//! A cursor write outside the engine: the hooks a backend uses to write
//! an acknowledgement somewhere the engine does not call (PostgreSQL: in
//! the caller's own transaction), so the engine's state follows only what
//! was durably written (C21) and a refused write fences (C23).

use super::super::CursorState;
use super::super::acked::Acked;
use super::super::store::fenced_error;
use super::{Consumer, Delivery};
use crate::BusError;

/// An acknowledgement prepared by [`Consumer::prepare_external_ack`]: the
/// cursor state to write (the acknowledgement applied) and the owner token
/// id the write must be conditional on (C23).
#[derive(Debug, Clone, PartialEq)]
pub struct ExternalAck {
    /// The acknowledged record's partition.
    pub partition: u32,
    /// The acknowledged record's offset.
    pub offset: u64,
    /// The token id the stored cursor must name as owner for the write to
    /// count; any other owner means this instance is fenced.
    pub owner: u64,
    /// The full cursor state to write, owner included.
    pub state: CursorState,
}

impl Consumer {
    /// For a backend that writes the cursor somewhere the engine does not
    /// call (PostgreSQL: inside the caller's own transaction): checks
    /// `delivery` as [`Consumer::ack`] does and returns the cursor state
    /// *as if* it were acknowledged, with the owner token it must be
    /// written under, changing nothing here. `Ok(None)`: acknowledged
    /// already (a second ack is harmless, C21). After the write is
    /// durable, [`Consumer::confirm_external_ack`]; if the write was fenced,
    /// [`Consumer::fence`].
    pub fn prepare_external_ack(
        &self,
        delivery: &Delivery,
    ) -> Result<Option<ExternalAck>, BusError> {
        self.check_fenced()?;
        self.check_mine(delivery)?;
        let (partition, offset) = (delivery.partition, delivery.offset);
        let Some(part) = self.parts.get(&partition) else {
            return Err(BusError::invalid("delivery", "partition not consumed"));
        };
        if part.acked.contains(offset) {
            return Ok(None);
        }
        if !part.flights.contains_key(&offset) {
            return Err(BusError::invalid(
                "delivery",
                format!("offset {offset} of partition {partition} was not delivered"),
            ));
        }
        let Some(token) = &self.token else {
            return Err(fenced_error(
                &self.topic,
                &self.name,
                "the instance was released",
            ));
        };
        let mut state = self.state();
        if let Some(stored) = state.partitions.get_mut(&partition) {
            let mut acked = Acked::new(stored.next, &stored.acked);
            acked.insert(offset, offset.saturating_add(1));
            stored.next = acked.next();
            stored.acked = acked.ranges();
            stored.deliveries.retain(|&(o, _)| o != offset);
        }
        Ok(Some(ExternalAck {
            partition,
            offset,
            owner: token.id,
            state,
        }))
    }

    /// Applies an acknowledgement [`Consumer::prepare_external_ack`]
    /// prepared, once its cursor write is durable: the in-memory state now
    /// follows what committed (C21). Nothing else may have happened to the
    /// consumer in between (the `&mut` borrow a backend holds across its
    /// write makes sure of it); if something did, the state stays dirty and
    /// goes out with the next write.
    pub fn confirm_external_ack(&mut self, prepared: ExternalAck) {
        self.mark_acked(
            prepared.partition,
            prepared.offset,
            prepared.offset.saturating_add(1),
        );
        if self.state() == prepared.state {
            self.pending = 0;
            self.oldest_pending = None;
            self.dirty = false;
        }
    }

    /// Marks this instance fenced (C23) because a write outside the engine
    /// found another owner, and returns the [`BusError::Fenced`] to report:
    /// every later call fails the same way.
    pub fn fence(&mut self, reason: &str) -> BusError {
        self.fenced = Some(reason.to_owned());
        fenced_error(&self.topic, &self.name, reason)
    }
}
