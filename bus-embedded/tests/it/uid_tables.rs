//! Damage to the UID tables of sealed segments (`<base>.uids`): a table
//! that is cut, has a flipped byte (in its header, filter or a page), is
//! missing or is stale (another segment's, or left by a crash) is detected
//! and rebuilt from its segment. No lookup answers wrongly from it, no
//! record is lost or duplicated, and dedup holds across the reopen.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::support::{
    TABLE_HEADER as HEADER, TOPIC, assert_gap_free, copy_tree, crc32c, provision, read_all,
    segments, table_contents, value_for, word,
};
use bus_core::EventBus;
use bus_embedded::{EmbeddedBus, Options};

/// Records per test log; with [`options`] about a dozen sealed segments.
const N: usize = 120;

fn options() -> Options {
    Options::default()
        .segment_bytes(2000)
        .index_interval_bytes(300)
}

fn uid(i: usize) -> String {
    format!("uid-{i}")
}

/// A closed bus of `N` records with UIDs (in batches of 5, so several
/// records share a frame) and its sealed segments' tables.
fn sealed_dir() -> (tempfile::TempDir, Vec<PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    {
        let bus = EmbeddedBus::open_with(dir.path(), options()).unwrap();
        provision(&bus, 1);
        for from in (0..N).step_by(5) {
            let batch: Vec<bus_core::BatchRecord> = (from..from + 5)
                .map(|i| bus_core::BatchRecord::new("k", value_for(&uid(i), i)).with_uid(uid(i)))
                .collect();
            let acks = bus.publish_batch(TOPIC, &batch).unwrap();
            assert_eq!(acks[0].offset, from as u64);
        }
    }
    let logs = segments(dir.path(), 0);
    assert!(logs.len() >= 6, "{logs:?}");
    let tables: Vec<PathBuf> = logs[..logs.len() - 1]
        .iter()
        .map(|log| log.with_extension("uids"))
        .collect();
    for table in &tables {
        assert!(
            std::fs::read(table).unwrap().starts_with(b"BUT2"),
            "{table:?}"
        );
    }
    (dir, tables)
}

/// Opens the bus and checks every lookup, dedup of every UID, the whole
/// log, and (given the `originals`) that each table is whole again
/// afterwards: the same segment and entries (a rebuilt table has a new
/// key, so its pages are laid out anew). A flipped byte in a page no lookup reads may stay: pages
/// are verified when read.
fn assert_all_answers(dir: &Path, tables: &[PathBuf], originals: Option<&[Vec<u8>]>, what: &str) {
    let bus = EmbeddedBus::open_with(dir, options()).unwrap();
    check_bus(&bus, what);
    drop(bus);
    for (table, original) in tables.iter().zip(originals.unwrap_or_default()) {
        assert_eq!(
            table_contents(&std::fs::read(table).unwrap()),
            table_contents(original),
            "{what}: {table:?} not rebuilt as it was"
        );
    }
    // And once more after the reopen, from the rebuilt tables.
    check_bus(&EmbeddedBus::open_with(dir, options()).unwrap(), what);
}

fn check_bus(bus: &EmbeddedBus, what: &str) {
    check_records(bus, N, what);
}

/// Every lookup, dedup and record of a log of `n` records.
fn check_records(bus: &EmbeddedBus, n: usize, what: &str) {
    for i in (0..n).rev() {
        let found = bus.find_event_by_uid(TOPIC, "k", &uid(i)).unwrap();
        assert_eq!(found.map(|a| a.offset), Some(i as u64), "{what}: find {i}");
    }
    for absent in ["uid-9999", "uid-", "nope"] {
        assert_eq!(
            bus.find_event_by_uid(TOPIC, "k", absent).unwrap(),
            None,
            "{what}"
        );
    }
    // Dedup: publishing any stored UID again writes nothing.
    for i in (0..n).step_by(7) {
        let ack = bus
            .publish_idempotent(TOPIC, "k", &value_for(&uid(i), i), &uid(i))
            .unwrap();
        assert_eq!(ack.offset, i as u64, "{what}: dedup of {i}");
    }
    let events = read_all(bus, 0).unwrap();
    assert_eq!(events.len(), n, "{what}: records lost or duplicated");
    assert_gap_free(&events);
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.value, value_for(&uid(i), i), "{what}: offset {i}");
    }
}

fn flip(path: &Path, at: u64) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).unwrap();
    byte[0] ^= 0x20;
    file.write_all_at(&byte, at).unwrap();
}

fn read_all_tables(tables: &[PathBuf]) -> Vec<Vec<u8>> {
    tables.iter().map(|t| std::fs::read(t).unwrap()).collect()
}

#[test]
fn cut_missing_and_garbage_tables_are_rebuilt() {
    type Damage = fn(&Path);
    let damages: [(&str, Damage); 5] = [
        ("missing", |p| std::fs::remove_file(p).unwrap()),
        ("cut in half", |p| {
            let len = std::fs::metadata(p).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .unwrap()
                .set_len(len / 2)
                .unwrap();
        }),
        ("last byte cut", |p| {
            let len = std::fs::metadata(p).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .unwrap()
                .set_len(len - 1)
                .unwrap();
        }),
        ("empty", |p| std::fs::write(p, b"").unwrap()),
        ("one byte longer", |p| {
            let mut bytes = std::fs::read(p).unwrap();
            bytes.push(0);
            std::fs::write(p, bytes).unwrap();
        }),
    ];
    for (name, damage) in damages {
        let (dir, tables) = sealed_dir();
        let originals = read_all_tables(&tables);
        for table in &tables {
            damage(table);
        }
        assert_all_answers(dir.path(), &tables, Some(&originals), name);
    }
}

#[test]
fn a_flipped_byte_anywhere_in_a_table_is_detected() {
    let (dir, tables) = sealed_dir();
    let originals = read_all_tables(&tables);
    let len = originals[0].len() as u64;
    // Every byte of the header, then a spread over the filter and pages.
    let mut spots: Vec<u64> = (0..HEADER).collect();
    spots.extend((HEADER..len).step_by(37));
    spots.push(len - 1);
    for at in spots {
        flip(&tables[0], at);
        flip(
            &tables[tables.len() - 1],
            at.min(originals[tables.len() - 1].len() as u64 - 1),
        );
        assert_all_answers(dir.path(), &tables, None, &format!("flip at {at}"));
    }
}

#[test]
fn a_table_damaged_while_the_bus_is_open_is_rebuilt_on_the_next_lookup() {
    let (dir, tables) = sealed_dir();
    let originals = read_all_tables(&tables);
    let bus = EmbeddedBus::open_with(dir.path(), options()).unwrap();
    check_bus(&bus, "before damage");
    // Every page of every table, after the bus has loaded them.
    for (table, original) in tables.iter().zip(&originals) {
        for at in (HEADER..original.len() as u64).step_by(97) {
            flip(table, at);
        }
    }
    check_bus(&bus, "damaged while open");
    drop(bus);
    assert_all_answers(dir.path(), &tables, None, "after");
}

#[test]
fn stale_tables_are_not_trusted() {
    // Swapped between segments: each names the other segment.
    let (dir, tables) = sealed_dir();
    let originals = read_all_tables(&tables);
    std::fs::write(&tables[0], &originals[1]).unwrap();
    std::fs::write(&tables[1], &originals[0]).unwrap();
    assert_all_answers(dir.path(), &tables, Some(&originals), "swapped");

    // A crash after the table of the active segment was written, before
    // its successor existed: the next open must not use it, and must not
    // lose the UIDs written to the active segment since.
    let (dir, tables) = sealed_dir();
    let originals = read_all_tables(&tables);
    let logs = segments(dir.path(), 0);
    let active = logs.last().unwrap().with_extension("uids");
    std::fs::copy(&tables[0], &active).unwrap();
    assert_all_answers(
        dir.path(),
        &tables,
        Some(&originals),
        "left on the active segment",
    );
    assert!(!active.exists(), "stale table of the active segment kept");

    // A table of the right segment written before it held its last
    // frames (names fewer offsets and bytes than the segment has).
    let (dir, tables) = sealed_dir();
    let originals = read_all_tables(&tables);
    let mut short = originals[2].clone();
    let end = u64::from_le_bytes(short[16..24].try_into().unwrap());
    short[16..24].copy_from_slice(&(end - 1).to_le_bytes());
    let crc = crc32c(&short[..84]);
    short[84..88].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&tables[2], &short).unwrap();
    assert_all_answers(dir.path(), &tables, Some(&originals), "older table");
}

#[test]
fn a_list_from_before_tables_is_read_once_and_replaced() {
    // The format written before tables: magic, base, end, count, then
    // (len, bytes, offset) per UID, and a CRC.
    let (dir, tables) = sealed_dir();
    let originals = read_all_tables(&tables);
    let logs = segments(dir.path(), 0);
    for (table, log) in tables.iter().zip(&logs) {
        let base: u64 = log.file_stem().unwrap().to_str().unwrap().parse().unwrap();
        let next: u64 = logs
            .iter()
            .map(|l| {
                l.file_stem()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .parse::<u64>()
                    .unwrap()
            })
            .find(|&b| b > base)
            .unwrap();
        let mut list = b"BUI1".to_vec();
        for word in [base, next, next - base] {
            list.extend_from_slice(&word.to_le_bytes());
        }
        for i in base..next {
            let uid = uid(i as usize);
            list.extend_from_slice(&(uid.len() as u64).to_le_bytes());
            list.extend_from_slice(uid.as_bytes());
            list.extend_from_slice(&i.to_le_bytes());
        }
        let crc = crc32c(&list);
        list.extend_from_slice(&crc.to_le_bytes());
        std::fs::write(table, list).unwrap();
    }
    assert_all_answers(dir.path(), &tables, Some(&originals), "old list format");
}

/// The hint files a clean close leaves for the active segment.
fn closed_hints(dir: &Path) -> (PathBuf, PathBuf) {
    let active = segments(dir, 0).last().unwrap().clone();
    (
        active.with_extension("cidx"),
        active.with_extension("cuids"),
    )
}

fn publish_more(bus: &EmbeddedBus, from: usize, to: usize) {
    for i in from..to {
        let ack = bus
            .publish_idempotent(TOPIC, "k", &value_for(&uid(i), i), &uid(i))
            .unwrap();
        assert_eq!(ack.offset, i as u64);
    }
}

#[test]
fn a_clean_close_leaves_hints_the_next_open_uses_only_when_they_fit() {
    type Damage = fn(&Path, &Path);
    let damages: [(&str, Damage); 7] = [
        ("intact", |_, _| {}),
        ("index missing", |idx, _| std::fs::remove_file(idx).unwrap()),
        ("table missing", |_, uids| {
            std::fs::remove_file(uids).unwrap()
        }),
        ("index cut", |idx, _| {
            let bytes = std::fs::read(idx).unwrap();
            std::fs::write(idx, &bytes[..bytes.len() - 3]).unwrap();
        }),
        ("table cut", |_, uids| {
            let bytes = std::fs::read(uids).unwrap();
            std::fs::write(uids, &bytes[..bytes.len() / 2]).unwrap();
        }),
        ("index byte flipped", |idx, _| flip(idx, 20)),
        ("table page byte flipped", |_, uids| {
            // Past the header and filter: found when the page is read.
            let len = std::fs::metadata(uids).unwrap().len();
            for at in (len - 500..len).step_by(50) {
                flip(uids, at);
            }
        }),
    ];
    for (name, damage) in damages {
        let (dir, _) = sealed_dir();
        let (idx, uids) = closed_hints(dir.path());
        assert!(idx.exists() && uids.exists(), "{name}: no hints at close");
        damage(&idx, &uids);
        let bus = EmbeddedBus::open_with(dir.path(), options()).unwrap();
        check_records(&bus, N, name);
        // Writes after it, and the roll that seals the segment, keep
        // every UID.
        publish_more(&bus, N, N + 40);
        check_records(&bus, N + 40, name);
        drop(bus);
        check_records(
            &EmbeddedBus::open_with(dir.path(), options()).unwrap(),
            N + 40,
            name,
        );
    }
}

#[test]
fn clean_close_hints_are_stale_after_a_crash() {
    let (dir, _) = sealed_dir();
    let bus = EmbeddedBus::open_with(dir.path(), options()).unwrap();
    // Fewer bytes than a segment: the active one grows past its hints.
    publish_more(&bus, N, N + 3);
    // What kill -9 leaves now: the hints of the last close, a longer segment.
    let crashed = tempfile::tempdir().unwrap();
    copy_tree(dir.path(), crashed.path());
    drop(bus);
    let (idx, _) = closed_hints(crashed.path());
    assert!(idx.exists(), "the test needs the old hints");
    let bus = EmbeddedBus::open_with(crashed.path(), options()).unwrap();
    check_records(&bus, N + 3, "after a crash");
    drop(bus);

    // The hints of an older clean close put back beside a longer segment.
    let (dir, _) = sealed_dir();
    let (idx, uids) = closed_hints(dir.path());
    let (old_idx, old_uids) = (std::fs::read(&idx).unwrap(), std::fs::read(&uids).unwrap());
    let bus = EmbeddedBus::open_with(dir.path(), options()).unwrap();
    publish_more(&bus, N, N + 3);
    drop(bus);
    std::fs::write(&idx, old_idx).unwrap();
    std::fs::write(&uids, old_uids).unwrap();
    check_records(
        &EmbeddedBus::open_with(dir.path(), options()).unwrap(),
        N + 3,
        "older hints",
    );
}

/// The key a table's pages are placed by.
fn table_key(bytes: &[u8]) -> (u64, u64) {
    (word(bytes, 64), word(bytes, 72))
}

#[test]
fn every_table_is_written_under_its_own_random_key() {
    let (dir, tables) = sealed_dir();
    let originals = read_all_tables(&tables);
    let mut keys: Vec<(u64, u64)> = originals.iter().map(|t| table_key(t)).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), tables.len(), "tables share a key");
    // Rebuilt (here: after it went missing), a table draws a new key.
    std::fs::remove_file(&tables[1]).unwrap();
    assert_all_answers(dir.path(), &tables, Some(&originals), "missing");
    let again = std::fs::read(&tables[1]).unwrap();
    assert_ne!(table_key(&again), table_key(&originals[1]));
}

/// The lines of `log` that name a path under `dir` (one test's events).
fn lines_naming(log: &str, dir: &Path) -> String {
    let dir = dir.display().to_string();
    log.lines()
        .filter(|line| line.contains(&dir))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_table_of_the_first_unkeyed_format_is_read_once_and_rewritten_keyed() {
    // "BUT1": a 72-byte header without the key (filter CRC at 64, header
    // CRC at 68), its pages placed by an unkeyed hash. The pages of a
    // keyed table stand in for them: a first-format table is only ever
    // read whole, never looked up by hash.
    let (dir, tables) = sealed_dir();
    let originals = read_all_tables(&tables);
    for (table, original) in tables.iter().zip(&originals) {
        let mut old = original[..64].to_vec();
        old[..4].copy_from_slice(b"BUT1");
        old.extend_from_slice(&original[80..84]);
        let crc = crc32c(&old);
        old.extend_from_slice(&crc.to_le_bytes());
        old.extend_from_slice(&original[88..]);
        std::fs::write(table, old).unwrap();
    }
    // Converted from its own entries, not rebuilt from its segment.
    let log = crate::support::global_log();
    assert_all_answers(dir.path(), &tables, Some(&originals), "first format");
    let log = lines_naming(&log.text(), dir.path());
    assert_eq!(
        log.matches("rewriting it keyed").count(),
        tables.len(),
        "{log}"
    );
    assert!(!log.contains("rebuilding it from its segment"), "{log}");
    for table in &tables {
        assert!(
            std::fs::read(table).unwrap().starts_with(b"BUT2"),
            "{table:?}"
        );
    }
    // A damaged one is not trusted: rebuilt from its segment.
    let (dir, tables) = sealed_dir();
    let originals = read_all_tables(&tables);
    let mut old = originals[0][..64].to_vec();
    old[..4].copy_from_slice(b"BUT1");
    old.extend_from_slice(&originals[0][80..84]);
    let crc = crc32c(&old);
    old.extend_from_slice(&crc.to_le_bytes());
    old.extend_from_slice(&originals[0][88..]);
    let last = old.len() - 3;
    old[last] ^= 0x20;
    std::fs::write(&tables[0], old).unwrap();
    let log = crate::support::global_log();
    assert_all_answers(
        dir.path(),
        &tables,
        Some(&originals),
        "damaged first format",
    );
    let log = lines_naming(&log.text(), dir.path());
    assert_eq!(
        log.matches("rebuilding it from its segment").count(),
        1,
        "{log}"
    );
}
