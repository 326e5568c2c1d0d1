//! The in-process [`CursorStore`] of the memory bus: cursors in a map,
//! ownership by a set of live tokens and a condition variable for
//! [`OwnerPolicy::Wait`].

use std::collections::{BTreeMap, HashSet};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use super::store::{check_owner, fenced_error};
use super::{CursorState, CursorStore, OwnerPolicy, OwnerToken, StoredSelector};
use crate::BusError;

#[derive(Debug, Default)]
struct Table {
    cursors: BTreeMap<(String, String), CursorState>,
    /// Tokens handed out and not released: the instances alive.
    live: HashSet<u64>,
    last_id: u64,
}

/// Cursors of the memory bus, shared by every handle on one store. Nothing
/// survives the process (memory keeps no data across one either).
#[derive(Debug, Default)]
pub struct MemoryCursorStore {
    table: Mutex<Table>,
    released: Condvar,
}

impl MemoryCursorStore {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic elsewhere cannot leave the map half-updated: every
        // change below is one insert or remove.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn key(topic: &str, name: &str) -> (String, String) {
    (topic.to_owned(), name.to_owned())
}

impl CursorStore for MemoryCursorStore {
    fn acquire(
        &self,
        topic: &str,
        name: &str,
        policy: OwnerPolicy,
        selector: &StoredSelector,
    ) -> Result<(OwnerToken, CursorState), BusError> {
        let deadline = match policy {
            OwnerPolicy::Wait(wait) => Instant::now().checked_add(wait),
            _ => None,
        };
        let mut table = self.lock();
        loop {
            let owner = table
                .cursors
                .get(&key(topic, name))
                .and_then(|state| state.owner);
            let owned = owner.is_some_and(|id| table.live.contains(&id));
            if !owned || policy == OwnerPolicy::TakeOver {
                break;
            }
            match policy {
                OwnerPolicy::Fail | OwnerPolicy::TakeOver => {
                    return Err(BusError::ConsumerBusy {
                        topic: topic.to_owned(),
                        consumer: name.to_owned(),
                    });
                }
                OwnerPolicy::Wait(wait) => {
                    let now = Instant::now();
                    let left = deadline.map_or(wait, |at| at.saturating_duration_since(now));
                    if left.is_zero() {
                        return Err(BusError::timeout(
                            format!(
                                "waiting for consumer {name:?} of topic {topic:?} to be released"
                            ),
                            wait,
                        ));
                    }
                    table = self
                        .released
                        .wait_timeout(table, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
        table.last_id += 1;
        let id = table.last_id;
        table.live.insert(id);
        let state = table
            .cursors
            .entry(key(topic, name))
            .or_insert_with(|| CursorState {
                selector: selector.clone(),
                partitions: BTreeMap::new(),
                owner: None,
            });
        state.owner = Some(id);
        let state = state.clone();
        Ok((OwnerToken { id, hold: None }, state))
    }

    fn store(
        &self,
        topic: &str,
        name: &str,
        token: &OwnerToken,
        state: &CursorState,
    ) -> Result<(), BusError> {
        let mut table = self.lock();
        let current = table.cursors.get(&key(topic, name));
        check_owner(current, token).map_err(|why| fenced_error(topic, name, why))?;
        let mut state = state.clone();
        state.owner = Some(token.id);
        table.cursors.insert(key(topic, name), state);
        Ok(())
    }

    fn release(&self, _topic: &str, _name: &str, token: OwnerToken) {
        self.lock().live.remove(&token.id);
        self.released.notify_all();
    }

    fn list(&self, topic: &str) -> Result<Vec<(String, CursorState)>, BusError> {
        Ok(self
            .lock()
            .cursors
            .iter()
            .filter(|((t, _), _)| t == topic)
            .map(|((_, name), state)| (name.clone(), state.clone()))
            .collect())
    }

    fn load(&self, topic: &str, name: &str) -> Result<Option<CursorState>, BusError> {
        Ok(self.lock().cursors.get(&key(topic, name)).cloned())
    }

    fn replace(
        &self,
        topic: &str,
        name: &str,
        state: Option<&CursorState>,
    ) -> Result<bool, BusError> {
        let mut table = self.lock();
        let existed = match state {
            Some(state) => {
                let mut state = state.clone();
                state.owner = None;
                table.cursors.insert(key(topic, name), state).is_some()
            }
            None => table.cursors.remove(&key(topic, name)).is_some(),
        };
        drop(table);
        // A waiter may now go on: the owner it waited for is fenced.
        self.released.notify_all();
        Ok(existed)
    }
}

impl super::DurableConsumers for crate::memory::MemoryBus {
    fn consume(
        &self,
        topic: &str,
        name: &str,
        selector: crate::Selector,
        start_if_new: crate::StartAt,
        options: super::ConsumeOptions,
    ) -> Result<super::Consumer, BusError> {
        super::open_consumer(
            self,
            std::sync::Arc::new(self.internal_handle()),
            self.cursor_store(),
            topic,
            name,
            selector,
            start_if_new,
            options,
        )
    }

    fn consumers(&self, topic: &str) -> Result<Vec<super::ConsumerInfo>, BusError> {
        super::list_consumers(self, self.cursor_store().as_ref(), topic)
    }

    fn reset_consumer(
        &self,
        topic: &str,
        name: &str,
        start: crate::StartAt,
    ) -> Result<(), BusError> {
        super::reset_consumer(self, self.cursor_store().as_ref(), topic, name, start)
    }

    fn delete_consumer(&self, topic: &str, name: &str) -> Result<bool, BusError> {
        super::delete_consumer(self, self.cursor_store().as_ref(), topic, name)
    }

    fn shared_cursor_store(&self) -> Option<std::sync::Arc<dyn super::CursorStore>> {
        Some(self.cursor_store())
    }
}
