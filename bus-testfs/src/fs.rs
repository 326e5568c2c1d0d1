//! The FUSE side: each request is one step of the model under its lock.
//!
//! Nothing may be cached by the kernel, or a power cut would not be seen:
//! entries and attributes are answered with a zero TTL and files are opened
//! with `FOPEN_DIRECT_IO`, so every read, write and lookup reaches the
//! model. (Direct I/O forbids shared writable `mmap`; the bus does not map
//! its files.) Locks are left to the kernel (no lock capability is
//! negotiated), which keeps `flock` working between processes.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};

use crate::state::{self, Kind, State};

const TTL: Duration = Duration::ZERO;

/// The filesystem served over FUSE; the model is shared with the
/// [`crate::PowerFs`] that controls it.
pub(crate) struct Fs {
    pub(crate) state: Arc<Mutex<State>>,
    next_fh: std::sync::atomic::AtomicU64,
}

impl Fs {
    pub(crate) fn new(state: Arc<Mutex<State>>) -> Self {
        Self {
            state,
            next_fh: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// The model, unless the power is off.
    fn up(&self) -> Result<MutexGuard<'_, State>, state::Errno> {
        let state = lock(&self.state);
        if state.down {
            return Err(libc::EIO);
        }
        Ok(state)
    }

    /// A handle carries the power generation it was opened in: after a cut
    /// the processes that held it are gone with the machine.
    fn handle(&self, state: &State) -> FileHandle {
        let n = self
            .next_fh
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        FileHandle((state.generation << 40) | (n & ((1 << 40) - 1)))
    }

    fn live(&self, fh: FileHandle) -> Result<MutexGuard<'_, State>, state::Errno> {
        let state = self.up()?;
        if fh.0 >> 40 != state.generation {
            return Err(libc::EIO);
        }
        Ok(state)
    }
}

/// Locks the model; a panic elsewhere does not stop the filesystem.
pub(crate) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn errno(code: state::Errno) -> fuser::Errno {
    fuser::Errno::from_i32(code)
}

fn attr(state: &State, ino: u64) -> Result<FileAttr, state::Errno> {
    let inode = state.get(ino)?;
    let kind = match inode.kind {
        Kind::File { .. } => FileType::RegularFile,
        Kind::Dir { .. } => FileType::Directory,
        Kind::Symlink(_) => FileType::Symlink,
    };
    let size = state.size(ino);
    Ok(FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: inode.mtime,
        mtime: inode.mtime,
        ctime: inode.mtime,
        crtime: UNIX_EPOCH,
        kind,
        perm: u16::try_from(inode.mode & 0o7777).unwrap_or(0o644),
        nlink: state.links(ino),
        uid: inode.uid,
        gid: inode.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    })
}

fn entry(reply: ReplyEntry, result: Result<(MutexGuard<'_, State>, u64), state::Errno>) {
    match result.and_then(|(state, ino)| attr(&state, ino)) {
        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
        Err(code) => reply.error(errno(code)),
    }
}

fn empty(reply: ReplyEmpty, result: Result<(), state::Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(code) => reply.error(errno(code)),
    }
}

impl Filesystem for Fs {
    /// Shared mmap of the direct-I/O files, where the kernel offers it
    /// (Linux 6.6+): Kafka maps its index files and cannot start without.
    /// Pages written through a map reach this filesystem as writes when
    /// the kernel writes them back (msync, fsync, writeback); until then
    /// they are the kernel's, and a cut here does not drop them: the one
    /// place this filesystem is more lenient than a machine losing power.
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(
            reply,
            self.up().and_then(|state| {
                let ino = state.lookup(parent.0, name)?;
                Ok((state, ino))
            }),
        );
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.up().and_then(|state| attr(&state, ino.0)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = self.up().and_then(|mut state| {
            if let Some(size) = size {
                state.set_size(ino.0, size)?;
            }
            if let Some(mode) = mode {
                state.set_mode(ino.0, mode)?;
            }
            if uid.is_some() || gid.is_some() {
                state.set_owner(ino.0, uid, gid)?;
            }
            attr(&state, ino.0)
        });
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let result = self.up().and_then(|state| match &state.get(ino.0)?.kind {
            Kind::Symlink(target) => Ok(target.clone()),
            _ => Err(libc::EINVAL),
        });
        match result {
            Ok(target) => reply.data(std::os::unix::ffi::OsStrExt::as_bytes(target.as_os_str())),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            reply.error(fuser::Errno::EPERM);
            return;
        }
        entry(
            reply,
            self.up().and_then(|mut state| {
                let ino = state.create(parent.0, name, State::new_file(), mode & !umask)?;
                state.set_owner(ino, Some(req.uid()), Some(req.gid()))?;
                Ok((state, ino))
            }),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        entry(
            reply,
            self.up().and_then(|mut state| {
                let ino = state.create(parent.0, name, State::new_dir(), mode & !umask)?;
                state.set_owner(ino, Some(req.uid()), Some(req.gid()))?;
                Ok((state, ino))
            }),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(
            reply,
            self.up()
                .and_then(|mut state| state.unlink(parent.0, name, false)),
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(
            reply,
            self.up()
                .and_then(|mut state| state.unlink(parent.0, name, true)),
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        entry(
            reply,
            self.up().and_then(|mut state| {
                let kind = Kind::Symlink(target.as_os_str().to_owned());
                let ino = state.create(parent.0, link_name, kind, 0o777)?;
                state.set_owner(ino, Some(req.uid()), Some(req.gid()))?;
                Ok((state, ino))
            }),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            reply.error(fuser::Errno::EINVAL);
            return;
        }
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        empty(
            reply,
            self.up().and_then(|mut state| {
                state.rename(parent.0, name, newparent.0, newname, no_replace)
            }),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        entry(
            reply,
            self.up().and_then(|mut state| {
                state.link(ino.0, newparent.0, newname)?;
                Ok((state, ino.0))
            }),
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.up().and_then(|state| {
            state.get(ino.0)?;
            Ok(self.handle(&state))
        }) {
            Ok(fh) => reply.opened(fh, FopenFlags::FOPEN_DIRECT_IO),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        match self
            .live(fh)
            .and_then(|state| state.read(ino.0, offset, u64::from(size)))
        {
            Ok(bytes) => reply.data(&bytes),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        match self
            .live(fh)
            .and_then(|mut state| state.write(ino.0, offset, data))
        {
            Ok(()) => reply.written(u32::try_from(data.len()).unwrap_or(u32::MAX)),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() is not a sync: nothing to do.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(
            reply,
            self.live(fh).and_then(|mut state| state.fsync(ino.0)),
        );
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.up().and_then(|state| {
            state.entries(ino.0)?;
            Ok(self.handle(&state))
        }) {
            Ok(fh) => reply.opened(fh, FopenFlags::empty()),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listing = self.up().and_then(|state| {
            let mut all = vec![
                (ino.0, FileType::Directory, OsStr::new(".").to_owned()),
                (ino.0, FileType::Directory, OsStr::new("..").to_owned()),
            ];
            for (name, &child) in state.entries(ino.0)? {
                let kind = match state.get(child).map(|i| &i.kind) {
                    Ok(Kind::Dir { .. }) => FileType::Directory,
                    Ok(Kind::Symlink(_)) => FileType::Symlink,
                    _ => FileType::RegularFile,
                };
                all.push((child, kind, name.clone()));
            }
            Ok(all)
        });
        match listing {
            Ok(all) => {
                let skip = usize::try_from(offset).unwrap_or(usize::MAX);
                for (i, (child, kind, name)) in all.into_iter().enumerate().skip(skip) {
                    if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(code) => reply.error(errno(code)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(
            reply,
            self.up().and_then(|mut state| state.fsync_dir(ino.0)),
        );
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let full = lock(&self.state).faults.disk_full;
        let free = if full { 0 } else { 1 << 24 };
        reply.statfs(1 << 24, free, free, 1 << 20, 1 << 20, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let result = self.up().and_then(|mut state| {
            let ino = state.create(parent.0, name, State::new_file(), mode & !umask)?;
            state.set_owner(ino, Some(req.uid()), Some(req.gid()))?;
            Ok((attr(&state, ino)?, self.handle(&state)))
        });
        match result {
            Ok((attr, fh)) => {
                reply.created(&TTL, &attr, Generation(0), fh, FopenFlags::FOPEN_DIRECT_IO);
            }
            Err(code) => reply.error(errno(code)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // Plain allocation only: grows the size (sparse: nothing is stored).
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            reply.error(fuser::Errno::from_i32(libc::EOPNOTSUPP));
            return;
        }
        let result = self.live(fh).and_then(|mut state| {
            if state.faults.disk_full {
                return Err(libc::ENOSPC);
            }
            let end = offset.saturating_add(length);
            if mode & libc::FALLOC_FL_KEEP_SIZE == 0 && end > state.size(ino.0) {
                state.set_size(ino.0, end)?;
            }
            Ok(())
        });
        empty(reply, result);
    }
}
