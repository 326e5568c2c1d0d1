//! The filesystem's model, without FUSE: every inode has what the machine
//! shows (its page cache) and what the disk holds, and only an fsync moves
//! the one into the other.
//!
//! - A file's data and size become durable when that file is fsynced or
//!   fdatasynced (both do the same here: the size is needed to read data).
//! - A directory's entries (creates, renames, unlinks, links) become durable
//!   when that directory is fsynced. A file fsynced under a name that its
//!   directory never made durable is lost with its data, as an orphan inode
//!   is on a journalled filesystem after a crash.
//! - A power cut puts every inode back to its disk state and forgets the
//!   inodes that no durable entry reaches. A torn cut first writes back a
//!   seeded random subset of the unsynced pages, in random order.
//! - A failed fsync (`EIO`) marks the file's dirty pages clean without
//!   writing them, as Linux does after a writeback error: the page cache
//!   still shows them, a later fsync succeeds, and a power cut loses them.
//!   Software that retries the fsync and trusts it is caught.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::sync::Arc;
use std::time::SystemTime;

/// Page size of the model: what a torn cut keeps or drops as one piece.
pub const PAGE: u64 = 4096;

/// An errno, answered to the caller.
pub type Errno = i32;

/// The inode number of the root directory.
pub const ROOT: u64 = 1;

type Page = Arc<[u8]>;

/// A file's bytes: `size` and the pages written (a missing page reads as
/// zeros: sparse files and preallocation cost nothing).
#[derive(Debug, Clone, Default)]
pub struct Data {
    size: u64,
    pages: BTreeMap<u64, Page>,
}

impl Data {
    fn read(&self, offset: u64, len: u64) -> Vec<u8> {
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return Vec::new();
        }
        let mut out = vec![0u8; usize_of(end - offset)];
        let mut pos = offset;
        while pos < end {
            let page = pos / PAGE;
            let within = pos % PAGE;
            let take = (PAGE - within).min(end - pos);
            if let Some(bytes) = self.pages.get(&page) {
                let from = usize_of(within);
                let to = usize_of(pos - offset);
                out[to..to + usize_of(take)].copy_from_slice(&bytes[from..from + usize_of(take)]);
            }
            pos += take;
        }
        out
    }

    /// Writes `bytes` at `offset`; returns the pages touched.
    fn write(&mut self, offset: u64, bytes: &[u8]) -> Vec<u64> {
        let mut touched = Vec::new();
        let mut pos = offset;
        let mut rest = bytes;
        while !rest.is_empty() {
            let page = pos / PAGE;
            let within = usize_of(pos % PAGE);
            let take = (usize_of(PAGE) - within).min(rest.len());
            let entry = self
                .pages
                .entry(page)
                .or_insert_with(|| Arc::from(vec![0u8; usize_of(PAGE)]));
            let mut copy = entry.to_vec();
            copy[within..within + take].copy_from_slice(&rest[..take]);
            *entry = Arc::from(copy);
            touched.push(page);
            rest = &rest[take..];
            pos += take as u64;
        }
        self.size = self.size.max(pos);
        touched
    }

    /// Sets the size; pages past it are dropped and the tail of the last
    /// one zeroed, so growing again reads zeros.
    fn truncate(&mut self, size: u64) {
        if size < self.size {
            let keep = size.div_ceil(PAGE);
            self.pages.retain(|&page, _| page < keep);
            if !size.is_multiple_of(PAGE)
                && let Some(last) = self.pages.get_mut(&(size / PAGE))
            {
                let mut copy = last.to_vec();
                copy[usize_of(size % PAGE)..].fill(0);
                *last = Arc::from(copy);
            }
        }
        self.size = size;
    }
}

fn usize_of(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// What an inode is.
#[derive(Debug, Clone)]
pub enum Kind {
    /// A regular file: what the machine shows, what the disk holds, and the
    /// pages (and size) written since the last fsync.
    File {
        /// The page cache's view.
        cur: Data,
        /// The disk's.
        disk: Data,
        /// Pages written since the last fsync (or failed fsync).
        dirty: BTreeSet<u64>,
        /// The size changed since the last fsync.
        resized: bool,
    },
    /// A directory: entries shown and entries on disk.
    Dir {
        /// The page cache's view.
        cur: BTreeMap<OsString, u64>,
        /// The disk's.
        disk: BTreeMap<OsString, u64>,
    },
    /// A symbolic link (its target is durable with its name).
    Symlink(OsString),
}

/// One inode.
#[derive(Debug, Clone)]
pub struct Inode {
    /// File, directory or link.
    pub kind: Kind,
    /// Permission bits.
    pub mode: u32,
    /// Owner and group: passed through from the backing directory and set
    /// by the caller's `chown` or create, because servers check them
    /// (PostgreSQL refuses a data directory it does not own). Kept with
    /// the inode, like the mode.
    pub uid: u32,
    /// Group, as `uid`.
    pub gid: u32,
    /// Last modification (not part of what a cut keeps exactly).
    pub mtime: SystemTime,
}

/// Switchable faults.
#[derive(Debug, Default, Clone, Copy)]
pub struct Faults {
    /// The next fsync or fdatasync of a file fails with `EIO`.
    pub fail_next_fsync: bool,
    /// Writes, creates and growing a file fail with `ENOSPC`.
    pub disk_full: bool,
}

/// Counts of what a power cut dropped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CutReport {
    /// Dirty pages dropped.
    pub pages_lost: u64,
    /// Dirty pages a torn cut wrote back.
    pub pages_torn_in: u64,
    /// Inodes no durable entry reached any more.
    pub inodes_lost: u64,
}

/// The whole filesystem.
#[derive(Debug)]
pub struct State {
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    /// Bumped by every power cut: file handles of an older generation are
    /// stale (their process died with the power).
    pub generation: u64,
    /// Between a cut and the power coming back every operation fails.
    pub down: bool,
    /// Switchable faults.
    pub faults: Faults,
    /// Failed fsyncs answered so far.
    pub fsync_failures: u64,
    /// File fsyncs and fdatasyncs asked for so far (failed ones too).
    pub fsyncs: u64,
}

impl Default for State {
    fn default() -> Self {
        Self::new()
    }
}

impl State {
    /// An empty filesystem: a root directory, durable.
    pub fn new() -> Self {
        let root = Inode {
            kind: Kind::Dir {
                cur: BTreeMap::new(),
                disk: BTreeMap::new(),
            },
            mode: 0o755,
            uid: 0,
            gid: 0,
            mtime: SystemTime::now(),
        };
        Self {
            inodes: HashMap::from([(ROOT, root)]),
            next_ino: ROOT + 1,
            generation: 1,
            down: false,
            faults: Faults::default(),
            fsync_failures: 0,
            fsyncs: 0,
        }
    }

    /// The inode `ino`.
    pub fn get(&self, ino: u64) -> Result<&Inode, Errno> {
        self.inodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn get_mut(&mut self, ino: u64) -> Result<&mut Inode, Errno> {
        self.inodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn entries_mut(&mut self, dir: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        match &mut self.get_mut(dir)?.kind {
            Kind::Dir { cur, .. } => Ok(cur),
            _ => Err(libc::ENOTDIR),
        }
    }

    /// The entries `dir` shows.
    pub fn entries(&self, dir: u64) -> Result<&BTreeMap<OsString, u64>, Errno> {
        match &self.get(dir)?.kind {
            Kind::Dir { cur, .. } => Ok(cur),
            _ => Err(libc::ENOTDIR),
        }
    }

    /// The inode named `name` in `dir`.
    pub fn lookup(&self, dir: u64, name: &OsStr) -> Result<u64, Errno> {
        self.entries(dir)?.get(name).copied().ok_or(libc::ENOENT)
    }

    /// How many entries shown name `ino` (its link count).
    pub fn links(&self, ino: u64) -> u32 {
        let mut n = 0u32;
        for inode in self.inodes.values() {
            if let Kind::Dir { cur, .. } = &inode.kind {
                n += u32::try_from(cur.values().filter(|&&i| i == ino).count()).unwrap_or(0);
            }
        }
        n.max(1)
    }

    /// Creates `name` in `dir`: a file, a directory or a link.
    pub fn create(&mut self, dir: u64, name: &OsStr, kind: Kind, mode: u32) -> Result<u64, Errno> {
        if self.faults.disk_full {
            return Err(libc::ENOSPC);
        }
        if self.entries(dir)?.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let inode = Inode {
            kind,
            mode,
            uid: 0,
            gid: 0,
            mtime: SystemTime::now(),
        };
        self.inodes.insert(ino, inode);
        self.entries_mut(dir)?.insert(name.to_owned(), ino);
        Ok(ino)
    }

    /// A new, empty file's kind.
    pub fn new_file() -> Kind {
        Kind::File {
            cur: Data::default(),
            disk: Data::default(),
            dirty: BTreeSet::new(),
            resized: false,
        }
    }

    /// A new, empty directory's kind.
    pub fn new_dir() -> Kind {
        Kind::Dir {
            cur: BTreeMap::new(),
            disk: BTreeMap::new(),
        }
    }

    /// Adds a name for an existing inode.
    pub fn link(&mut self, ino: u64, dir: u64, name: &OsStr) -> Result<(), Errno> {
        self.get(ino)?;
        if self.entries(dir)?.contains_key(name) {
            return Err(libc::EEXIST);
        }
        self.entries_mut(dir)?.insert(name.to_owned(), ino);
        Ok(())
    }

    /// Removes a name (`dir_only`: rmdir, which wants an empty directory).
    pub fn unlink(&mut self, dir: u64, name: &OsStr, dir_only: bool) -> Result<(), Errno> {
        let ino = self.lookup(dir, name)?;
        match (&self.get(ino)?.kind, dir_only) {
            (Kind::Dir { cur, .. }, true) if !cur.is_empty() => return Err(libc::ENOTEMPTY),
            (Kind::Dir { .. }, true) => {}
            (Kind::Dir { .. }, false) => return Err(libc::EISDIR),
            (_, true) => return Err(libc::ENOTDIR),
            (_, false) => {}
        }
        self.entries_mut(dir)?.remove(name);
        Ok(())
    }

    /// Renames (replacing a target unless `no_replace`).
    pub fn rename(
        &mut self,
        dir: u64,
        name: &OsStr,
        to_dir: u64,
        to_name: &OsStr,
        no_replace: bool,
    ) -> Result<(), Errno> {
        let ino = self.lookup(dir, name)?;
        if let Ok(old) = self.lookup(to_dir, to_name) {
            if no_replace {
                return Err(libc::EEXIST);
            }
            if let Kind::Dir { cur, .. } = &self.get(old)?.kind
                && !cur.is_empty()
            {
                return Err(libc::ENOTEMPTY);
            }
        }
        self.entries_mut(dir)?.remove(name);
        self.entries_mut(to_dir)?.insert(to_name.to_owned(), ino);
        Ok(())
    }

    /// Reads from a file.
    pub fn read(&self, ino: u64, offset: u64, len: u64) -> Result<Vec<u8>, Errno> {
        match &self.get(ino)?.kind {
            Kind::File { cur, .. } => Ok(cur.read(offset, len)),
            Kind::Dir { .. } => Err(libc::EISDIR),
            Kind::Symlink(_) => Err(libc::EINVAL),
        }
    }

    /// Writes to a file's page cache.
    pub fn write(&mut self, ino: u64, offset: u64, bytes: &[u8]) -> Result<(), Errno> {
        if self.faults.disk_full {
            return Err(libc::ENOSPC);
        }
        let inode = self.get_mut(ino)?;
        inode.mtime = SystemTime::now();
        match &mut inode.kind {
            Kind::File {
                cur,
                dirty,
                resized,
                ..
            } => {
                let before = cur.size;
                dirty.extend(cur.write(offset, bytes));
                *resized |= cur.size != before;
                Ok(())
            }
            _ => Err(libc::EISDIR),
        }
    }

    /// Sets a file's size (truncate, or fallocate growing it).
    pub fn set_size(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
        let full = self.faults.disk_full;
        let inode = self.get_mut(ino)?;
        inode.mtime = SystemTime::now();
        match &mut inode.kind {
            Kind::File {
                cur,
                dirty,
                resized,
                ..
            } => {
                if full && size > cur.size {
                    return Err(libc::ENOSPC);
                }
                if size < cur.size {
                    // The zeroed tail of the last page is a change too.
                    dirty.insert(size / PAGE);
                }
                cur.truncate(size);
                *resized = true;
                Ok(())
            }
            _ => Err(libc::EISDIR),
        }
    }

    /// Changes the permission bits (kept with the inode, durable with it).
    pub fn set_mode(&mut self, ino: u64, mode: u32) -> Result<(), Errno> {
        self.get_mut(ino)?.mode = mode & 0o7777;
        Ok(())
    }

    /// Changes the owner and/or group (`chown`; kept with the inode, as
    /// the mode is).
    pub fn set_owner(&mut self, ino: u64, uid: Option<u32>, gid: Option<u32>) -> Result<(), Errno> {
        let inode = self.get_mut(ino)?;
        if let Some(uid) = uid {
            inode.uid = uid;
        }
        if let Some(gid) = gid {
            inode.gid = gid;
        }
        Ok(())
    }

    /// Puts `bytes` on the disk of file `ino` as if written and fsynced
    /// (the import of a backing directory).
    pub fn load(&mut self, ino: u64, bytes: &[u8]) -> Result<(), Errno> {
        self.write(ino, 0, bytes)?;
        self.fsync(ino)
    }

    /// The durable tree below `dir`: (relative path, inode) pairs, parents
    /// before children (the export to a backing directory).
    pub fn durable_tree(&self, dir: u64) -> Vec<(std::path::PathBuf, u64)> {
        let mut out = Vec::new();
        let mut stack = vec![(std::path::PathBuf::new(), dir)];
        while let Some((path, ino)) = stack.pop() {
            if let Some(Inode {
                kind: Kind::Dir { disk, .. },
                ..
            }) = self.inodes.get(&ino)
            {
                for (name, &child) in disk {
                    let child_path = path.join(name);
                    out.push((child_path.clone(), child));
                    stack.push((child_path, child));
                }
            }
        }
        out
    }

    /// A file's durable bytes.
    pub fn disk_bytes(&self, ino: u64) -> Option<Vec<u8>> {
        match &self.inodes.get(&ino)?.kind {
            Kind::File { disk, .. } => Some(disk.read(0, disk.size)),
            _ => None,
        }
    }

    /// The size a file shows.
    pub fn size(&self, ino: u64) -> u64 {
        match self.inodes.get(&ino).map(|i| &i.kind) {
            Some(Kind::File { cur, .. }) => cur.size,
            Some(Kind::Symlink(target)) => target.len() as u64,
            _ => 4096,
        }
    }

    /// fsync / fdatasync of a file: its data and size reach the disk, or,
    /// when a failure is armed, `EIO` and its dirty pages are forgotten
    /// (marked clean, never written).
    pub fn fsync(&mut self, ino: u64) -> Result<(), Errno> {
        self.fsyncs += 1;
        let fail = std::mem::take(&mut self.faults.fail_next_fsync);
        if fail {
            self.fsync_failures += 1;
        }
        match &mut self.get_mut(ino)?.kind {
            Kind::File {
                cur,
                disk,
                dirty,
                resized,
            } => {
                if fail {
                    dirty.clear();
                    *resized = false;
                    return Err(libc::EIO);
                }
                sync_pages(cur, disk, std::mem::take(dirty));
                // A size change a failed fsync covered is forgotten with
                // its pages.
                if std::mem::take(resized) {
                    disk.size = cur.size;
                }
                Ok(())
            }
            Kind::Dir { .. } => self.fsync_dir(ino),
            Kind::Symlink(_) => Ok(()),
        }
    }

    /// fsync of a directory: its entries as shown reach the disk.
    pub fn fsync_dir(&mut self, ino: u64) -> Result<(), Errno> {
        match &mut self.get_mut(ino)?.kind {
            Kind::Dir { cur, disk } => {
                disk.clone_from(cur);
                Ok(())
            }
            _ => Err(libc::ENOTDIR),
        }
    }

    /// The power goes: `torn` writes back a random subset of the unsynced
    /// pages (seeded by `seed`) first; then every inode shows what its disk
    /// holds, inodes no durable entry reaches are forgotten, and the
    /// filesystem stays down (every operation fails) until [`State::power_on`].
    pub fn power_cut(&mut self, torn: Option<u64>) -> CutReport {
        let mut report = CutReport::default();
        let mut rng = torn.map(fastrand::Rng::with_seed);
        let mut inos: Vec<u64> = self.inodes.keys().copied().collect();
        // HashMap order is random per process: sort so a seed replays.
        inos.sort_unstable();
        for ino in inos {
            let Some(inode) = self.inodes.get_mut(&ino) else {
                continue;
            };
            match &mut inode.kind {
                Kind::File {
                    cur,
                    disk,
                    dirty,
                    resized,
                } => {
                    if let Some(rng) = rng.as_mut() {
                        let mut pages: Vec<u64> = dirty.iter().copied().collect();
                        rng.shuffle(&mut pages);
                        // Torn: some pages reach the disk and some do not
                        // (a file with one dirty page keeps it or loses it).
                        let keep = match pages.len() {
                            0 => 0,
                            1 => rng.usize(0..=1),
                            n => rng.usize(1..n),
                        };
                        pages.truncate(keep);
                        for page in &pages {
                            dirty.remove(page);
                        }
                        report.pages_torn_in += keep as u64;
                        // A page written back carries the size up to its end
                        // (bounded by the size the cache showed).
                        if let Some(&last) = pages.iter().max() {
                            disk.size = disk.size.max(((last + 1) * PAGE).min(cur.size));
                        }
                        sync_pages(cur, disk, pages.into_iter().collect());
                    }
                    report.pages_lost += dirty.len() as u64;
                    *cur = disk.clone();
                    dirty.clear();
                    *resized = false;
                }
                Kind::Dir { cur, disk } => cur.clone_from(disk),
                Kind::Symlink(_) => {}
            }
        }
        // Whatever no durable entry reaches is gone.
        let mut reached = BTreeSet::from([ROOT]);
        let mut stack = vec![ROOT];
        while let Some(ino) = stack.pop() {
            if let Some(Inode {
                kind: Kind::Dir { disk, .. },
                ..
            }) = self.inodes.get(&ino)
            {
                for &child in disk.values() {
                    if reached.insert(child) {
                        stack.push(child);
                    }
                }
            }
        }
        let before = self.inodes.len();
        self.inodes.retain(|ino, _| reached.contains(ino));
        report.inodes_lost = (before - self.inodes.len()) as u64;
        self.generation += 1;
        self.down = true;
        report
    }

    /// The power comes back.
    pub fn power_on(&mut self) {
        self.down = false;
    }

    /// Unsynced pages, summed over files (what a cut now would drop).
    pub fn dirty_pages(&self) -> u64 {
        self.inodes
            .values()
            .map(|inode| match &inode.kind {
                Kind::File { dirty, .. } => dirty.len() as u64,
                _ => 0,
            })
            .sum()
    }
}

/// Copies `pages` of `cur` to `disk` (a page past `cur`'s end is dropped).
fn sync_pages(cur: &Data, disk: &mut Data, pages: BTreeSet<u64>) {
    for page in pages {
        match cur.pages.get(&page) {
            Some(bytes) => {
                disk.pages.insert(page, bytes.clone());
            }
            None => {
                disk.pages.remove(&page);
            }
        }
    }
    // Pages the cache truncated away are gone from the disk once synced.
    let keep = cur.size.div_ceil(PAGE);
    disk.pages.retain(|&page, _| page < keep);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn file(state: &mut State, name: &str) -> u64 {
        state
            .create(ROOT, OsStr::new(name), State::new_file(), 0o644)
            .unwrap()
    }

    #[test]
    fn unsynced_data_and_names_are_gone_after_a_cut() {
        let mut state = State::new();
        let kept = file(&mut state, "kept");
        state.write(kept, 0, b"durable").unwrap();
        state.fsync(kept).unwrap();
        state.fsync_dir(ROOT).unwrap();
        state.write(kept, 7, b" and not").unwrap();
        let lost = file(&mut state, "lost");
        state.write(lost, 0, b"x").unwrap();
        state.fsync(lost).unwrap();
        let report = state.power_cut(None);
        state.power_on();
        assert_eq!(state.read(kept, 0, 100).unwrap(), b"durable");
        assert_eq!(state.lookup(ROOT, OsStr::new("lost")), Err(libc::ENOENT));
        assert_eq!(report.inodes_lost, 1);
    }

    #[test]
    fn a_torn_cut_keeps_some_pages_and_replays_by_seed() {
        let run = |seed| {
            let mut state = State::new();
            let ino = file(&mut state, "f");
            state.fsync_dir(ROOT).unwrap();
            for page in 0..64u64 {
                state.write(ino, page * PAGE, &[1u8; 4096]).unwrap();
            }
            let report = state.power_cut(Some(seed));
            state.power_on();
            let bytes = state.read(ino, 0, 64 * PAGE).unwrap();
            (report, bytes)
        };
        let (first, bytes) = run(7);
        assert_eq!(run(7).1, bytes);
        assert!(
            first.pages_torn_in > 0 && first.pages_torn_in < 64,
            "{first:?}"
        );
    }

    #[test]
    fn a_failed_fsync_forgets_the_pages_it_covered() {
        let mut state = State::new();
        let ino = file(&mut state, "f");
        state.fsync_dir(ROOT).unwrap();
        state.write(ino, 0, b"abc").unwrap();
        state.faults.fail_next_fsync = true;
        assert_eq!(state.fsync(ino), Err(libc::EIO));
        // The retry succeeds and is a lie.
        assert_eq!(state.fsync(ino), Ok(()));
        assert_eq!(state.read(ino, 0, 3).unwrap(), b"abc");
        state.power_cut(None);
        state.power_on();
        assert_eq!(state.read(ino, 0, 3).unwrap(), b"");
    }
}
