//! Cold tiers a manifest declares (`[topics.cold]`, C24), as a
//! [`ColdBus`](super::ColdBus) keeps them: the location must be the bus's
//! own tier; the retention is the topic's cold retention in `maintenance`.

use std::collections::HashMap;

use bus_core::{BusError, Manifest};

use crate::declared_locations;

/// Cold retention (ms; `None` = forever) of each topic that declares a tier.
pub(super) type Declared = HashMap<String, Option<u64>>;

/// The cold sections of `manifest`, each checked to name the tier at
/// `tier_location` (one `ColdBus` keeps one tier).
pub(super) fn declared(manifest: &Manifest, tier_location: &str) -> Result<Declared, BusError> {
    let mut declared = Declared::new();
    for (index, spec, location) in declared_locations(manifest)? {
        if location.to_string() != tier_location {
            return Err(BusError::invalid(
                format!("topics[{index}].cold.location"),
                format!(
                    "topic {:?} declares its cold tier at {location}, but this bus keeps its tier at \
                     {tier_location}; open a ColdBus on the declared location",
                    spec.name
                ),
            ));
        }
        let retention_ms = spec.cold.as_ref().and_then(|cold| cold.retention_ms);
        declared.insert(spec.name.clone(), retention_ms);
    }
    Ok(declared)
}
