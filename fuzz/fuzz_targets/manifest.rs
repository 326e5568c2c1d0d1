//! Manifest text (TOML or JSON) through `Manifest::parse` and the two
//! explicit parsers: never a panic, only `InvalidArgument` errors, and a
//! manifest that parses survives serialize → parse unchanged in both
//! formats (TOML only where its integers can hold the values).
#![no_main]

use bus_core::{BusError, Manifest};
use libfuzzer_sys::fuzz_target;

fn check(result: &Result<Manifest, BusError>) {
    if let Err(error) = result {
        assert!(
            matches!(error, BusError::InvalidArgument { .. }),
            "manifest errors name a field: {error:?}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = Manifest::parse(text);
    let toml = Manifest::from_toml_str(text);
    let json = Manifest::from_json_str(text);
    for result in [&parsed, &toml, &json] {
        check(result);
    }
    let by_syntax = if text.trim_start().starts_with('{') {
        &json
    } else {
        &toml
    };
    assert_eq!(parsed.as_ref().ok(), by_syntax.as_ref().ok());
    for manifest in [toml, json].into_iter().flatten() {
        manifest.validate().expect("a parsed manifest is valid");
        for topic in &manifest.topics {
            topic
                .conflict_with(topic)
                .expect("a topic agrees with itself");
        }
        let as_json = serde_json::to_string(&manifest).expect("to JSON");
        assert_eq!(
            Manifest::from_json_str(&as_json).expect("JSON again"),
            manifest
        );
        let fits_toml = manifest.topics.iter().all(|t| {
            [
                t.retention_ms.unwrap_or(0),
                t.dedup_window_ms,
                t.max_record_bytes,
                t.cold.as_ref().and_then(|c| c.retention_ms).unwrap_or(0),
            ]
            .iter()
            .all(|&v| i64::try_from(v).is_ok())
        });
        if fits_toml {
            let as_toml = toml::to_string(&manifest).expect("to TOML");
            assert_eq!(
                Manifest::from_toml_str(&as_toml).expect("TOML again"),
                manifest,
                "{as_toml}"
            );
        }
    }
});
