//! The wake-up a backend gives its subscriptions.
//!
//! The bells of one topic share a [`Chime`]: a generation counter and one
//! condvar. Ringing a topic is one atomic add, plus one broadcast when a
//! subscriber sleeps, whatever the number of subscribers; a publish never
//! visits each subscription's bell (with 256 subscribers that was 256
//! futex wakes per publish). A bell also counts its own rings, for a
//! backend that wakes one subscription alone; that wake reaches the other
//! sleepers of the topic as a spurious one (they look at their counters
//! and sleep again, without reading).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock, Weak};
use std::time::Instant;

use crate::sync::{lock, read, write};

/// What the bells of one topic share. Orderings are `SeqCst`: a ringer
/// adds to `generation` then reads `sleepers`, a sleeper adds to
/// `sleepers` then reads `generation`, so one of them sees the other and
/// a ring between "read found nothing" and "sleep" is never lost.
#[derive(Debug, Default)]
struct Chime {
    generation: AtomicU64,
    /// Subscribers inside [`Doorbell::wait_past`]; the ring skips the
    /// broadcast while there are none.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    changed: Condvar,
}

impl Chime {
    fn ring(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.wake();
    }

    /// Wakes the sleepers so they look at their counters again.
    fn wake(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            // Taken and released so the broadcast cannot fall between a
            // sleeper's last look and its wait.
            drop(lock(&self.lock));
            self.changed.notify_all();
        }
    }
}

/// Rung by a backend when a record may have become visible.
#[derive(Debug, Default)]
pub struct Doorbell {
    chime: Arc<Chime>,
    /// Rings of this bell alone ([`Doorbell::ring`]).
    own: AtomicU64,
    closed: AtomicBool,
}

impl Doorbell {
    /// A new doorbell, shared between the backend and one subscription.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn with_chime(chime: &Arc<Chime>) -> Arc<Self> {
        Arc::new(Self {
            chime: Arc::clone(chime),
            own: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        })
    }

    /// Wakes the subscription.
    pub fn ring(&self) {
        self.own.fetch_add(1, Ordering::SeqCst);
        self.chime.wake();
    }

    /// Ends the subscription's waits for good (the bus or the subscription
    /// is gone).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.chime.wake();
    }

    /// Whether [`Doorbell::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// The current generation; pass it to [`Doorbell::wait_past`] after a
    /// read that found nothing.
    pub fn generation(&self) -> u64 {
        self.chime
            .generation
            .load(Ordering::SeqCst)
            .wrapping_add(self.own.load(Ordering::SeqCst))
    }

    fn moved(&self, seen: u64) -> bool {
        self.generation() != seen || self.is_closed()
    }

    /// Sleeps until the generation differs from `seen`, the bell is closed,
    /// or `deadline` passes. Returns whether it was rung (or closed).
    pub fn wait_past(&self, seen: u64, deadline: Instant) -> bool {
        if self.moved(seen) {
            return true;
        }
        let chime = &*self.chime;
        let mut guard = lock(&chime.lock);
        chime.sleepers.fetch_add(1, Ordering::SeqCst);
        let rung = loop {
            if self.moved(seen) {
                break true;
            }
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            guard = chime
                .changed
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        };
        chime.sleepers.fetch_sub(1, Ordering::SeqCst);
        drop(guard);
        rung
    }
}

/// The bells of one topic: the chime that rings them all, and the bells
/// themselves for closing them.
#[derive(Debug, Default)]
struct TopicBells {
    chime: Arc<Chime>,
    bells: Vec<Weak<Doorbell>>,
}

/// The doorbells of a backend's live subscriptions, by topic: the commit
/// path rings a topic (one chime, not one bell per subscription), a
/// dropped subscription's bell is pruned.
#[derive(Debug, Default)]
pub struct DoorbellRegistry {
    topics: RwLock<HashMap<String, TopicBells>>,
}

impl DoorbellRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new doorbell rung for every record of `topic`.
    pub fn register(&self, topic: &str) -> Arc<Doorbell> {
        let mut topics = write(&self.topics);
        let entry = topics.entry(topic.to_owned()).or_default();
        entry.bells.retain(|weak| weak.strong_count() > 0);
        let bell = Doorbell::with_chime(&entry.chime);
        entry.bells.push(Arc::downgrade(&bell));
        bell
    }

    /// Rings every live doorbell of `topic`: a cost that does not grow
    /// with the number of subscriptions.
    pub fn ring(&self, topic: &str) {
        if let Some(entry) = read(&self.topics).get(topic) {
            entry.chime.ring();
        }
    }

    /// Rings every live doorbell of every topic.
    pub fn ring_all(&self) {
        for entry in read(&self.topics).values() {
            entry.chime.ring();
        }
    }

    /// Closes every live doorbell (the bus is shutting down).
    pub fn close_all(&self) {
        let live: Vec<Arc<Doorbell>> = write(&self.topics)
            .drain()
            .flat_map(|(_, entry)| entry.bells.into_iter().filter_map(|weak| weak.upgrade()))
            .collect();
        for bell in live {
            bell.close();
        }
    }

    /// Whether any live subscription listens on `topic` (lets a commit path
    /// skip the ring when nobody listens).
    pub fn has_listeners(&self, topic: &str) -> bool {
        read(&self.topics)
            .get(topic)
            .is_some_and(|entry| entry.bells.iter().any(|weak| weak.strong_count() > 0))
    }
}

/// The doorbells of one bus's live subscriptions, for a backend whose
/// handles share it: when the last handle that holds it drops, every
/// subscription made through them ends (C17: `None`, the stream ends).
/// Subscriptions' own machinery must not hold it. Its bells are rung one
/// by one (each has a chime of its own).
#[derive(Debug, Default)]
pub struct SubscriptionOwner {
    bells: Mutex<Vec<Weak<Doorbell>>>,
}

impl SubscriptionOwner {
    /// A doorbell for a new subscription of `topic`.
    pub fn register(&self, _topic: &str) -> Arc<Doorbell> {
        let bell = Doorbell::new();
        let mut bells = lock(&self.bells);
        bells.retain(|weak| weak.strong_count() > 0);
        bells.push(Arc::downgrade(&bell));
        bell
    }
}

impl Drop for SubscriptionOwner {
    fn drop(&mut self) {
        let bells = std::mem::take(self.bells.get_mut().unwrap_or_else(PoisonError::into_inner));
        for bell in bells.iter().filter_map(Weak::upgrade) {
            bell.close();
        }
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

    #[test]
    fn a_topic_ring_wakes_a_sleeper_and_a_bells_own_ring_moves_only_it() {
        let registry = DoorbellRegistry::new();
        let sleeper = registry.register("t");
        let sibling = registry.register("t");
        let seen = sleeper.generation();
        let waiter = {
            let sleeper = Arc::clone(&sleeper);
            std::thread::spawn(move || {
                sleeper.wait_past(seen, Instant::now() + Duration::from_secs(10))
            })
        };
        registry.ring("t");
        assert!(waiter.join().expect("waiter"));
        let (mine, theirs) = (sleeper.generation(), sibling.generation());
        sibling.ring();
        assert_eq!(sleeper.generation(), mine);
        assert_ne!(sibling.generation(), theirs);
    }

    #[test]
    fn an_owner_closes_its_bells_when_dropped() {
        let owner = SubscriptionOwner::default();
        let bell = owner.register("t");
        drop(owner);
        assert!(bell.is_closed());
    }
}
