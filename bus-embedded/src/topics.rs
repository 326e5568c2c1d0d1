//! A topic on disk: `topics/<encoded name>/topic.json` plus one directory
//! per partition.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bus_core::{BusError, TopicSpec};

use crate::fsutil;
use crate::options::Options;
use crate::partition::Partition;
use crate::partition::recovery::open_partition;

/// The topic's spec, written last when provisioning, so a topic directory
/// without it is an interrupted provisioning and is ignored.
const SPEC_FILE: &str = "topic.json";

/// A provisioned topic and its open partitions.
#[derive(Debug)]
pub(crate) struct Topic {
    pub spec: TopicSpec,
    pub partitions: Vec<Arc<Partition>>,
}

/// The directory name of a topic. Topic names are `[A-Za-z0-9._-]`, never
/// `.`/`..`; upper-case letters become `+` and the lower-case letter, so
/// `x` and `X` stay apart on case-insensitive file systems (`+` is not a
/// legal name character, so the encoding is injective).
pub(crate) fn dir_name(topic: &str) -> String {
    let mut out = String::with_capacity(topic.len() + 4);
    for c in topic.chars() {
        if c.is_ascii_uppercase() {
            out.push('+');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

pub(crate) fn partition_dir(topic_dir: &Path, partition: u32) -> PathBuf {
    topic_dir.join(format!("p{partition:04}"))
}

/// Creates a topic's directories and, last, its spec file.
pub(crate) fn create(topics_dir: &Path, spec: &TopicSpec) -> Result<(), BusError> {
    let dir = topics_dir.join(dir_name(&spec.name));
    fsutil::create_dir(&dir)?;
    for partition in 0..spec.partitions {
        let pdir = partition_dir(&dir, partition);
        fsutil::create_dir(&pdir)?;
        if crate::log::segment::list(&pdir)?.is_empty() {
            crate::partition::recovery::create_segment(&pdir, 0)?;
        }
    }
    fsutil::sync_dir(&dir)?;
    save_spec(topics_dir, spec)
}

/// Writes a topic's spec file (atomically: the old one or the new one
/// survives a crash).
pub(crate) fn save_spec(topics_dir: &Path, spec: &TopicSpec) -> Result<(), BusError> {
    let dir = topics_dir.join(dir_name(&spec.name));
    fsutil::write_atomic(&dir.join(SPEC_FILE), &serde_json::to_vec_pretty(spec)?)?;
    fsutil::sync_dir(topics_dir)?;
    Ok(())
}

/// Opens a provisioned topic's partitions (read-only when the options say so).
pub(crate) fn open(
    topics_dir: &Path,
    spec: TopicSpec,
    options: &Options,
) -> Result<Topic, BusError> {
    let dir = topics_dir.join(dir_name(&spec.name));
    // A reader opening while no writer holds the directory (after a power
    // loss, before any writer) trusts every whole frame, not the marker the
    // power may have taken (C16, #29).
    let no_writer = options.read_only
        && topics_dir
            .parent()
            .is_some_and(|root| fsutil::writer_absent(&root.join("LOCK")));
    let partitions = (0..spec.partitions)
        .map(|p| {
            if options.read_only {
                crate::partition::readonly::open_partition(
                    &spec.name,
                    p,
                    partition_dir(&dir, p),
                    options,
                    no_writer,
                )
            } else {
                let partition = open_partition(&spec.name, p, partition_dir(&dir, p), options)?;
                // After the recovery that read it, before the first write.
                let interval = matches!(options.durability, crate::Durability::Interval(_));
                crate::partition::unordered::set(&partition.dir, interval)?;
                partition.set_compression(spec.compression);
                partition.start_acked_end()?;
                Ok(partition)
            }
            .map(Arc::new)
        })
        .collect::<Result<_, BusError>>()?;
    Ok(Topic { spec, partitions })
}

/// The specs of every provisioned topic under `topics_dir`.
pub(crate) fn list(topics_dir: &Path) -> Result<Vec<TopicSpec>, BusError> {
    let mut specs = Vec::new();
    for entry in std::fs::read_dir(topics_dir)? {
        let entry = entry?;
        let path = entry.path().join(SPEC_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(error.into()),
        };
        let bad = |reason: String| BusError::Corrupt {
            location: path.display().to_string(),
            offset: 0,
            reason,
        };
        let spec: TopicSpec =
            serde_json::from_slice(&bytes).map_err(|e| bad(format!("unreadable spec: {e}")))?;
        spec.validate_as("topic.json")
            .map_err(|e| bad(e.to_string()))?;
        if entry.file_name().to_str() != Some(dir_name(&spec.name).as_str()) {
            return Err(bad(format!(
                "spec names topic {:?}, which does not belong in this directory",
                spec.name
            )));
        }
        check_partition_dirs(&entry.path(), &spec).map_err(bad)?;
        specs.push(spec);
    }
    Ok(specs)
}

/// Provisioning creates every partition directory before the spec file, so
/// a spec whose partition count disagrees with the directories on disk is
/// damaged: opened as it is, keys would move to other partitions and
/// find-by-UID would stop finding what was stored.
fn check_partition_dirs(topic_dir: &Path, spec: &TopicSpec) -> Result<(), String> {
    let mut found = 0u32;
    for entry in std::fs::read_dir(topic_dir).map_err(|e| e.to_string())? {
        let name = entry.map_err(|e| e.to_string())?.file_name();
        let Some(index) = name
            .to_str()
            .and_then(|name| name.strip_prefix('p'))
            .filter(|digits| digits.len() >= 4 && digits.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|digits| digits.parse::<u32>().ok())
        else {
            continue;
        };
        if index >= spec.partitions {
            return Err(format!(
                "spec says {} partitions but partition directory {} exists",
                spec.partitions,
                name.to_string_lossy()
            ));
        }
        found += 1;
    }
    if found != spec.partitions {
        return Err(format!(
            "spec says {} partitions but {found} partition directories exist",
            spec.partitions
        ));
    }
    Ok(())
}

impl Topic {
    /// The same partitions under `spec`, which differs from this topic's
    /// spec at most in its compression (the only property a manifest may
    /// change): saved, then applied to the frames written from now on.
    pub fn respecified(&self, topics_dir: &Path, spec: &TopicSpec) -> Result<Topic, BusError> {
        save_spec(topics_dir, spec)?;
        for partition in &self.partitions {
            partition.set_compression(spec.compression);
        }
        Ok(Topic {
            spec: spec.clone(),
            partitions: self.partitions.clone(),
        })
    }

    /// The same partitions under `spec` as read from the directory (a
    /// read-only open following its writer): nothing saved or changed.
    pub fn with_spec(&self, spec: TopicSpec) -> Topic {
        Topic {
            spec,
            partitions: self.partitions.clone(),
        }
    }

    /// The partition `partition`, or the error naming the valid range.
    pub fn partition(&self, partition: u32) -> Result<&Arc<Partition>, BusError> {
        bus_core::backend::check_partition(&self.spec.name, partition, self.spec.partitions)?;
        self.partitions
            .get(partition as usize)
            .ok_or_else(|| BusError::UnknownPartition {
                topic: self.spec.name.clone(),
                partition,
                partitions: self.spec.partitions,
            })
    }
}
