//! What a backend supplies for durable consumers: a [`CursorStore`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::OwnerPolicy;
use crate::BusError;
use crate::subscription::Selector;

/// A consumer's selector in a form the stores persist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoredSelector {
    /// [`Selector::Topic`].
    Topic,
    /// [`Selector::Partition`].
    Partition(u32),
    /// [`Selector::Key`].
    Key(String),
}

impl From<&Selector> for StoredSelector {
    fn from(selector: &Selector) -> Self {
        match selector {
            Selector::Topic => Self::Topic,
            Selector::Partition(partition) => Self::Partition(*partition),
            Selector::Key(key) => Self::Key(key.clone()),
        }
    }
}

impl From<&StoredSelector> for Selector {
    fn from(selector: &StoredSelector) -> Self {
        match selector {
            StoredSelector::Topic => Self::Topic,
            StoredSelector::Partition(partition) => Self::Partition(*partition),
            StoredSelector::Key(key) => Self::Key(key.clone()),
        }
    }
}

/// One partition of a stored cursor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    /// The first offset not acknowledged.
    pub next: u64,
    /// Ranges `[start, end)` above `next` acknowledged out of order: kept
    /// so an acknowledged record is not delivered again after a restart
    /// (C21).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acked: Vec<(u64, u64)>,
    /// Deliveries so far of records in flight when the cursor was written,
    /// so a restart goes on counting (C21, C22).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deliveries: Vec<(u64, u32)>,
}

/// What a backend stores under (topic, consumer name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorState {
    /// What the consumer reads; a later `consume` with another selector is
    /// refused.
    pub selector: StoredSelector,
    /// Per partition of the selector.
    pub partitions: BTreeMap<u32, PartitionState>,
    /// The token of the instance allowed to write, if one holds it: a
    /// store by any other token is [`BusError::Fenced`] (C23).
    pub owner: Option<u64>,
}

/// Proof of ownership of a consumer, from [`CursorStore::acquire`]: its id
/// is written into the cursor; `hold` keeps whatever the backend needs held
/// while the instance lives (an OS file lock, a lease).
pub struct OwnerToken {
    /// Unique among every token the store handed out for this consumer.
    pub id: u64,
    /// Kept alive with the token; dropped by [`CursorStore::release`].
    pub hold: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerToken")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A backend's native storage for consumer cursors. Every method is about
/// one (topic, consumer name); names are checked before they reach it.
pub trait CursorStore: Send + Sync {
    /// Takes ownership as `policy` says when another live instance owns
    /// it, and returns the token with the stored state; a consumer never
    /// stored gets `CursorState { selector, partitions: empty, .. }` (the
    /// engine then stores its start). The state is written durably naming
    /// the new token as owner before this returns, so a previous owner is
    /// fenced from here on.
    fn acquire(
        &self,
        topic: &str,
        name: &str,
        policy: OwnerPolicy,
        selector: &StoredSelector,
    ) -> Result<(OwnerToken, CursorState), BusError>;

    /// Writes `state` durably if `token` still owns the consumer;
    /// [`BusError::Fenced`] (and nothing written) otherwise.
    fn store(
        &self,
        topic: &str,
        name: &str,
        token: &OwnerToken,
        state: &CursorState,
    ) -> Result<(), BusError>;

    /// Gives up ownership (no-op when already fenced).
    fn release(&self, topic: &str, name: &str, token: OwnerToken);

    /// The stored state of every consumer of `topic`, by name.
    fn list(&self, topic: &str) -> Result<Vec<(String, CursorState)>, BusError>;

    /// The stored state of one consumer.
    fn load(&self, topic: &str, name: &str) -> Result<Option<CursorState>, BusError>;

    /// Replaces the state (`None`: deletes it), with no owner, so a running
    /// instance is fenced. Returns whether there was a state before.
    fn replace(
        &self,
        topic: &str,
        name: &str,
        state: Option<&CursorState>,
    ) -> Result<bool, BusError>;
}

/// The [`BusError::Fenced`] a store reports.
pub fn fenced_error(topic: &str, name: &str, reason: &str) -> BusError {
    BusError::Fenced {
        topic: topic.to_owned(),
        consumer: name.to_owned(),
        reason: reason.to_owned(),
    }
}

/// Whether `state` lets `token` write, else the reason it does not.
pub fn check_owner(state: Option<&CursorState>, token: &OwnerToken) -> Result<(), &'static str> {
    match state {
        None => Err("the consumer was deleted"),
        Some(state) if state.owner == Some(token.id) => Ok(()),
        Some(state) if state.owner.is_none() => Err("the consumer was reset"),
        Some(_) => Err("another instance took over"),
    }
}
