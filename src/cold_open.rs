//! [`open`](crate::open) with a manifest that declares cold tiers (feature
//! `cold`, contract C24): a broker backend is wrapped in a [`ColdBus`] on
//! the declared location; the embedded log keeps its tiers itself.

use std::sync::Arc;

use bus_cold::{ColdBus, ColdBusOptions, ColdLocation, ColdTier, declared_locations};
use bus_core::{BusError, Manifest};

use crate::Bus;

/// `bus`, wrapped in a [`ColdBus`] when `manifest` declares a cold tier and
/// the backend of `url` does not keep one itself. Every declaration must
/// name one location (a bus opened by URL keeps one tier), which must answer.
pub(crate) fn keep_declared(
    url: &str,
    bus: Box<dyn Bus>,
    manifest: &Manifest,
) -> Result<Box<dyn Bus>, BusError> {
    if crate::backend_of(url)?.name == "embedded" {
        return Ok(bus);
    }
    let mut chosen: Option<(String, ColdLocation)> = None;
    for (index, spec, location) in declared_locations(manifest)? {
        match &chosen {
            None => chosen = Some((spec.name.clone(), location)),
            Some((first, have)) if have.to_string() != location.to_string() => {
                return Err(BusError::invalid(
                    format!("topics[{index}].cold.location"),
                    format!(
                        "a bus opened by URL keeps one cold tier: topic {first:?} declares {have}, \
                         topic {:?} declares {location}",
                        spec.name
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    let Some((_, location)) = chosen else {
        return Ok(bus);
    };
    let tier = ColdTier::open(&location)?;
    tier.check()?;
    Ok(Box::new(ColdBus::new(
        bus,
        Arc::new(tier),
        ColdBusOptions::default(),
    )))
}
