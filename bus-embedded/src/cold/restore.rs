//! Restore (contract C24): a topic rebuilt in a new embedded directory
//! from its cold tier, on another machine if need be. Its history reads
//! from the tier with the offsets, values, `stored_at`, headers and tags it
//! was archived with, and publishing continues at the offset after the
//! last archived record of each partition.
//!
//! Nothing of the tier is copied: each partition starts as one empty
//! segment whose base is the tier's end (the log's own way of saying where
//! a partition's offsets continue), and the topic's `cold.json` names the
//! tier, so every read below that base goes to the tier as after retention.
//! The spec file is written last, as provisioning does: a crash before it
//! leaves a directory no open sees as a topic, and running the restore
//! again finishes it.

use bus_cold::{ColdLocation, ColdTier};
use bus_core::auth::RecordAuth;
use bus_core::{BusError, EventBus, Manifest, TopicSpec};

use crate::EmbeddedBus;
use crate::log::segment;
use crate::partition::recovery::create_segment;
use crate::topics::{dir_name, partition_dir};

/// Rebuilds `spec`'s topic in `bus` (which must not have it yet) from the
/// cold tier at `location` (see [`ColdLocation::parse`]), which keeps
/// dropping only archived segments ([`super::attach`]). Returns each
/// partition's next offset.
///
/// The tier is checked before anything is written: it answers, it holds
/// this topic, no partition past `spec.partitions`, and the newest archived
/// record of each partition reads back. Dedup (C6) covers the records
/// published after the restore, as it covers the retained log.
///
/// # Errors
/// `Conflict` when the topic is already provisioned in `bus`;
/// `InvalidArgument` when the tier holds nothing of the topic or a
/// partition the spec lacks; `Corrupt`/`Integrity` from the tier's newest
/// objects; the tier's own errors when it does not answer. On any of them
/// the directory is left without the topic.
pub fn restore(bus: &EmbeddedBus, spec: &TopicSpec, location: &str) -> Result<Vec<u64>, BusError> {
    bus.inner.writable("cold restore")?;
    spec.validate_as("spec")?;
    if let Ok(existing) = bus.inner.topic(&spec.name) {
        return Err(BusError::Conflict {
            topic: spec.name.clone(),
            property: "existence".into(),
            existing: format!(
                "a provisioned topic of {} partitions",
                existing.spec.partitions
            ),
            requested: "a restore from the cold tier".into(),
            fix: "restore into a directory without the topic".into(),
        });
    }
    let parsed = ColdLocation::parse(location)?;
    let tier = ColdTier::open(&parsed)?;
    tier.check()?;
    let auth = bus.inner.auth();
    let ends = archived_ends(&tier, spec, &parsed, auth.as_ref())?;
    let topic_dir = bus.inner.topics_dir.join(dir_name(&spec.name));
    crate::fsutil::create_dir(&topic_dir)?;
    refuse_other_partitions(&topic_dir, spec.partitions)?;
    for (partition, &end) in (0..spec.partitions).zip(&ends) {
        let dir = partition_dir(&topic_dir, partition);
        crate::fsutil::create_dir(&dir)?;
        match segment::list(&dir)?.as_slice() {
            [] => drop(create_segment(&dir, end)?),
            // An earlier restore stopped before the spec file.
            [base] if *base == end => {}
            found => {
                return Err(BusError::invalid(
                    "directory",
                    format!(
                        "{} holds segments {found:?} of a topic that is not provisioned; remove it to restore",
                        dir.display()
                    ),
                ));
            }
        }
    }
    crate::fsutil::sync_dir(&topic_dir)?;
    super::remember(&topic_dir, tier, &parsed, true)?;
    bus.provision(&Manifest::new([spec.clone()]))?;
    Ok(ends)
}

/// An earlier, interrupted restore with more partitions left directories
/// this spec would not own: refused (the next open would call the topic
/// damaged).
fn refuse_other_partitions(topic_dir: &std::path::Path, partitions: u32) -> Result<(), BusError> {
    for entry in std::fs::read_dir(topic_dir)? {
        let name = entry?.file_name();
        let index = name
            .to_str()
            .and_then(|name| name.strip_prefix('p'))
            .and_then(|digits| digits.parse::<u32>().ok());
        if index.is_some_and(|index| index >= partitions) {
            return Err(BusError::invalid(
                "spec.partitions",
                format!(
                    "{} holds partition directory {} of an interrupted restore with more partitions; remove it to restore",
                    topic_dir.display(),
                    name.to_string_lossy()
                ),
            ));
        }
    }
    Ok(())
}

/// The tier's end offset for each partition of `spec`, once the tier is
/// seen to hold this topic as `spec` describes it.
fn archived_ends(
    tier: &ColdTier,
    spec: &TopicSpec,
    location: &ColdLocation,
    auth: Option<&RecordAuth>,
) -> Result<Vec<u64>, BusError> {
    let mut ends = Vec::new();
    for partition in 0..spec.partitions {
        let manifest = tier.manifest(&spec.name, partition)?;
        let end = manifest.end();
        if manifest.start().is_some() {
            // The newest object reads (and is this partition's), and its
            // newest record's tag verifies with this bus's control key, if
            // it has one: a restore with the wrong key would make every
            // history read an `Integrity` error.
            let newest = tier.read(&spec.name, partition, end - 1, 1)?;
            for record in newest {
                bus_cold::to_record(&spec.name, partition, record, auth)?;
            }
        }
        ends.push(end);
    }
    if !tier
        .manifest(&spec.name, spec.partitions)?
        .ranges
        .is_empty()
    {
        return Err(BusError::invalid(
            "spec.partitions",
            format!(
                "the cold tier at {location} holds partition {} of topic {:?}, more than the spec's {}",
                spec.partitions, spec.name, spec.partitions
            ),
        ));
    }
    if ends.iter().all(|&end| end == 0) {
        return Err(BusError::invalid(
            "location",
            format!(
                "the cold tier at {location} holds nothing of topic {:?}",
                spec.name
            ),
        ));
    }
    Ok(ends)
}
