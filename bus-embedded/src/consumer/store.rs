//! The embedded log's cursor store (C20, C23): one small JSON file per
//! consumer beside its topic, replaced atomically (temporary file, fsync,
//! rename, directory fsync); ownership by an OS file lock per owner.
//!
//! ```text
//! DIR/topics/<topic>/consumers/<name>.cursor        {"name", "state"}: the cursor and its owner's id
//! DIR/topics/<topic>/consumers/<name>.guard         flock held only while a cursor is read, checked and replaced
//! DIR/topics/<topic>/consumers/<name>.<id>.owner    flock held by the live owner with that id
//! ```
//!
//! An owner is alive while its `.owner` file is locked: a process killed
//! with kill -9 loses its lock with its file descriptors, so the next
//! `consume` sees it gone. A takeover writes its own id into the cursor
//! while the old owner still holds its lock; every write compares the id
//! under the guard lock, so the old owner's next write is refused
//! (`Fenced`). The guard makes read-compare-replace one step across
//! processes, including read-only opens of the same directory.

use std::fs::{File, TryLockError};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bus_core::BusError;
use bus_core::consumer::{
    CursorState, CursorStore, OwnerPolicy, OwnerToken, StoredSelector, check_owner, fenced_error,
};

use crate::fsutil;
use crate::topics::dir_name;

/// How often a `Wait` owner policy looks again (the owner's lock is held
/// by another process, so there is nothing to be woken by).
const WAIT_POLL: Duration = Duration::from_millis(20);

/// Cursor files under a bus's topics directory.
#[derive(Debug)]
pub(crate) struct FileCursorStore {
    topics_dir: PathBuf,
}

/// A cursor file's content: `{"name": ..., "state": ...}` (the name in
/// full, as the file name encodes it).
struct CursorFile {
    name: String,
    state: CursorState,
}

impl CursorFile {
    fn decode(path: &Path, bytes: &[u8]) -> Result<Self, BusError> {
        let corrupt = |reason: String| BusError::Corrupt {
            location: path.display().to_string(),
            offset: 0,
            reason: format!("consumer cursor is not readable: {reason}"),
        };
        let mut value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|error| corrupt(error.to_string()))?;
        let name = value
            .get("name")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| corrupt("no name".to_owned()))?
            .to_owned();
        let state = serde_json::from_value(value["state"].take())
            .map_err(|error| corrupt(error.to_string()))?;
        Ok(Self { name, state })
    }
}

/// An owner's lock file: unlinked, then unlocked, when the owner goes.
struct OwnerHold {
    path: PathBuf,
    _file: File,
}

impl Drop for OwnerHold {
    fn drop(&mut self) {
        // Unlink first: whoever opens the path before the unlock sees it
        // locked (alive), whoever opens it after finds nothing (gone).
        let _ = std::fs::remove_file(&self.path);
    }
}

fn random_id() -> Result<u64, BusError> {
    let mut bytes = [0u8; 8];
    File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

impl FileCursorStore {
    pub(crate) fn new(topics_dir: PathBuf) -> Self {
        Self { topics_dir }
    }

    fn dir(&self, topic: &str) -> PathBuf {
        self.topics_dir.join(dir_name(topic)).join("consumers")
    }

    fn cursor_path(dir: &Path, name: &str) -> PathBuf {
        dir.join(format!("{}.cursor", dir_name(name)))
    }

    fn owner_path(dir: &Path, name: &str, id: u64) -> PathBuf {
        dir.join(format!("{}.{id:016x}.owner", dir_name(name)))
    }

    /// Takes the guard lock of one consumer (blocking: it is held only for
    /// a read and one atomic replace).
    fn guard(&self, topic: &str, name: &str) -> Result<(PathBuf, File), BusError> {
        let dir = self.dir(topic);
        if !dir.is_dir() {
            fsutil::create_dir(&dir)?;
            if let Some(parent) = dir.parent() {
                fsutil::sync_dir(parent)?;
            }
        }
        let file = fsutil::open_rw(&dir.join(format!("{}.guard", dir_name(name))), false)?;
        file.lock()?;
        Ok((dir, file))
    }

    fn read(dir: &Path, name: &str) -> Result<Option<CursorState>, BusError> {
        let path = Self::cursor_path(dir, name);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(CursorFile::decode(&path, &bytes)?.state)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    fn write(dir: &Path, name: &str, state: &CursorState) -> Result<(), BusError> {
        let bytes = serde_json::to_vec(&serde_json::json!({"name": name, "state": state}))?;
        fsutil::write_atomic(&Self::cursor_path(dir, name), &bytes)?;
        Ok(())
    }

    /// Whether the owner with `id` still holds its lock; a stale lock file
    /// (its process died) is removed.
    fn alive(dir: &Path, name: &str, id: u64) -> Result<bool, BusError> {
        let path = Self::owner_path(dir, name, id);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(error) => return Err(error.into()),
        };
        match file.try_lock() {
            Ok(()) => {
                let _ = std::fs::remove_file(&path);
                Ok(false)
            }
            Err(TryLockError::WouldBlock) => Ok(true),
            Err(TryLockError::Error(error)) => Err(error.into()),
        }
    }
}

impl CursorStore for FileCursorStore {
    fn acquire(
        &self,
        topic: &str,
        name: &str,
        policy: OwnerPolicy,
        selector: &StoredSelector,
    ) -> Result<(OwnerToken, CursorState), BusError> {
        let started = Instant::now();
        loop {
            let (dir, guard) = self.guard(topic, name)?;
            let stored = Self::read(&dir, name)?;
            let owner = stored.as_ref().and_then(|state| state.owner);
            let owned = match owner {
                Some(id) => Self::alive(&dir, name, id)?,
                None => false,
            };
            if owned {
                match policy {
                    OwnerPolicy::TakeOver => {}
                    OwnerPolicy::Fail => {
                        return Err(BusError::ConsumerBusy {
                            topic: topic.to_owned(),
                            consumer: name.to_owned(),
                        });
                    }
                    OwnerPolicy::Wait(wait) => {
                        drop(guard);
                        if started.elapsed() >= wait {
                            return Err(BusError::timeout(
                                format!(
                                    "waiting for consumer {name:?} of topic {topic:?} to be released"
                                ),
                                wait,
                            ));
                        }
                        std::thread::sleep(WAIT_POLL);
                        continue;
                    }
                }
            }
            let id = random_id()?;
            let path = Self::owner_path(&dir, name, id);
            let file = fsutil::open_rw(&path, true)?;
            file.try_lock().map_err(|error| match error {
                TryLockError::WouldBlock => BusError::backend(
                    "embedded",
                    format!("new owner lock {} is held by someone else", path.display()),
                ),
                TryLockError::Error(error) => error.into(),
            })?;
            let hold = OwnerHold { path, _file: file };
            let mut state = stored.unwrap_or_else(|| CursorState {
                selector: selector.clone(),
                partitions: Default::default(),
                owner: None,
            });
            state.owner = Some(id);
            Self::write(&dir, name, &state)?;
            drop(guard);
            return Ok((
                OwnerToken {
                    id,
                    hold: Some(Box::new(hold)),
                },
                state,
            ));
        }
    }

    fn store(
        &self,
        topic: &str,
        name: &str,
        token: &OwnerToken,
        state: &CursorState,
    ) -> Result<(), BusError> {
        let (dir, _guard) = self.guard(topic, name)?;
        let current = Self::read(&dir, name)?;
        check_owner(current.as_ref(), token).map_err(|why| fenced_error(topic, name, why))?;
        let mut state = state.clone();
        state.owner = Some(token.id);
        Self::write(&dir, name, &state)
    }

    fn release(&self, _topic: &str, _name: &str, token: OwnerToken) {
        // Dropping the hold unlinks and unlocks the owner file; the cursor
        // keeps the id, which no live lock backs any more.
        drop(token);
    }

    fn list(&self, topic: &str) -> Result<Vec<(String, CursorState)>, BusError> {
        let dir = self.dir(topic);
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(error.into()),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry?.path();
            if path.extension().is_none_or(|ext| ext != "cursor") {
                continue;
            }
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                // Deleted meanwhile.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => return Err(error.into()),
            };
            let file = CursorFile::decode(&path, &bytes)?;
            out.push((file.name, file.state));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    fn load(&self, topic: &str, name: &str) -> Result<Option<CursorState>, BusError> {
        Self::read(&self.dir(topic), name)
    }

    fn replace(
        &self,
        topic: &str,
        name: &str,
        state: Option<&CursorState>,
    ) -> Result<bool, BusError> {
        let (dir, _guard) = self.guard(topic, name)?;
        let existed = Self::read(&dir, name)?.is_some();
        match state {
            Some(state) => {
                let mut state = state.clone();
                state.owner = None;
                Self::write(&dir, name, &state)?;
            }
            None if existed => {
                std::fs::remove_file(Self::cursor_path(&dir, name))?;
                fsutil::sync_dir(&dir)?;
            }
            None => {}
        }
        Ok(existed)
    }
}
