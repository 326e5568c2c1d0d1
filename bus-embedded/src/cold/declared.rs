//! Cold tiers a topic's manifest declares (`[topics.cold]`, C24): opened
//! and checked before `provision` creates anything, attached after it, and
//! kept by `maintenance` (archive through the head, then hot retention,
//! which drops archived segments only, then cold retention).

use bus_cold::{ColdLocation, ColdTier};
use bus_core::{BusError, Manifest, TopicSpec};

use super::{archive_all, attached, expire_cold, remember, topic_dir};
use crate::EmbeddedBus;

/// A declared tier, opened and answering.
pub(crate) struct Declared {
    topic: String,
    location: ColdLocation,
    tier: ColdTier,
}

/// Opens and checks every tier `manifest` declares, before provision
/// creates or changes anything: a location that does not parse, a store
/// that does not answer (no such bucket, refused credentials, no server)
/// or a location other than the one the topic's tier already has fails the
/// whole manifest.
pub(crate) fn open_declared(
    bus: &EmbeddedBus,
    manifest: &Manifest,
) -> Result<Vec<Declared>, BusError> {
    let mut declared = Vec::new();
    for (_, spec, location) in bus_cold::declared_locations(manifest)? {
        if let Some(have) = current_location(bus, &spec.name)?
            && have != location.to_string()
        {
            return Err(BusError::Conflict {
                topic: spec.name.clone(),
                property: "cold.location".to_owned(),
                existing: have,
                requested: location.to_string(),
                fix: "keep the location the topic's history was archived to (move the objects there first to change it)"
                    .to_owned(),
            });
        }
        let tier = ColdTier::open(&location)?;
        tier.check()?;
        declared.push(Declared {
            topic: spec.name.clone(),
            location,
            tier,
        });
    }
    Ok(declared)
}

/// The location of the tier `topic` has now, if it exists and has one.
fn current_location(bus: &EmbeddedBus, topic: &str) -> Result<Option<String>, BusError> {
    let Ok(topic) = bus.inner.topic(topic) else {
        return Ok(None);
    };
    let Some(partition) = topic.partitions.first() else {
        return Ok(None);
    };
    Ok(attached(partition)?.map(|attached| attached.tier.location().to_owned()))
}

/// Attaches the tiers [`open_declared`] opened, once provision created
/// their topics; retention then drops only what the tier holds. A topic
/// already attached there is left as it is (nothing written: a read-only
/// bus provisions a manifest its writer already applied).
pub(crate) fn attach_declared(bus: &EmbeddedBus, declared: Vec<Declared>) -> Result<(), BusError> {
    for Declared {
        topic,
        location,
        tier,
    } in declared
    {
        let part = bus.inner.readable(&topic, 0)?;
        let same = attached(&part)?.is_some_and(|have| {
            have.expire_only_archived && have.tier.location() == location.to_string()
        });
        if same {
            continue;
        }
        bus.inner.writable("provision")?;
        let dir = topic_dir(&part)
            .ok_or_else(|| BusError::backend("embedded", "topic has no directory"))?;
        remember(dir, tier, &location, true)?;
    }
    Ok(())
}

/// `maintenance`, before hot retention: a topic that declares a tier has
/// its acked records archived through the head, so that retention (which
/// drops archived segments only) can drop all it should.
pub(crate) fn archive_for_retention(bus: &EmbeddedBus, spec: &TopicSpec) -> Result<(), BusError> {
    if spec.cold.is_some() {
        archive_all(bus, &spec.name)?;
    }
    Ok(())
}

/// `maintenance`, after hot retention: cold objects whose newest record is
/// older than the declared cold retention are deleted. Returns the records
/// expired.
pub(crate) fn cold_retention(
    bus: &EmbeddedBus,
    spec: &TopicSpec,
    now_ms: u64,
) -> Result<u64, BusError> {
    match spec.cold.as_ref().and_then(|cold| cold.retention_ms) {
        Some(keep) => expire_cold(bus, &spec.name, now_ms.saturating_sub(keep)),
        None => Ok(0),
    }
}
