//! Wake-ups of a read-only open's subscriptions: inotify (through `notify`)
//! on the partition directories of the topics subscribed to rings the
//! topic's bells when the writer, in another process, stores a new acked
//! end, creates or deletes a segment. No polling: the watcher's thread
//! sleeps in the kernel.
//!
//! One watcher (one thread, one inotify instance) per open bus, made when
//! its first subscription starts and kept until the bus drops: a user's
//! inotify instances are few (128 by default, shared by every process), so
//! one per subscription ran out at the 128th. A topic's directories are
//! watched while it has subscriptions; the last one's drop removes the
//! watches before it returns.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use bus_core::BusError;
use bus_core::backend::sync::{lock, read, write};
use notify::event::{EventKind, ModifyKind};
use notify::{Event, RecommendedWatcher, RecursiveMode, Watcher};

use crate::notifier::Notifier;
use crate::partition::acked;

/// The watcher of one read-only open, shared by its subscriptions.
pub(crate) struct Watches {
    notifier: Arc<Notifier>,
    /// Partition directory → topic, read by the watcher's thread to know
    /// which topic's bells an event rings.
    dirs: Arc<RwLock<HashMap<PathBuf, String>>>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    watcher: Option<RecommendedWatcher>,
    /// Subscriptions and watched directories, by topic.
    topics: HashMap<String, (usize, Vec<PathBuf>)>,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches").finish_non_exhaustive()
    }
}

impl Watches {
    /// Watches that ring the bells of `notifier`.
    pub(crate) fn new(notifier: Arc<Notifier>) -> Self {
        Self {
            notifier,
            dirs: Arc::default(),
            state: Mutex::default(),
        }
    }

    /// A subscription of `topic`, whose partitions are in `dirs`, starts:
    /// the directories are watched from now on (the first one of the topic
    /// adds the watches).
    pub(crate) fn acquire(&self, topic: &str, dirs: &[PathBuf]) -> Result<(), BusError> {
        let mut state = lock(&self.state);
        if let Some((count, _)) = state.topics.get_mut(topic) {
            *count += 1;
            return Ok(());
        }
        if state.watcher.is_none() {
            state.watcher = Some(self.start()?);
        }
        let Some(watcher) = state.watcher.as_mut() else {
            return Err(BusError::backend("embedded", "no watcher"));
        };
        for (done, dir) in dirs.iter().enumerate() {
            if let Err(error) = watcher.watch(dir, RecursiveMode::NonRecursive) {
                for dir in &dirs[..done] {
                    let _ = watcher.unwatch(dir);
                }
                return Err(watch_error(error));
            }
        }
        let mut map = write(&self.dirs);
        for dir in dirs {
            map.insert(dir.clone(), topic.to_owned());
        }
        drop(map);
        state.topics.insert(topic.to_owned(), (1, dirs.to_vec()));
        Ok(())
    }

    /// A subscription of `topic` ended: the last one's directories are no
    /// longer watched once this returns.
    pub(crate) fn release(&self, topic: &str) {
        let mut state = lock(&self.state);
        let Some((count, _)) = state.topics.get_mut(topic) else {
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        let Some((_, dirs)) = state.topics.remove(topic) else {
            return;
        };
        let mut map = write(&self.dirs);
        for dir in &dirs {
            map.remove(dir);
        }
        drop(map);
        if let Some(watcher) = state.watcher.as_mut() {
            for dir in &dirs {
                // A directory deleted behind the bus is no longer watched.
                let _ = watcher.unwatch(dir);
            }
        }
    }

    fn start(&self) -> Result<RecommendedWatcher, BusError> {
        let notifier = Arc::clone(&self.notifier);
        let dirs = Arc::clone(&self.dirs);
        notify::recommended_watcher(move |event: notify::Result<Event>| match event {
            Ok(event) if worth_a_read(&event) => {
                let dirs = read(&dirs);
                let mut rung: Vec<&str> = Vec::new();
                for path in &event.paths {
                    if let Some(topic) = topic_of(&dirs, path)
                        && !rung.contains(&topic)
                    {
                        notifier.ring(topic);
                        rung.push(topic);
                    }
                }
            }
            Ok(_) => {}
            // An error (a queue overflow) may hide a change: read again.
            Err(_) => notifier.ring_all(),
        })
        .map_err(watch_error)
    }
}

/// The topic a path of an event belongs to: a file in a watched partition
/// directory, or that directory itself.
fn topic_of<'a>(dirs: &'a HashMap<PathBuf, String>, path: &Path) -> Option<&'a str> {
    path.parent()
        .and_then(|dir| dirs.get(dir))
        .or_else(|| dirs.get(path))
        .map(String::as_str)
}

/// Whether `event` can reveal a record: the acked end moved, or a segment
/// came or went. Segment writes are not enough (the writer has not acked
/// them yet), and reads and opens (the reader's own) are not.
fn worth_a_read(event: &Event) -> bool {
    let marker = event
        .paths
        .iter()
        .any(|path| path.file_name().is_some_and(|name| name == acked::FILE));
    match event.kind {
        EventKind::Access(_) => false,
        EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Any | ModifyKind::Other) => marker,
        EventKind::Modify(ModifyKind::Metadata(_)) => false,
        _ => true,
    }
}

fn watch_error(error: notify::Error) -> BusError {
    match error.kind {
        notify::ErrorKind::Io(io) => BusError::Io(io),
        _ => BusError::backend_caused(
            "embedded",
            format!("watching the data directory: {error}"),
            error,
        ),
    }
}
