//! Why a partition refuses writes until the bus is reopened.

use std::io;
use std::sync::Arc;

use bus_core::BusError;

/// The failure that poisoned a partition: what failed, and the OS error
/// when there is one (kept so callers can tell a full disk from a failing
/// device, and reach the error through `source()`).
#[derive(Clone, Debug)]
pub(crate) struct Poison {
    cause: String,
    error: Option<Arc<io::Error>>,
}

impl Poison {
    /// `what` (`write`, `fsync`, ...) failed with `error`.
    pub(crate) fn io(what: &str, error: io::Error) -> Self {
        Self {
            cause: format!("{what}: {error}"),
            error: Some(Arc::new(error)),
        }
    }

    /// `what` failed with a bus error (an I/O one keeps its OS error).
    pub(crate) fn bus(what: &str, error: BusError) -> Self {
        match error {
            BusError::Io(error) => Self::io(what, error),
            other => Self::note(format!("{what}: {other}")),
        }
    }

    /// A failure with no OS error behind it.
    pub(crate) fn note(cause: impl Into<String>) -> Self {
        Self {
            cause: cause.into(),
            error: None,
        }
    }

    /// The error a refused call on `topic`/`partition` reports.
    pub(crate) fn error(&self, topic: &str, partition: u32) -> BusError {
        BusError::Poisoned {
            topic: topic.to_owned(),
            partition,
            cause: self.cause.clone(),
            disk_full: self.error.as_deref().is_some_and(is_disk_full),
            source: self.error.as_deref().map(copy),
        }
    }
}

impl std::fmt::Display for Poison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.cause)
    }
}

/// The same OS error again (`io::Error` is not `Clone`).
fn copy(error: &io::Error) -> io::Error {
    match error.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(error.kind(), error.to_string()),
    }
}

/// Out of space or over a quota: freeing space is the fix.
fn is_disk_full(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_told_from_an_io_failure() {
        use std::error::Error as _;
        let full = Poison::io("fsync", io::Error::from_raw_os_error(28)).error("t", 0);
        let eio = Poison::io("write", io::Error::from_raw_os_error(5)).error("t", 1);
        let quota = Poison::io("write", io::Error::from_raw_os_error(122)).error("t", 2);
        let note = Poison::note("the writer panicked").error("t", 3);
        for (error, full_disk) in [(&full, true), (&eio, false), (&quota, true), (&note, false)] {
            let BusError::Poisoned { disk_full, .. } = error else {
                panic!("not Poisoned: {error:?}");
            };
            assert_eq!(*disk_full, full_disk, "{error}");
        }
        assert!(full.to_string().contains("the disk is full"), "{full}");
        assert!(!eio.to_string().contains("disk is full"), "{eio}");
        assert_eq!(
            eio.source().map(ToString::to_string),
            Some(io::Error::from_raw_os_error(5).to_string())
        );
        assert!(note.source().is_none());
    }
}
