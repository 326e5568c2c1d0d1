//! Recovery over a damaged data directory. Small logs are written once by
//! the real bus (one segment; several sealed segments with their `.idx` and
//! `.uids` files under a control key; a copy taken while the writer still
//! had it open, zeros written ahead included). Each input picks one, edits
//! its files (flip, overwrite, truncate, extend, delete, rename, copy one
//! over another) and reopens it: never a panic; the open fails with a
//! structured error, or what it serves is true: records read back are the
//! ones written at those offsets, without holes, and find-by-UID never
//! answers with another record's offset.
//!
//! `BUS_FUZZ_STRICT_LOSS=1` also fails an open that silently serves fewer
//! records than were acknowledged (contract C15), for exploring that rule.
#![no_main]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use bus_core::{BatchRecord, BusError, EventBus, Manifest, TopicSpec};
use bus_embedded::{EmbeddedBus, Options};
use bus_fuzz::scratch_root;
use libfuzzer_sys::fuzz_target;
use serde_json::json;

const TOPIC: &str = "t";
const KEY: [u8; 32] = [7; 32];

struct Template {
    files: BTreeMap<PathBuf, Vec<u8>>,
    options: Options,
    keyed: bool,
    /// `(key, value, uid)` per offset.
    records: Vec<(String, serde_json::Value, Option<String>)>,
}

fn records(start: usize, n: usize) -> Vec<BatchRecord> {
    (start..start + n)
        .map(|i| {
            let value = match i % 4 {
                0 => json!({"n": i, "s": "x".repeat(i * 7)}),
                1 => json!([i, -1, 1.5, null, "ü"]),
                2 => json!({"metadata": {"uid": format!("m{i}")}}),
                _ => json!(i),
            };
            let uid = (i % 4 != 2 && i % 3 == 0).then(|| format!("u{i}"));
            BatchRecord {
                key: format!("k{}", i % 2),
                value,
                uid,
            }
        })
        .collect()
}

fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n != "LOCK") {
                let bytes = std::fs::read(&path).expect("read");
                files.insert(
                    path.strip_prefix(root).expect("prefix").to_path_buf(),
                    bytes,
                );
            }
        }
    }
    files
}

/// Writes a log with the real bus: `batches` publish calls of the given
/// sizes; the snapshot is taken after close, or while still open.
fn template(options: Options, keyed: bool, batches: &[usize], while_open: bool) -> Template {
    let dir = tempfile::tempdir_in(scratch_root()).expect("tempdir");
    let bus = EmbeddedBus::open_with(dir.path(), options.clone()).expect("open");
    bus.provision(&Manifest::new([TopicSpec::new(TOPIC, 1)]))
        .expect("provision");
    if keyed {
        bus.set_control_key(KEY).expect("key");
    }
    let mut written = Vec::new();
    for &n in batches {
        let batch = records(written.len(), n);
        let acks = if n == 1 {
            let r = &batch[0];
            vec![
                match &r.uid {
                    Some(uid) => bus.publish_idempotent(TOPIC, &r.key, &r.value, uid),
                    None => bus.publish(TOPIC, &r.key, &r.value),
                }
                .expect("publish"),
            ]
        } else {
            bus.publish_batch(TOPIC, &batch).expect("batch")
        };
        for (ack, r) in acks.iter().zip(&batch) {
            assert_eq!(ack.offset as usize, written.len());
            let uid = r
                .uid
                .clone()
                .or_else(|| bus_core::embedded_uid(&r.value).map(str::to_owned));
            written.push((r.key.clone(), r.value.clone(), uid));
        }
    }
    let files = if while_open {
        snapshot(dir.path())
    } else {
        drop(bus);
        snapshot(dir.path())
    };
    Template {
        files,
        options,
        keyed,
        records: written,
    }
}

fn templates() -> &'static [Template] {
    static TEMPLATES: OnceLock<Vec<Template>> = OnceLock::new();
    TEMPLATES.get_or_init(|| {
        let templates = vec![
            template(Options::default(), false, &[1, 1, 3, 1], false),
            template(
                Options::default()
                    .segment_bytes(160)
                    .index_interval_bytes(48),
                true,
                &[1, 2, 1, 1, 3, 1, 1],
                false,
            ),
            template(
                Options::default()
                    .segment_bytes(400)
                    .index_interval_bytes(1),
                false,
                &[2, 1, 1, 1, 2, 1],
                true,
            ),
        ];
        // `BUS_FUZZ_WRITE_SEEDS=fuzz/corpus`: seed the byte-level targets
        // with what the real bus wrote.
        if let Some(corpus) = std::env::var_os("BUS_FUZZ_WRITE_SEEDS") {
            for (i, template) in templates.iter().enumerate() {
                let prefix = format!("t{i}-");
                bus_fuzz::write_seeds(Path::new(&corpus), &prefix, &template.files).expect("seeds");
            }
        }
        templates
    })
}

#[derive(Debug, Arbitrary)]
enum Edit {
    Xor {
        file: u8,
        at: u32,
        with: u8,
    },
    Write {
        file: u8,
        at: u32,
        bytes: Vec<u8>,
    },
    Truncate {
        file: u8,
        len: u32,
    },
    Extend {
        file: u8,
        zeros: u16,
    },
    Remove {
        file: u8,
    },
    /// Gives a segment file (or its hints) another base offset.
    Rename {
        file: u8,
        base: u8,
    },
    Copy {
        from: u8,
        to: u8,
    },
}

#[derive(Debug, Arbitrary)]
struct Input {
    template: u8,
    edits: Vec<Edit>,
    /// Reopen with a control key even if the log was written without one.
    key_on_reopen: bool,
}

fn pick(files: &BTreeMap<PathBuf, Vec<u8>>, i: u8) -> Option<PathBuf> {
    (!files.is_empty()).then(|| {
        files
            .keys()
            .nth(usize::from(i) % files.len())
            .cloned()
            .expect("in range")
    })
}

fn apply(files: &mut BTreeMap<PathBuf, Vec<u8>>, edit: &Edit) {
    match *edit {
        Edit::Xor { file, at, with } => {
            if let Some(path) = pick(files, file) {
                let bytes = files.get_mut(&path).expect("picked");
                if !bytes.is_empty() {
                    let at = at as usize % bytes.len();
                    bytes[at] ^= with;
                }
            }
        }
        Edit::Write {
            file,
            at,
            ref bytes,
        } => {
            if let Some(path) = pick(files, file) {
                let old = files.get_mut(&path).expect("picked");
                let at = at as usize % (old.len() + 1);
                let end = at + bytes.len();
                if old.len() < end {
                    old.resize(end, 0);
                }
                old[at..end].copy_from_slice(bytes);
            }
        }
        Edit::Truncate { file, len } => {
            if let Some(path) = pick(files, file) {
                let bytes = files.get_mut(&path).expect("picked");
                let len = len as usize % (bytes.len() + 1);
                bytes.truncate(len);
            }
        }
        Edit::Extend { file, zeros } => {
            if let Some(path) = pick(files, file) {
                let bytes = files.get_mut(&path).expect("picked");
                bytes.resize(bytes.len() + usize::from(zeros), 0);
            }
        }
        Edit::Remove { file } => {
            if let Some(path) = pick(files, file) {
                files.remove(&path);
            }
        }
        Edit::Rename { file, base } => {
            if let Some(path) = pick(files, file)
                && let Some(ext) = path.extension()
                && ext != "json"
            {
                let to =
                    path.with_file_name(format!("{:020}.{}", base % 32, ext.to_string_lossy()));
                let bytes = files.remove(&path).expect("picked");
                files.insert(to, bytes);
            }
        }
        Edit::Copy { from, to } => {
            if let (Some(from), Some(to)) = (pick(files, from), pick(files, to)) {
                let bytes = files[&from].clone();
                files.insert(to, bytes);
            }
        }
    }
}

fn structured(error: &BusError) -> bool {
    matches!(
        error,
        BusError::Corrupt { .. } | BusError::Io(_) | BusError::Integrity { .. }
    )
}

fuzz_target!(|input: Input| {
    let templates = templates();
    let template = &templates[usize::from(input.template) % templates.len()];
    let mut files = template.files.clone();
    for edit in input.edits.iter().take(8) {
        apply(&mut files, edit);
    }
    if std::env::var_os("BUS_FUZZ_DEBUG").is_some() {
        for (path, bytes) in &files {
            eprintln!("{} {} bytes", path.display(), bytes.len());
        }
    }
    let dir = tempfile::tempdir_in(scratch_root()).expect("tempdir");
    for (path, bytes) in &files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, bytes).expect("write");
    }
    let bus = match EmbeddedBus::open_with(dir.path(), template.options.clone()) {
        Ok(bus) => bus,
        Err(error) => {
            assert!(structured(&error), "unstructured open error: {error:?}");
            return;
        }
    };
    if template.keyed || input.key_on_reopen {
        bus.set_control_key(KEY).expect("key");
    }
    let written = &template.records;
    let mut served = 0u64;
    let mut next = 0u64;
    if bus.topics().iter().any(|t| t == TOPIC) {
        loop {
            match bus.fetch(TOPIC, 0, next, 3) {
                Ok(events) if events.is_empty() => break,
                Ok(events) => {
                    for event in &events {
                        assert!(event.offset >= next, "fetch went backwards");
                        if next > 0 || served > 0 {
                            assert_eq!(event.offset, next, "hole in fetch");
                        }
                        let (key, value, _) = written
                            .get(event.offset as usize)
                            .unwrap_or_else(|| panic!("offset {} was never written", event.offset));
                        assert_eq!((&event.key, &event.value), (key, value), "wrong record");
                        next = event.offset + 1;
                        served += 1;
                    }
                }
                Err(error) => {
                    assert!(structured(&error), "unstructured fetch error: {error:?}");
                    break;
                }
            }
        }
        for (offset, (key, _, uid)) in written.iter().enumerate() {
            let Some(uid) = uid else { continue };
            match bus.find_event_by_uid(TOPIC, key, uid) {
                Ok(Some(ack)) => assert_eq!(ack.offset as usize, offset, "another record's ack"),
                Ok(None) => {}
                Err(error) => assert!(structured(&error), "unstructured find error: {error:?}"),
            }
        }
        if std::env::var_os("BUS_FUZZ_STRICT_LOSS").is_some() && bus.fetch(TOPIC, 0, 0, 1).is_ok() {
            assert_eq!(
                served as usize,
                written.len(),
                "acked records silently lost"
            );
        }
        match bus.publish(TOPIC, "k", &json!({"after": true})) {
            // A damaged topic.json may name more partitions: the key then
            // lands elsewhere.
            Ok(ack) => assert!(
                ack.partition != 0 || ack.offset >= next,
                "offset {} reused ({next} served before it)",
                ack.offset
            ),
            Err(error) => assert!(
                structured(&error) || matches!(error, BusError::Poisoned { .. }),
                "unstructured publish error: {error:?}"
            ),
        }
    }
});
