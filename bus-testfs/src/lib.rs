//! A FUSE test filesystem that forgets what was not fsynced (issue #29);
//! README.md has the control calls and the commands of the tests using it.
//!
//! [`PowerFs::mount`] mounts it over a real backing directory: the
//! directory's contents are the disk when the mount starts, and the disk as
//! it stands is written back to it when the mount ends. In between, reads
//! and writes go to an in-memory page cache per file; only `fsync` or
//! `fdatasync` of a file puts its pages on the disk, and only `fsync` of a
//! directory puts its creates, renames and unlinks there (see
//! [`state`] for the exact model). The test that owns the mount is the
//! control:
//!
//! - [`PowerFs::power_cut`] drops everything not synced and keeps the
//!   filesystem down (every operation `EIO`) until [`PowerFs::power_on`]:
//!   the processes of the old boot must be killed or their handles
//!   dropped in between (their file handles stay dead after power-on);
//!   [`PowerFs::power_cut_torn`] first writes back a seeded random subset
//!   of the unsynced pages, in random order, as Jepsen's LazyFS does;
//! - [`PowerFs::fail_next_fsync`] answers the next file fsync with `EIO`
//!   and forgets the pages it covered, as Linux does;
//! - [`PowerFs::set_disk_full`] answers writes, creates and growth with
//!   `ENOSPC`.
//!
//! The mount ends when the [`PowerFs`] is dropped (also while a test
//! unwinds from a panic), and a watchdog process detaches it if the test
//! process dies without unwinding. It needs `/dev/fuse` and root (the
//! kernel mounts it directly; CI installs Debian's `fuse3` for its
//! `fusermount3` anyway, which cleans up by hand: `fusermount3 -u -z DIR`);
//! [`mount_or_skip`] says loudly when they are missing and fails instead
//! with `BUS_REQUIRE_BROKERS=1`.

pub mod rounds;
pub mod state;

mod fs;

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use state::{CutReport, PAGE};
use state::{Kind, ROOT, State};

/// A mounted test filesystem and its control.
pub struct PowerFs {
    state: Arc<Mutex<State>>,
    session: Option<fuser::BackgroundSession>,
    watchdog: Option<std::process::Child>,
    mountpoint: PathBuf,
    backing: PathBuf,
}

impl std::fmt::Debug for PowerFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerFs")
            .field("mountpoint", &self.mountpoint)
            .field("backing", &self.backing)
            .finish_non_exhaustive()
    }
}

/// Why FUSE cannot be used here, if it cannot.
pub fn unavailable() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".to_owned());
    }
    // Root mounts without a setuid helper.
    if !is_root() {
        return Some("not running as root".to_owned());
    }
    None
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find(|line| line.starts_with("Uid:"))
            .and_then(|line| line.split_whitespace().nth(2))
            == Some("0")
    })
}

/// What [`mount_or_skip`] could not do.
#[derive(Debug)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FUSE test filesystem unavailable: {}", self.0)
    }
}

impl std::error::Error for Unavailable {}

/// Mounts, or returns `Ok(None)` after a loud `SKIP` line when FUSE is not
/// usable here, or an error when it is not usable and `BUS_REQUIRE_BROKERS=1`
/// says it must be (as a missing broker does).
pub fn mount_or_skip(
    test: &str,
    backing: &Path,
    mountpoint: &Path,
) -> Result<Option<PowerFs>, Unavailable> {
    let required = std::env::var("BUS_REQUIRE_BROKERS").is_ok_and(|v| v == "1");
    let reason = match unavailable() {
        None => match PowerFs::mount(backing, mountpoint) {
            Ok(fs) => return Ok(Some(fs)),
            Err(error) => format!("mount failed: {error}"),
        },
        Some(reason) => reason,
    };
    if required {
        return Err(Unavailable(reason));
    }
    eprintln!("SKIP {test}: FUSE test filesystem unavailable ({reason})");
    Ok(None)
}

impl PowerFs {
    /// Mounts over `backing` (its contents are the disk) at `mountpoint`.
    pub fn mount(backing: &Path, mountpoint: &Path) -> io::Result<Self> {
        let mut state = State::new();
        // The root shows the backing directory's owner and mode (a server
        // run as another user checks the directory it is given).
        let meta = std::fs::metadata(backing)?;
        let to_io = |code: i32| io::Error::from_raw_os_error(code);
        state
            .set_owner(ROOT, Some(meta.uid()), Some(meta.gid()))
            .map_err(to_io)?;
        state
            .set_mode(ROOT, meta.permissions().mode())
            .map_err(to_io)?;
        import(&mut state, backing, ROOT)?;
        let state = Arc::new(Mutex::new(state));
        let mut config = fuser::Config::default();
        // Mounted by the kernel directly (root): no fusermount3 helper,
        // whose auto_unmount mode left defunct helpers and mounts behind
        // here; the watchdog below does that job.
        config.mount_options = vec![
            fuser::MountOption::FSName("bus-testfs".to_owned()),
            fuser::MountOption::Subtype("bus-testfs".to_owned()),
        ];
        config.acl = fuser::SessionACL::All;
        let session = fuser::spawn_mount(fs::Fs::new(state.clone()), mountpoint, &config)?;
        // If this process dies without unwinding (kill -9, abort), the
        // watchdog's stdin closes and it detaches the mount, so no test
        // leaves a dead mount behind.
        let watchdog = std::process::Command::new("sh")
            .args(["-c", "read _ ; exec umount -l \"$0\" 2>/dev/null"])
            .arg(mountpoint)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .ok();
        Ok(Self {
            state,
            session: Some(session),
            watchdog,
            mountpoint: mountpoint.to_owned(),
            backing: backing.to_owned(),
        })
    }

    /// Where the filesystem is mounted.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// Cuts the power: everything not synced is gone, and every operation
    /// fails until [`PowerFs::power_on`].
    pub fn power_cut(&self) -> CutReport {
        fs::lock(&self.state).power_cut(None)
    }

    /// Cuts the power after writing back a random subset of the unsynced
    /// pages (`seed` replays the choice).
    pub fn power_cut_torn(&self, seed: u64) -> CutReport {
        fs::lock(&self.state).power_cut(Some(seed))
    }

    /// The power comes back: the disk as the cut left it.
    pub fn power_on(&self) {
        fs::lock(&self.state).power_on();
    }

    /// The next fsync or fdatasync of a file fails with `EIO` (and its
    /// pages are forgotten, as Linux marks them clean).
    pub fn fail_next_fsync(&self) {
        fs::lock(&self.state).faults.fail_next_fsync = true;
    }

    /// Whether an armed fsync failure is still waiting for its fsync.
    pub fn fsync_failure_armed(&self) -> bool {
        fs::lock(&self.state).faults.fail_next_fsync
    }

    /// Failed fsyncs answered so far.
    pub fn fsync_failures(&self) -> u64 {
        fs::lock(&self.state).fsync_failures
    }

    /// File fsyncs and fdatasyncs asked for so far (failed ones too).
    pub fn fsyncs(&self) -> u64 {
        fs::lock(&self.state).fsyncs
    }

    /// The disk is full (`ENOSPC` on writes, creates, growth) or not.
    pub fn set_disk_full(&self, full: bool) {
        fs::lock(&self.state).faults.disk_full = full;
    }

    /// Pages written and not yet synced (what a cut now would drop).
    pub fn dirty_pages(&self) -> u64 {
        fs::lock(&self.state).dirty_pages()
    }

    /// Unmounts and writes the disk's contents back to the backing
    /// directory (what [`Drop`] does, with the errors).
    pub fn unmount(mut self) -> io::Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        // A plain unmount ends the session; while a file is still open
        // (a test failing half-way) it is busy: detach it instead, and the
        // session ends when the last file closes.
        let unmounted = match session.umount_and_join() {
            Ok(()) => Ok(()),
            Err(_) => detach(&self.mountpoint),
        };
        if let Some(mut watchdog) = self.watchdog.take() {
            drop(watchdog.stdin.take());
            let _ = watchdog.wait();
        }
        let exported = export(&fs::lock(&self.state), &self.backing);
        unmounted.and(exported)
    }
}

/// A lazy unmount (`umount -l`).
fn detach(mountpoint: &Path) -> io::Result<()> {
    let status = std::process::Command::new("umount")
        .arg("-l")
        .arg(mountpoint)
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "umount -l {}: {status}",
            mountpoint.display()
        )))
    }
}

impl Drop for PowerFs {
    fn drop(&mut self) {
        if let Err(error) = self.finish() {
            eprintln!(
                "bus-testfs: unmounting {}: {error}",
                self.mountpoint.display()
            );
        }
    }
}

/// Loads the backing directory as the disk.
fn import(state: &mut State, dir: &Path, ino: u64) -> io::Result<()> {
    let to_io = |code: i32| io::Error::from_raw_os_error(code);
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = std::fs::symlink_metadata(entry.path())?;
        let mode = meta.permissions().mode();
        let owner = (Some(meta.uid()), Some(meta.gid()));
        let name = entry.file_name();
        if meta.is_dir() {
            let child = state
                .create(ino, &name, State::new_dir(), mode)
                .map_err(to_io)?;
            state.set_owner(child, owner.0, owner.1).map_err(to_io)?;
            import(state, &entry.path(), child)?;
        } else if meta.is_symlink() {
            let target = std::fs::read_link(entry.path())?;
            let kind = Kind::Symlink(target.into_os_string());
            let child = state.create(ino, &name, kind, mode).map_err(to_io)?;
            state.set_owner(child, owner.0, owner.1).map_err(to_io)?;
        } else if meta.is_file() {
            let child = state
                .create(ino, &name, State::new_file(), mode)
                .map_err(to_io)?;
            state.set_owner(child, owner.0, owner.1).map_err(to_io)?;
            state
                .load(child, &std::fs::read(entry.path())?)
                .map_err(to_io)?;
        }
    }
    state.fsync_dir(ino).map_err(to_io)
}

/// Replaces the backing directory's contents with the disk's.
fn export(state: &State, backing: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(backing)? {
        let path = entry?.path();
        if std::fs::symlink_metadata(&path)?.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    for (path, ino) in state.durable_tree(ROOT) {
        let Ok(inode) = state.get(ino) else { continue };
        let target = backing.join(&path);
        match &inode.kind {
            Kind::Dir { .. } => std::fs::create_dir_all(&target)?,
            Kind::Symlink(to) => std::os::unix::fs::symlink(to, &target)?,
            Kind::File { .. } => {
                std::fs::write(&target, state.disk_bytes(ino).unwrap_or_default())?;
            }
        }
        // Owners pass through both ways; modes of links are not settable.
        std::os::unix::fs::lchown(&target, Some(inode.uid), Some(inode.gid))?;
        if !matches!(inode.kind, Kind::Symlink(_)) {
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(inode.mode))?;
        }
    }
    Ok(())
}
