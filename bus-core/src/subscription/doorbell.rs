//! The wake-up a backend gives its subscriptions.
//!
//! The bells of one topic share a [`Chime`]: a generation counter and a
//! queue of the subscribers asleep on it. Ringing a topic is one atomic
//! add, plus, when someone sleeps, waking ONE sleeper: whatever the number
//! of subscribers, a publish costs the same (with 256 subscribers a
//! broadcast had the publisher's futex call wake 256 threads, and the
//! publisher then fought them for the condvar's mutex). Each woken sleeper
//! wakes up to two more that slept on an older generation before it
//! reads, so the wake-up spreads as a tree (depth log2 of the sleepers) on
//! the subscribers' own threads. A bell also counts its own rings, for a
//! backend that wakes one subscription alone.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::thread::Thread;
use std::time::Instant;

use crate::sync::{lock, read, write};

/// How many older sleepers a woken sleeper wakes before it reads: two
/// makes the wake-up a binary tree (256 sleepers: 8 steps deep, not 256).
const PASS_ON: usize = 2;

/// One subscriber asleep on a chime.
#[derive(Debug)]
struct Sleeper {
    /// The chime's generation when it went to sleep: the queue is in this
    /// order (it is read under the queue's lock, and only grows), so the
    /// sleepers a ring concerns are a prefix of the queue.
    seen: u64,
    thread: Thread,
    /// The bell it sleeps on, for that bell's own rings (identity only).
    bell: usize,
    /// Set when a ring (or a woken sleeper) took it off the queue: it then
    /// owes the wake-up to the next ones (C18: no subscriber misses a
    /// record because another was woken instead of it).
    popped: AtomicBool,
}

/// What the bells of one topic share.
///
/// Why no wake-up is lost: orderings are `SeqCst`. A ringer adds to
/// `generation` then reads `sleepers`; a sleeper, under the queue's lock,
/// adds to `sleepers` then reads `generation`. One of them sees the other:
/// either the sleeper sees the new generation and does not sleep, or the
/// ringer sees a sleeper, takes the lock (after the sleeper queued itself)
/// and pops the oldest one. Every sleeper that is popped wakes the next
/// older ones before it returns, so each ring reaches every sleeper that
/// slept on an older generation: while one of them is still queued, a
/// popped sleeper that has not yet passed the wake-up on exists. A ring
/// that finds such a sleeper on its way (`waking`) leaves the wake-up to
/// it: the sleeper leaves `waking` before it reads the generation, the
/// ringer added to the generation before it read `waking`, so the sleeper
/// sees the new generation and wakes every sleeper older than it.
#[derive(Debug, Default)]
struct Chime {
    generation: AtomicU64,
    /// The length of `queue`, read without its lock by a ringer; the ring
    /// skips the lock while it is zero.
    sleepers: AtomicUsize,
    /// Sleepers popped that have not yet passed the wake-up on.
    waking: AtomicUsize,
    queue: Mutex<VecDeque<Arc<Sleeper>>>,
}

impl Chime {
    fn ring(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        // A publisher that outruns the wake-up it started (the woken
        // thread has not run yet) makes no further wake-up calls.
        if self.sleepers.load(Ordering::SeqCst) > 0 && self.waking.load(Ordering::SeqCst) == 0 {
            self.wake_older(1);
        }
    }

    /// Pops up to `count` sleepers that slept on a generation older than
    /// the current one and wakes them: O(count), whatever the queue's
    /// length.
    fn wake_older(&self, count: usize) {
        let mut woken: [Option<Thread>; PASS_ON] = [None, None];
        {
            let mut queue = lock(&self.queue);
            let current = self.generation.load(Ordering::SeqCst);
            for slot in woken.iter_mut().take(count) {
                let Some(front) = queue.front() else { break };
                if front.seen == current {
                    // The rest slept on the current generation too.
                    break;
                }
                let Some(sleeper) = queue.pop_front() else {
                    break;
                };
                self.sleepers.fetch_sub(1, Ordering::SeqCst);
                self.waking.fetch_add(1, Ordering::SeqCst);
                sleeper.popped.store(true, Ordering::SeqCst);
                *slot = Some(sleeper.thread.clone());
            }
        }
        // Unparked after the lock is released, so the woken thread does
        // not wake into a held lock.
        for thread in woken.into_iter().flatten() {
            thread.unpark();
        }
    }

    /// Wakes the sleepers of one bell (its own ring, or its close) without
    /// taking them off the queue: they take themselves off.
    fn wake_bell(&self, bell: usize) {
        if self.sleepers.load(Ordering::SeqCst) == 0 {
            return;
        }
        let threads: Vec<Thread> = lock(&self.queue)
            .iter()
            .filter(|sleeper| sleeper.bell == bell)
            .map(|sleeper| sleeper.thread.clone())
            .collect();
        for thread in threads {
            thread.unpark();
        }
    }

    /// A sleeper leaves: off the queue if nobody popped it, else it wakes
    /// the next older ones (it owes them the wake-up it got).
    fn leave(&self, sleeper: &Arc<Sleeper>) {
        if !sleeper.popped.load(Ordering::SeqCst) {
            let mut queue = lock(&self.queue);
            // Popped is written under this lock: read again under it.
            if !sleeper.popped.load(Ordering::SeqCst) {
                // The oldest are in front, and a sleeper leaving on its
                // own mostly saw a ring the wake-up has not reached yet.
                if let Some(index) = queue.iter().position(|s| Arc::ptr_eq(s, sleeper)) {
                    queue.remove(index);
                    self.sleepers.fetch_sub(1, Ordering::SeqCst);
                }
                return;
            }
        }
        // Off the count first, then the generation is read (under the
        // queue's lock): a ring that saw this sleeper counted and skipped
        // its wake-up is seen here.
        self.waking.fetch_sub(1, Ordering::SeqCst);
        self.wake_older(PASS_ON);
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

    fn identity(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// Wakes the subscription.
    pub fn ring(&self) {
        self.own.fetch_add(1, Ordering::SeqCst);
        self.chime.wake_bell(self.identity());
    }

    /// Ends the subscription's waits for good (the bus or the subscription
    /// is gone).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.chime.wake_bell(self.identity());
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
        let sleeper = {
            let mut queue = lock(&chime.queue);
            chime.sleepers.fetch_add(1, Ordering::SeqCst);
            let generation = chime.generation.load(Ordering::SeqCst);
            if self.moved(seen) {
                chime.sleepers.fetch_sub(1, Ordering::SeqCst);
                return true;
            }
            let sleeper = Arc::new(Sleeper {
                seen: generation,
                thread: std::thread::current(),
                bell: self.identity(),
                popped: AtomicBool::new(false),
            });
            queue.push_back(Arc::clone(&sleeper));
            sleeper
        };
        let rung = loop {
            // A ring that found this sleeper popped it; a ring that has
            // not reached it yet moved the generation; own rings and
            // closes unpark it without popping.
            if sleeper.popped.load(Ordering::SeqCst) || self.moved(seen) {
                break true;
            }
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            // Returns on an unpark, at the deadline, or spuriously (an
            // unpark meant for an earlier wait): the loop looks again.
            std::thread::park_timeout(deadline - now);
        };
        chime.leave(&sleeper);
        rung || self.moved(seen)
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

    /// Many sleepers on one topic, rung round after round: each ring wakes
    /// one sleeper and the woken pass it on, so every sleeper must wake in
    /// every round. A lost wake-up shows as a sleeper that does not report
    /// within the deadline (its own wait is far longer, so the deadline,
    /// not a timeout inside the wait, is what catches it).
    #[test]
    fn one_ring_wakes_every_sleeper_through_the_chain() {
        const SLEEPERS: usize = 64;
        const ROUNDS: usize = 100;
        let registry = DoorbellRegistry::new();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
        let (woke_tx, woke_rx) = std::sync::mpsc::channel::<bool>();
        let bells: Vec<Arc<Doorbell>> = (0..SLEEPERS).map(|_| registry.register("t")).collect();
        let threads: Vec<_> = bells
            .iter()
            .map(|bell| {
                let bell = Arc::clone(bell);
                let (ready, woke) = (ready_tx.clone(), woke_tx.clone());
                std::thread::spawn(move || {
                    for _ in 0..ROUNDS {
                        let seen = bell.generation();
                        if ready.send(()).is_err() || bell.is_closed() {
                            return;
                        }
                        let rung = bell.wait_past(seen, Instant::now() + Duration::from_secs(600));
                        if woke.send(rung).is_err() || bell.is_closed() {
                            return;
                        }
                    }
                })
            })
            .collect();
        let deadline = Duration::from_secs(20);
        let mut failure = None;
        'rounds: for round in 0..ROUNDS {
            for _ in 0..SLEEPERS {
                if ready_rx.recv_timeout(deadline).is_err() {
                    failure = Some(format!("round {round}: a sleeper never got ready"));
                    break 'rounds;
                }
            }
            registry.ring("t");
            for woken in 0..SLEEPERS {
                match woke_rx.recv_timeout(deadline) {
                    Ok(true) => {}
                    Ok(false) => {
                        failure = Some(format!("round {round}: a wait timed out"));
                        break 'rounds;
                    }
                    Err(_) => {
                        failure = Some(format!(
                            "round {round}: only {woken} of {SLEEPERS} sleepers woke (lost wake-up)"
                        ));
                        break 'rounds;
                    }
                }
            }
        }
        // Release whoever still sleeps, so a failure does not hang the test.
        registry.close_all();
        drop((ready_rx, woke_rx));
        for thread in threads {
            thread.join().expect("sleeper");
        }
        assert_eq!(failure, None);
        assert_eq!(
            registry_sleepers(&bells[0]),
            0,
            "every sleeper left the queue"
        );
    }

    fn registry_sleepers(bell: &Doorbell) -> usize {
        bell.chime.sleepers.load(Ordering::SeqCst)
    }

    /// A bell's own ring and its close reach its sleeper even while other
    /// sleepers of the topic stay asleep, and leave them queued.
    #[test]
    fn own_ring_wakes_only_its_sleeper() {
        let registry = DoorbellRegistry::new();
        let mine = registry.register("t");
        let other = registry.register("t");
        let (tx, rx) = std::sync::mpsc::channel();
        let far = Instant::now() + Duration::from_secs(600);
        let spawn = |bell: &Arc<Doorbell>| {
            let bell = Arc::clone(bell);
            let tx = tx.clone();
            let seen = bell.generation();
            std::thread::spawn(move || {
                let rung = bell.wait_past(seen, far);
                let _ = tx.send(bell.identity());
                rung
            })
        };
        let (a, b) = (spawn(&mine), spawn(&other));
        // Poll until both are queued (deadline, no sleep).
        let until = Instant::now() + Duration::from_secs(20);
        while registry_sleepers(&mine) < 2 {
            assert!(Instant::now() < until, "the sleepers never queued");
            std::thread::yield_now();
        }
        mine.ring();
        let first = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("own ring wakes its sleeper");
        assert_eq!(first, mine.identity());
        assert!(a.join().expect("mine"));
        assert_eq!(registry_sleepers(&mine), 1, "the other still sleeps");
        other.close();
        assert!(b.join().expect("other"));
        assert_eq!(registry_sleepers(&mine), 0);
    }

    #[test]
    fn an_owner_closes_its_bells_when_dropped() {
        let owner = SubscriptionOwner::default();
        let bell = owner.register("t");
        drop(owner);
        assert!(bell.is_closed());
    }
}
