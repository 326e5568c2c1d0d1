//! `bus::connect` / `bus::open` URL routing, with no backend compiled in
//! (so nothing connects or touches the file system): never a panic;
//! `memory://` opens, the other known schemes name their cargo feature,
//! anything else is an `InvalidArgument` naming `url` (so is a `file://`
//! URL whose query holds an unknown option); a manifest that
//! parses is provisioned on the memory bus.
#![no_main]

use bus::{BusError, Manifest};
use libfuzzer_sys::fuzz_target;

fn scheme(url: &str) -> &str {
    url.split_once("://").map_or("file", |(scheme, _)| scheme)
}

// The input is the URL, then optionally a newline and a manifest.
fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (url, manifest) = text.split_once('\n').unwrap_or((text, ""));
    let scheme = scheme(url);
    match bus::connect(url) {
        Ok(bus) => {
            assert_eq!(scheme, "memory");
            assert!(bus.topics().is_empty());
        }
        Err(BusError::FeatureDisabled {
            scheme: named,
            feature,
        }) => {
            // The backend crates own their schemes: the facade's table.
            let backend = bus::backends()
                .into_iter()
                .find(|backend| backend.schemes.contains(&scheme))
                .unwrap_or_else(|| panic!("{scheme:?} routed to a backend"));
            assert!(!backend.enabled);
            let expected = (scheme, backend.feature);
            assert_eq!((named.as_str(), feature.as_str()), expected);
        }
        Err(BusError::InvalidArgument { field, .. }) => {
            assert_eq!(field, "url");
            let bad_file_option = scheme == "file" && url.contains('?');
            let known = bus::backends()
                .iter()
                .any(|backend| backend.schemes.contains(&scheme));
            assert!(bad_file_option || !known, "{url:?}");
        }
        Err(other) => panic!("unexpected error {other:?}"),
    }
    let Ok(manifest) = Manifest::parse(manifest) else {
        return;
    };
    match bus::open(url, &manifest) {
        Ok(bus) => {
            assert_eq!(scheme, "memory");
            for topic in &manifest.topics {
                assert_eq!(
                    bus.partitions(&topic.name).expect("provisioned"),
                    topic.partitions
                );
            }
        }
        Err(error) => assert!(
            matches!(
                error,
                BusError::FeatureDisabled { .. } | BusError::InvalidArgument { .. }
            ),
            "{error:?}"
        ),
    }
});
