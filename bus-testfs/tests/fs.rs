//! The test filesystem through the kernel: what survives a power cut, what
//! a torn cut keeps, and the faults it answers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::Path;

use bus_testfs::PowerFs;

/// A mount of its own under a fresh temp dir, or `None` (skipped loudly).
fn mount(test: &str) -> Option<(tempfile::TempDir, PowerFs)> {
    let root = tempfile::tempdir().unwrap();
    let backing = root.path().join("backing");
    let mnt = root.path().join("mnt");
    std::fs::create_dir(&backing).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let fs = bus_testfs::mount_or_skip(test, &backing, &mnt).unwrap()?;
    Some((root, fs))
}

fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

fn sync_dir(path: &Path) {
    File::open(path).unwrap().sync_all().unwrap();
}

fn cut(fs: &PowerFs) {
    fs.power_cut();
    fs.power_on();
}

#[test]
fn a_write_without_fsync_is_gone_after_a_cut_and_one_with_fsync_stays() {
    let Some((_root, fs)) = mount("a_write_without_fsync_is_gone") else {
        return;
    };
    let synced = fs.path().join("synced");
    let unsynced = fs.path().join("unsynced");
    let mut file = File::create(&synced).unwrap();
    file.write_all(b"kept").unwrap();
    file.sync_data().unwrap();
    let mut other = File::create(&unsynced).unwrap();
    other.write_all(b"lost").unwrap();
    other.sync_all().unwrap();
    sync_dir(fs.path());
    // Written after the syncs: in the page cache only.
    file.write_all(b" and more").unwrap();
    other.write_all(b" too").unwrap();
    assert_eq!(read(&synced).unwrap(), b"kept and more");
    drop((file, other));
    cut(&fs);
    assert_eq!(read(&synced).unwrap(), b"kept");
    assert_eq!(read(&unsynced).unwrap(), b"lost");
}

#[test]
fn a_create_or_rename_without_a_directory_fsync_is_undone() {
    let Some((_root, fs)) = mount("a_rename_without_dir_fsync_is_undone") else {
        return;
    };
    let dir = fs.path();
    std::fs::write(dir.join("a"), b"first").unwrap();
    File::open(dir.join("a")).unwrap().sync_all().unwrap();
    sync_dir(dir);
    // A new file, fsynced itself, and a rename: neither made durable in
    // the directory.
    let mut new = File::create(dir.join("new")).unwrap();
    new.write_all(b"data").unwrap();
    new.sync_all().unwrap();
    drop(new);
    std::fs::rename(dir.join("a"), dir.join("b")).unwrap();
    assert!(dir.join("b").exists());
    cut(&fs);
    assert_eq!(read(&dir.join("a")).unwrap(), b"first");
    assert_eq!(
        read(&dir.join("b")).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        read(&dir.join("new")).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    // With the directory fsync, the rename stays.
    std::fs::rename(dir.join("a"), dir.join("b")).unwrap();
    sync_dir(dir);
    cut(&fs);
    assert_eq!(read(&dir.join("b")).unwrap(), b"first");
    assert!(!dir.join("a").exists());
}

#[test]
fn a_torn_cut_keeps_a_subset_of_the_unsynced_pages() {
    let Some((_root, fs)) = mount("a_torn_cut_keeps_a_subset") else {
        return;
    };
    let path = fs.path().join("f");
    let mut file = File::create(&path).unwrap();
    file.sync_all().unwrap();
    sync_dir(fs.path());
    let pages = 64u8;
    for page in 0..pages {
        file.write_all(&[page + 1; 4096]).unwrap();
    }
    drop(file);
    let report = fs.power_cut_torn(11);
    fs.power_on();
    let bytes = read(&path).unwrap();
    let kept = bytes
        .chunks(4096)
        .zip(1u8..)
        .filter(|(chunk, mark)| chunk.iter().all(|b| b == mark))
        .count();
    println!("torn cut: {kept} of {pages} pages kept ({report:?})");
    assert_eq!(kept as u64, report.pages_torn_in);
    assert!(
        kept > 0 && kept < usize::from(pages),
        "a torn cut keeps some, not all"
    );
}

#[test]
fn a_failed_fsync_is_eio_and_its_pages_are_not_made_durable_by_a_retry() {
    let Some((_root, fs)) = mount("a_failed_fsync_is_eio") else {
        return;
    };
    let path = fs.path().join("f");
    let mut file = File::create(&path).unwrap();
    file.sync_all().unwrap();
    sync_dir(fs.path());
    file.write_all(b"doomed").unwrap();
    fs.fail_next_fsync();
    let error = file.sync_data().unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    assert_eq!(fs.fsync_failures(), 1);
    // Linux's behaviour: the retry succeeds, the page cache shows the
    // bytes, and the disk never got them.
    file.sync_data().unwrap();
    assert_eq!(read(&path).unwrap(), b"doomed");
    drop(file);
    cut(&fs);
    assert_eq!(read(&path).unwrap(), b"");
}

#[test]
fn a_full_disk_answers_enospc_and_space_freed_lets_writes_go_on() {
    let Some((_root, fs)) = mount("a_full_disk_answers_enospc") else {
        return;
    };
    let path = fs.path().join("f");
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    fs.set_disk_full(true);
    let error = file.write_all(b"no room").unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
    let error = File::create(fs.path().join("g")).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
    fs.set_disk_full(false);
    file.write_all(b"room").unwrap();
    assert_eq!(read(&path).unwrap(), b"room");
}

#[test]
fn old_handles_are_dead_after_a_cut_and_the_disk_goes_back_to_the_backing_dir() {
    let root = tempfile::tempdir().unwrap();
    let backing = root.path().join("backing");
    let mnt = root.path().join("mnt");
    std::fs::create_dir_all(backing.join("sub")).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(backing.join("sub/old"), b"from the backing dir").unwrap();
    let Some(fs) = bus_testfs::mount_or_skip("old_handles_are_dead", &backing, &mnt).unwrap()
    else {
        return;
    };
    assert_eq!(read(&mnt.join("sub/old")).unwrap(), b"from the backing dir");
    let mut held = OpenOptions::new()
        .append(true)
        .open(mnt.join("sub/old"))
        .unwrap();
    held.write_all(b", appended").unwrap();
    held.sync_data().unwrap();
    fs.power_cut();
    // Down: a process still running after the cut writes nothing.
    assert!(held.write_all(b"!").is_err());
    fs.power_on();
    assert!(held.write_all(b"!").is_err(), "a handle of the old boot");
    std::fs::write(mnt.join("sub/unsynced"), b"x").unwrap();
    drop(held);
    fs.unmount().unwrap();
    assert_eq!(
        std::fs::read(backing.join("sub/old")).unwrap(),
        b"from the backing dir, appended"
    );
    assert!(!backing.join("sub/unsynced").exists());
    // Unmounted: the mount point is an empty directory again.
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
}

#[test]
fn a_test_that_panics_with_a_file_open_leaves_no_mount_behind() {
    let root = tempfile::tempdir().unwrap();
    let backing = root.path().join("backing");
    let mnt = root.path().join("mnt");
    std::fs::create_dir(&backing).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let mut held = None;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let Some(fs) = bus_testfs::mount_or_skip("a_test_that_panics", &backing, &mnt).unwrap()
        else {
            return false;
        };
        // Still open when the mount's guard runs: the busy path.
        held = Some(File::create(fs.path().join("open")).unwrap());
        panic!("a failing test");
    }));
    if matches!(outcome, Ok(false)) {
        return;
    }
    assert!(outcome.is_err());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let mnt = mnt.canonicalize().unwrap();
    assert!(
        !mounts.contains(&*mnt.to_string_lossy()),
        "{} is still mounted",
        mnt.display()
    );
    drop(held);
}

/// Owners pass through (#29, round 2): PostgreSQL, run as its own user,
/// refuses a data directory it does not own. The backing directory's
/// owner shows at the mount, `chown` and a create by another user set it,
/// and the owner and mode reach the backing directory at unmount.
#[test]
fn owners_and_modes_pass_through_both_ways() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let root = tempfile::tempdir().unwrap();
    let backing = root.path().join("backing");
    let mnt = root.path().join("mnt");
    std::fs::create_dir(&backing).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(backing.join("theirs"), b"x").unwrap();
    std::os::unix::fs::chown(backing.join("theirs"), Some(4321), Some(4322)).unwrap();
    let Some(fs) = bus_testfs::mount_or_skip("owners_pass_through", &backing, &mnt).unwrap() else {
        return;
    };
    let theirs = std::fs::metadata(fs.path().join("theirs")).unwrap();
    assert_eq!((theirs.uid(), theirs.gid()), (4321, 4322));
    let dir = fs.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(1234), Some(1235)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let meta = std::fs::metadata(&dir).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1234, 1235));
    assert_eq!(meta.permissions().mode() & 0o7777, 0o700);
    sync_dir(fs.path());
    fs.unmount().unwrap();
    let meta = std::fs::metadata(backing.join("data")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1234, 1235));
    assert_eq!(meta.permissions().mode() & 0o7777, 0o700);
    let theirs = std::fs::metadata(backing.join("theirs")).unwrap();
    assert_eq!((theirs.uid(), theirs.gid()), (4321, 4322));
}
