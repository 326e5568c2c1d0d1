//! Wake-ups of a read-only open's subscription: inotify (through `notify`)
//! on the topic's partition directories rings the subscription's bell when
//! the writer, in another process, stores a new acked end, creates or
//! deletes a segment. No polling: an idle subscription's thread sleeps in
//! the kernel.

use std::path::PathBuf;
use std::sync::Arc;

use bus_core::{BusError, Doorbell};
use notify::event::{EventKind, ModifyKind};
use notify::{Event, RecommendedWatcher, RecursiveMode, Watcher};

use crate::acked;

/// A watch of some partition directories; dropping it stops its thread.
pub(crate) struct Watch {
    _watcher: RecommendedWatcher,
}

impl Watch {
    /// Rings `bell` on every change a reader of `dirs` may care about.
    pub(crate) fn start(dirs: Vec<PathBuf>, bell: Arc<Doorbell>) -> Result<Self, BusError> {
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<Event>| {
            // An error (a queue overflow) may hide a change: read again.
            if event.as_ref().map_or(true, worth_a_read) {
                bell.ring();
            }
        })
        .map_err(watch_error)?;
        for dir in &dirs {
            watcher
                .watch(dir, RecursiveMode::NonRecursive)
                .map_err(watch_error)?;
        }
        Ok(Self { _watcher: watcher })
    }
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
