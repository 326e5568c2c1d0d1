//! Cold tiers a manifest declares (`[topics.cold]`, C24), as a
//! [`ColdBus`](super::ColdBus) keeps them: the location must be the bus's
//! own tier; the retention is the topic's cold retention in `maintenance`.

use std::collections::HashMap;

use bus_core::{BusError, Manifest};

use crate::ColdLocation;

/// Cold retention (ms; `None` = forever) of each topic that declares a tier.
pub(super) type Declared = HashMap<String, Option<u64>>;

/// The cold sections of `manifest`, each checked to name the tier at
/// `tier_location` (one `ColdBus` keeps one tier).
pub(super) fn declared(manifest: &Manifest, tier_location: &str) -> Result<Declared, BusError> {
    let mut declared = Declared::new();
    for (index, spec) in manifest.topics.iter().enumerate() {
        let Some(cold) = &spec.cold else {
            continue;
        };
        let field = format!("topics[{index}].cold.location");
        let location = ColdLocation::parse(&cold.location).map_err(|error| match error {
            BusError::InvalidArgument { reason, .. } => BusError::invalid(field.clone(), reason),
            other => other,
        })?;
        if location.to_string() != tier_location {
            return Err(BusError::invalid(
                field,
                format!(
                    "topic {:?} declares its cold tier at {location}, but this bus keeps its tier at \
                     {tier_location}; open a ColdBus on the declared location",
                    spec.name
                ),
            ));
        }
        declared.insert(spec.name.clone(), cold.retention_ms);
    }
    Ok(declared)
}
