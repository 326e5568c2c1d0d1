//! Small file-system helpers: private permissions, directory fsync and
//! atomic replacement.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// Creates `dir` (and parents) with mode 0700, durably: a new directory's
/// name is on disk only once its parent is fsynced, and a power loss before
/// that takes the directory and everything fsynced inside it (found by the
/// power-cut tests, #29: a fresh data directory vanished).
pub(crate) fn create_dir(dir: &Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(path) = at.filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
        missing.push(path);
        at = path.parent();
    }
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    for created in missing.iter().rev() {
        let parent = created
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| Path::new("."));
        sync_dir(parent)?;
    }
    Ok(())
}

/// Whether no writer holds the bus lock file `lock` (`LOCK` in the data
/// directory): probed with a shared lock taken and dropped at once (a
/// writer opening meanwhile retries its lock for longer than that). A
/// missing lock file means no writer ever opened the directory. Errors
/// answer `false`: the reader then trusts the writer's marker, as before.
pub(crate) fn writer_absent(lock: &Path) -> bool {
    match File::open(lock) {
        Ok(file) => match file.try_lock_shared() {
            Ok(()) => file.unlock().is_ok(),
            Err(_) => false,
        },
        Err(error) => error.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Opens (creating if needed) a read-write file with mode 0600.
pub(crate) fn open_rw(path: &Path, create_new: bool) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).mode(0o600);
    if create_new {
        options.create_new(true);
    } else {
        options.create(true);
    }
    options.open(path)
}

/// Fsyncs a directory so entries created, renamed or deleted in it persist.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Replaces `path` with `bytes` atomically: temp file, fsync, rename, dir fsync.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_data()?;
    }
    std::fs::rename(&tmp, path)?;
    sync_dir(dir)
}
