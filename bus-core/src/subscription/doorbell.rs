//! The wake-up a backend gives its subscriptions: a generation counter under
//! a mutex and a condvar, so a ring between "read found nothing" and "wait"
//! is never lost, and an idle subscriber sleeps without polling.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Instant;

/// Rung by a backend when a record may have become visible.
#[derive(Debug, Default)]
pub struct Doorbell {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    generation: u64,
    closed: bool,
}

impl Doorbell {
    /// A new doorbell, shared between the backend and one subscription.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// Wakes the subscription.
    pub fn ring(&self) {
        let mut state = self.lock();
        state.generation = state.generation.wrapping_add(1);
        drop(state);
        self.changed.notify_all();
    }

    /// Ends the subscription's waits for good (the bus or the subscription
    /// is gone).
    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    /// Whether [`Doorbell::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// The current generation; pass it to [`Doorbell::wait_past`] after a
    /// read that found nothing.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Sleeps until the generation differs from `seen`, the bell is closed,
    /// or `deadline` passes. Returns whether it was rung (or closed).
    pub fn wait_past(&self, seen: u64, deadline: Instant) -> bool {
        let mut state = self.lock();
        loop {
            if state.generation != seen || state.closed {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// The doorbells of a backend's live subscriptions, by topic: the commit
/// path rings a topic's bells, a dropped subscription's bell is pruned.
#[derive(Debug, Default)]
pub struct DoorbellRegistry {
    bells: Mutex<HashMap<String, Vec<Weak<Doorbell>>>>,
}

impl DoorbellRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Weak<Doorbell>>>> {
        crate::sync::lock(&self.bells)
    }

    /// A new doorbell rung for every record of `topic`.
    pub fn register(&self, topic: &str) -> Arc<Doorbell> {
        let bell = Doorbell::new();
        let mut bells = self.lock();
        let list = bells.entry(topic.to_owned()).or_default();
        list.retain(|weak| weak.strong_count() > 0);
        list.push(Arc::downgrade(&bell));
        bell
    }

    /// Rings every live doorbell of `topic`.
    pub fn ring(&self, topic: &str) {
        let live: Vec<Arc<Doorbell>> = {
            let bells = self.lock();
            match bells.get(topic) {
                Some(list) => list.iter().filter_map(Weak::upgrade).collect(),
                None => return,
            }
        };
        for bell in live {
            bell.ring();
        }
    }

    /// Rings every live doorbell of every topic.
    pub fn ring_all(&self) {
        let live: Vec<Arc<Doorbell>> = self
            .lock()
            .values()
            .flat_map(|list| list.iter().filter_map(Weak::upgrade))
            .collect();
        for bell in live {
            bell.ring();
        }
    }

    /// Closes every live doorbell (the bus is shutting down).
    pub fn close_all(&self) {
        let live: Vec<Arc<Doorbell>> = self
            .lock()
            .drain()
            .flat_map(|(_, list)| list.into_iter().filter_map(|weak| weak.upgrade()))
            .collect();
        for bell in live {
            bell.close();
        }
    }

    /// Whether any live subscription listens on `topic` (lets a commit path
    /// skip the ring when nobody listens).
    pub fn has_listeners(&self, topic: &str) -> bool {
        self.lock()
            .get(topic)
            .is_some_and(|list| list.iter().any(|weak| weak.strong_count() > 0))
    }
}

/// The doorbells of one bus's live subscriptions, for a backend whose
/// handles share it: when the last handle that holds it drops, every
/// subscription made through them ends (C17: `None`, the stream ends).
/// Subscriptions' own machinery must not hold it.
#[derive(Debug, Default)]
pub struct SubscriptionOwner {
    bells: DoorbellRegistry,
}

impl SubscriptionOwner {
    /// A doorbell for a new subscription of `topic`.
    pub fn register(&self, topic: &str) -> Arc<Doorbell> {
        self.bells.register(topic)
    }
}

impl Drop for SubscriptionOwner {
    fn drop(&mut self) {
        self.bells.close_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_ring_before_the_wait_is_not_lost() {
        let bell = Doorbell::new();
        let seen = bell.generation();
        bell.ring();
        assert!(bell.wait_past(seen, Instant::now() + Duration::from_secs(5)));
    }

    #[test]
    fn a_wait_without_a_ring_times_out() {
        let bell = Doorbell::new();
        let seen = bell.generation();
        assert!(!bell.wait_past(seen, Instant::now() + Duration::from_millis(20)));
    }

    #[test]
    fn a_ring_from_another_thread_wakes_the_waiter() {
        let bell = Doorbell::new();
        let seen = bell.generation();
        let ringer = Arc::clone(&bell);
        let thread = std::thread::spawn(move || ringer.ring());
        assert!(bell.wait_past(seen, Instant::now() + Duration::from_secs(10)));
        thread.join().expect("ringer");
    }

    #[test]
    fn registry_rings_only_the_topic_and_prunes_dropped_bells() {
        let registry = DoorbellRegistry::new();
        let a = registry.register("a");
        let b = registry.register("b");
        let (seen_a, seen_b) = (a.generation(), b.generation());
        registry.ring("a");
        assert_ne!(a.generation(), seen_a);
        assert_eq!(b.generation(), seen_b);
        drop(a);
        assert!(!registry.has_listeners("a"));
        assert!(registry.has_listeners("b"));
        registry.close_all();
        assert!(b.is_closed());
    }
}
