//! The connector executor: a dedicated thread owning a single-worker tokio
//! runtime, through which network backends run their async clients for
//! synchronous callers (contract C9). Callers never `block_on` on their own
//! thread, so the bus works the same from a plain thread and from inside any
//! tokio runtime.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::Instrument as _;

use crate::BusError;

/// Operation timeout when none is configured (contract C10).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How many operations may be in flight on the runtime at once; callers
/// past this wait for a slot (backpressure instead of an unbounded queue).
const IN_FLIGHT_CAPACITY: usize = 1_024;

/// Extra wait past an operation's own timeout before the caller gives up on
/// a wedged runtime.
const GRACE: Duration = Duration::from_millis(500);

/// How long a caller polls for its result before parking, when its
/// operation is the only one in flight and operations have lately taken
/// less than this. Waking a parked thread costs a sleeping vCPU's wake-up:
/// on this project's 2-vCPU VM a no-op round trip through the runtime took
/// 45-56 µs parked and 3.5-7 µs polled, and NATS serial publish (one
/// PubAck, ~150 µs) went from 0.61-0.77 to 0.80-0.88 of raw async-nats
/// (the rest is waking the runtime's worker). Longer spins measured worse:
/// the spinning caller takes a core from the broker on the same machine.
/// Under concurrency callers park at once (the runtime is busy anyway), and
/// so do callers of long operations (a replay page), for whom the wake-up
/// is a small part of the wait.
const SPIN: Duration = Duration::from_micros(250);

/// How long the runtime's worker, about to sleep with nothing in flight,
/// watches for the next operation of a caller that calls one after another.
/// With the caller polling for its result, the worker's sleep was the one
/// wake-up left per call: NATS serial publish measured a median 0.87 of raw
/// async-nats without lingering and 0.94 with 50 µs (six alternating runs
/// each; 20 µs measured alike, 150 µs worse). The worker never lingers
/// while an operation waits on the network, so it does not take the core
/// the broker needs to answer.
const LINGER: Duration = Duration::from_micros(50);

/// A counting gate bounding the operations in flight, and what the
/// runtime's worker looks at before it sleeps.
#[derive(Debug)]
struct Gate {
    in_flight: Mutex<usize>,
    freed: Condvar,
    /// Operations in flight, readable without the lock.
    busy: AtomicUsize,
    /// Operations handed to the runtime so far.
    submitted: AtomicU64,
    /// `submitted` when the worker last lingered: it lingers once per
    /// operation at most, so wake-ups of its own (a stream's messages, a
    /// timer) never make it spin while no caller is calling.
    lingered: AtomicU64,
    /// Moving average of recent operations' durations, in nanoseconds.
    typical_ns: AtomicU64,
}

/// One slot of the gate, released on drop (also when a task is cancelled).
struct Slot(Arc<Gate>);

impl Gate {
    fn new() -> Self {
        Self {
            in_flight: Mutex::new(0),
            freed: Condvar::new(),
            busy: AtomicUsize::new(0),
            submitted: AtomicU64::new(0),
            // No operation has been lingered for yet.
            lingered: AtomicU64::new(u64::MAX),
            typical_ns: AtomicU64::new(0),
        }
    }

    /// Takes a slot; also says whether the caller is the only one in flight.
    fn enter(self: &Arc<Self>) -> (Slot, bool) {
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while *in_flight >= IN_FLIGHT_CAPACITY {
            in_flight = self
                .freed
                .wait(in_flight)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *in_flight += 1;
        self.busy.store(*in_flight, Ordering::Relaxed);
        (Slot(Arc::clone(self)), *in_flight == 1)
    }

    /// Runs on the worker just before it sleeps: when nothing is in flight
    /// and operations have lately been short (a caller publishing one by
    /// one), it watches for the next submission for up to `budget`, so
    /// that one finds the worker awake instead of paying a sleeping vCPU's
    /// wake-up. While an operation waits on the network the worker sleeps
    /// at once, leaving the core to the broker.
    fn linger(&self, budget: Duration) {
        if self.busy.load(Ordering::Relaxed) != 0
            || Duration::from_nanos(self.typical_ns.load(Ordering::Relaxed)) > SPIN
        {
            return;
        }
        let seen = self.submitted.load(Ordering::Relaxed);
        if self.lingered.swap(seen, Ordering::Relaxed) == seen {
            return;
        }
        spin_until(budget, || self.submitted.load(Ordering::Relaxed) != seen);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut in_flight = self
            .0
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *in_flight -= 1;
        self.0.busy.store(*in_flight, Ordering::Relaxed);
        self.0.freed.notify_one();
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The id of the executor whose threads this is, 0 elsewhere.
    static OWNER: Cell<u64> = const { Cell::new(0) };
}

/// Runs futures on a private runtime for synchronous callers.
///
/// ```
/// let executor = bus_core::backend::ConnectorExecutor::new("doc-connector").unwrap();
/// assert_eq!(executor.run(|| async { 40 + 2 }).unwrap(), 42);
/// ```
pub struct ConnectorExecutor {
    id: u64,
    name: String,
    timeout: Duration,
    gate: Arc<Gate>,
    shutdown: Mutex<Option<SyncSender<()>>>,
    handle: tokio::runtime::Handle,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for ConnectorExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectorExecutor")
            .field("name", &self.name)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ConnectorExecutor {
    /// Starts the thread `name` with the default timeout.
    pub fn new(name: &str) -> Result<Self, BusError> {
        Self::with_timeout(name, DEFAULT_TIMEOUT)
    }

    /// Starts the thread `name`; every operation is bounded by `timeout`.
    pub fn with_timeout(name: &str, timeout: Duration) -> Result<Self, BusError> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let (shutdown, shutdown_signal) = std::sync::mpsc::sync_channel::<()>(1);
        let (ready_sender, ready_receiver) = std::sync::mpsc::sync_channel(1);
        let worker_name = format!("{name}-rt");
        let gate = Arc::new(Gate::new());
        let watched = Arc::clone(&gate);
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                OWNER.with(|owner| owner.set(id));
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name(worker_name)
                    .on_thread_start(move || OWNER.with(|owner| owner.set(id)))
                    .on_thread_park(move || watched.linger(LINGER))
                    .enable_all()
                    .build();
                match runtime {
                    Ok(runtime) => {
                        let _ = ready_sender.send(Ok(runtime.handle().clone()));
                        // The worker runs the tasks; this thread owns the
                        // runtime until the executor is dropped.
                        let _ = shutdown_signal.recv();
                        runtime.shutdown_timeout(Duration::from_secs(5));
                    }
                    Err(error) => {
                        let _ = ready_sender.send(Err(error));
                    }
                }
            })?;
        let handle = match ready_receiver.recv() {
            Ok(Ok(handle)) => handle,
            Ok(Err(error)) => {
                let _ = thread.join();
                return Err(BusError::Io(error));
            }
            Err(_) => {
                let _ = thread.join();
                return Err(BusError::backend(
                    "bus",
                    format!("connector thread {name:?} died while starting its runtime"),
                ));
            }
        };
        Ok(Self {
            id,
            name: name.to_owned(),
            timeout,
            gate,
            shutdown: Mutex::new(Some(shutdown)),
            handle,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The per-operation timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A handle to the runtime, for spawning background tasks.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// Runs `operation` on the connector runtime and waits for its output,
    /// bounded by the executor's timeout.
    pub fn run<F, Fut, T>(&self, operation: F) -> Result<T, BusError>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        self.run_bounded("connector operation", self.timeout, operation)
    }

    /// Runs `operation` bounded by `timeout`; a timeout is reported as
    /// [`BusError::Timeout`] naming `what`.
    pub fn run_bounded<F, Fut, T>(
        &self,
        what: &str,
        timeout: Duration,
        operation: F,
    ) -> Result<T, BusError>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        if OWNER.with(Cell::get) == self.id {
            return Err(BusError::backend(
                "bus",
                format!(
                    "{what} was called from a thread of connector {:?}, which would deadlock; call the bus from another thread",
                    self.name
                ),
            ));
        }
        let (result_sender, result_receiver) = std::sync::mpsc::sync_channel(1);
        let (slot, alone) = self.gate.enter();
        // Spawning straight onto the runtime (no hop through a command
        // thread) costs one wake-up each way.
        // The caller's span (the operation's) follows the work onto the
        // runtime, so what the client logs there is attributed to it.
        let span = tracing::Span::current();
        self.handle.spawn(
            async move {
                let result = tokio::time::timeout(timeout, operation()).await;
                drop(slot);
                let _ = result_sender.send(result.ok());
            }
            .instrument(span),
        );
        // After the spawn: a lingering worker that sees this finds the task.
        self.gate.submitted.fetch_add(1, Ordering::Release);
        let started = Instant::now();
        let typical = Duration::from_nanos(self.gate.typical_ns.load(Ordering::Relaxed));
        let polled = (alone && typical <= SPIN)
            .then(|| poll_for(&result_receiver, SPIN))
            .flatten();
        let received = match polled {
            Some(received) => received,
            None => result_receiver.recv_timeout(timeout + GRACE),
        };
        self.note_duration(started.elapsed());
        match received {
            Ok(Some(value)) => Ok(value),
            Ok(None) | Err(RecvTimeoutError::Timeout) => Err(BusError::timeout(what, timeout)),
            Err(RecvTimeoutError::Disconnected) => Err(BusError::backend(
                "bus",
                format!(
                    "connector {:?} dropped {what} before it finished",
                    self.name
                ),
            )),
        }
    }

    /// Folds one operation's duration into the moving average (weight 1/8;
    /// concurrent updates may lose one, which only delays the average).
    fn note_duration(&self, took: Duration) {
        let sample = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let old = self.gate.typical_ns.load(Ordering::Relaxed);
        let new = old - old / 8 + sample / 8;
        self.gate.typical_ns.store(new, Ordering::Relaxed);
    }
}

/// Polls `receiver` for up to `budget`; `None` when nothing came (the
/// caller then blocks as usual).
fn poll_for<T>(receiver: &Receiver<T>, budget: Duration) -> Option<Result<T, RecvTimeoutError>> {
    let mut received = None;
    spin_until(budget, || {
        received = match receiver.try_recv() {
            Ok(value) => Some(Ok(value)),
            Err(TryRecvError::Disconnected) => Some(Err(RecvTimeoutError::Disconnected)),
            Err(TryRecvError::Empty) => None,
        };
        received.is_some()
    });
    received
}

/// Spins until `done` says so or `budget` has passed.
fn spin_until(budget: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    loop {
        // Reading the clock costs more than a look: read it every 64th.
        for _ in 0..64 {
            if done() {
                return;
            }
            std::hint::spin_loop();
        }
        if started.elapsed() >= budget {
            return;
        }
    }
}

/// `future` awaited on the caller's runtime, or [`BusError::Timeout`]
/// naming `what` after `timeout`: the bound of every async-surface
/// operation of the network backends.
pub async fn bounded<T>(
    what: &str,
    timeout: Duration,
    future: impl Future<Output = Result<T, BusError>>,
) -> Result<T, BusError> {
    tokio::time::timeout(timeout, future)
        .await
        .unwrap_or_else(|_| Err(BusError::timeout(what, timeout)))
}

impl Drop for ConnectorExecutor {
    fn drop(&mut self) {
        let shutdown = match self.shutdown.get_mut() {
            Ok(slot) => slot.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        drop(shutdown);
        let thread = match self.thread.get_mut() {
            Ok(slot) => slot.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(thread) = thread {
            // Dropping from the connector's own thread cannot join itself.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// Shares one executor between a backend's parts.
pub type SharedExecutor = Arc<ConnectorExecutor>;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// What a backend's client logs while it serves an operation carries
    /// the operation's span, though it runs on the connector's thread.
    #[test]
    fn the_callers_span_follows_the_work_onto_the_runtime() {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(std::io::sink)
            .finish();
        // The runtime thread sees only a global subscriber.
        let _ = tracing::subscriber::set_global_default(subscriber);
        let executor = ConnectorExecutor::new("span-test").unwrap();
        let span = tracing::info_span!("bus.test_operation", topic = "t");
        let seen = span.in_scope(|| {
            executor.run(|| async {
                let current = tracing::Span::current();
                current.metadata().map(|meta| meta.name())
            })
        });
        assert_eq!(seen.unwrap(), Some("bus.test_operation"));
        // Outside any span, the work runs in none.
        let seen = executor.run(|| async { tracing::Span::current().is_none() });
        assert!(seen.unwrap());
    }

    fn live_threads_named(prefix: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .map(|tasks| {
                tasks
                    .filter_map(Result::ok)
                    .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
                    .filter(|comm| comm.trim_end().starts_with(prefix))
                    .count()
            })
            .unwrap_or(0)
    }

    #[test]
    fn safe_inside_a_multi_thread_runtime() {
        let outer = tokio::runtime::Runtime::new().unwrap();
        outer.block_on(async {
            let connector = ConnectorExecutor::new("t-multi").unwrap();
            assert_eq!(connector.run(|| async { 41u64 }).unwrap(), 41);
            assert_eq!(connector.run(|| async { 42u64 }).unwrap(), 42);
        });
    }

    #[test]
    fn safe_inside_a_current_thread_runtime() {
        let outer = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        outer.block_on(async {
            let connector = ConnectorExecutor::new("t-current").unwrap();
            let slept = connector
                .run(|| async {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    7u8
                })
                .unwrap();
            assert_eq!(slept, 7);
        });
    }

    #[test]
    fn operations_overlap() {
        let connector = Arc::new(ConnectorExecutor::new("t-overlap").unwrap());
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        std::thread::scope(|scope| {
            let runs: Vec<_> = (1..=2u64)
                .map(|n| {
                    let connector = Arc::clone(&connector);
                    let barrier = Arc::clone(&barrier);
                    scope.spawn(move || {
                        connector
                            .run(move || async move {
                                barrier.wait().await;
                                n
                            })
                            .unwrap()
                    })
                })
                .collect();
            let sum: u64 = runs.into_iter().map(|run| run.join().unwrap()).sum();
            assert_eq!(sum, 3);
        });
    }

    #[test]
    fn a_stuck_operation_times_out() {
        let connector =
            ConnectorExecutor::with_timeout("t-timeout", Duration::from_millis(50)).unwrap();
        let started = std::time::Instant::now();
        let error = connector.run(std::future::pending::<()>).unwrap_err();
        assert!(
            matches!(error, BusError::Timeout { after_ms: 50, .. }),
            "{error:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        // The executor still serves after a timeout.
        assert_eq!(connector.run(|| async { 1 }).unwrap(), 1);
    }

    #[test]
    fn a_call_from_its_own_runtime_errors_instead_of_deadlocking() {
        let connector = Arc::new(ConnectorExecutor::new("t-reentry").unwrap());
        let inner = Arc::clone(&connector);
        let nested = connector
            .run(move || async move {
                let result = inner.run(|| async { 0 });
                drop(inner);
                result
            })
            .unwrap();
        assert!(
            matches!(nested, Err(BusError::BackendFailure { .. })),
            "{nested:?}"
        );
    }

    #[test]
    fn drop_joins_every_thread() {
        let connector = ConnectorExecutor::new("t-dropjoin").unwrap();
        connector
            .run(|| async { tokio::task::spawn_blocking(|| ()).await })
            .unwrap()
            .unwrap();
        assert!(live_threads_named("t-dropjoin") >= 2);
        drop(connector);
        // Tokio joins only the last blocking thread to exit; the others are
        // past their final step but may take a moment to leave the task list.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while live_threads_named("t-dropjoin") > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "threads outlived drop"
            );
            std::thread::park_timeout(Duration::from_millis(5));
        }
    }

    #[test]
    fn polling_answers_a_result_a_hang_up_or_nothing() {
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        sender.send(5u8).unwrap();
        assert_eq!(poll_for(&receiver, SPIN), Some(Ok(5)));
        let started = Instant::now();
        assert_eq!(poll_for(&receiver, Duration::from_millis(2)), None);
        assert!(started.elapsed() >= Duration::from_millis(2));
        drop(sender);
        assert_eq!(
            poll_for(&receiver, SPIN),
            Some(Err(RecvTimeoutError::Disconnected))
        );
    }

    #[test]
    fn short_operations_keep_the_average_low_and_long_ones_raise_it() {
        let connector = ConnectorExecutor::new("t-average").unwrap();
        for _ in 0..16 {
            connector.run(|| async {}).unwrap();
        }
        let short = connector.gate.typical_ns.load(Ordering::Relaxed);
        for _ in 0..16 {
            connector
                .run(|| tokio::time::sleep(Duration::from_millis(2)))
                .unwrap();
        }
        let long = connector.gate.typical_ns.load(Ordering::Relaxed);
        assert!(long > u64::try_from(SPIN.as_nanos()).unwrap(), "{long}");
        assert!(short < long, "{short} vs {long}");
    }

    /// Runs `linger` with a budget far past the test's deadline, calling
    /// `nudge` while it waits: returning within the deadline proves it did
    /// not spend its budget.
    fn lingers_until_deadline(gate: &Arc<Gate>, nudge: impl Fn(&Gate)) -> bool {
        let (done, finished) = std::sync::mpsc::channel();
        let watched = Arc::clone(gate);
        let worker = std::thread::spawn(move || {
            watched.linger(Duration::from_secs(600));
            let _ = done.send(());
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            nudge(gate);
            if finished.recv_timeout(Duration::from_millis(10)).is_ok() {
                worker.join().unwrap();
                return true;
            }
        }
        false
    }

    #[test]
    fn a_lingering_worker_returns_when_the_next_operation_is_submitted() {
        let gate = Arc::new(Gate::new());
        assert!(lingers_until_deadline(&gate, |gate| {
            gate.submitted.fetch_add(1, Ordering::Release);
        }));
    }

    #[test]
    fn the_worker_does_not_linger_while_an_operation_is_in_flight() {
        let gate = Arc::new(Gate::new());
        let (_slot, alone) = gate.enter();
        assert!(alone);
        assert!(lingers_until_deadline(&gate, |_| {}));
    }

    #[test]
    fn the_worker_does_not_linger_after_long_operations() {
        let gate = Arc::new(Gate::new());
        gate.typical_ns.store(
            u64::try_from(SPIN.as_nanos()).unwrap() * 2,
            Ordering::Relaxed,
        );
        assert!(lingers_until_deadline(&gate, |_| {}));
    }

    #[test]
    fn the_worker_lingers_once_per_operation() {
        let gate = Arc::new(Gate::new());
        gate.linger(Duration::from_millis(1));
        // No operation came since: parking again (a timer, a stream's
        // message) must not spin.
        assert!(lingers_until_deadline(&gate, |_| {}));
    }

    #[test]
    fn many_short_serial_operations_complete_with_the_worker_lingering() {
        // Every call finds the worker either lingering or asleep; none may
        // be lost between the two.
        let connector = ConnectorExecutor::new("t-linger").unwrap();
        for i in 0..20_000u64 {
            assert_eq!(connector.run(move || async move { i }).unwrap(), i);
        }
    }

    #[test]
    fn debug_shows_name_only() {
        let connector = ConnectorExecutor::new("t-debug").unwrap();
        assert!(format!("{connector:?}").contains("t-debug"));
    }
}
