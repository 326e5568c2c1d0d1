//! C24 bad configuration: a bucket that does not exist, an unreachable
//! endpoint, credentials in a location — each a clear error naming what is
//! wrong, nothing archived, and secrets never printed.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

mod common;

use bus_cold::{ColdLocation, ColdTier, S3Location};
use bus_core::BusError;
use common::{records, unique};
use secrecy::SecretString;

const SECRET: &str = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY";

fn s3(endpoint: &str, bucket: &str) -> ColdLocation {
    ColdLocation::S3 {
        s3: S3Location {
            endpoint: Some(endpoint.to_owned()),
            bucket: bucket.to_owned(),
            region: "us-east-1".into(),
            access_key_id: Some("AKIDEXAMPLE".into()),
            secret_access_key: Some(SecretString::from(SECRET)),
        },
        prefix: "p".into(),
    }
}

fn no_secret(text: &str) {
    assert!(!text.contains(SECRET), "a secret was printed: {text}");
}

#[test]
fn an_unreachable_endpoint_is_unavailable_naming_it_without_secrets() {
    // Port 1 on loopback: nothing listens there.
    let location = s3("http://127.0.0.1:1", "bucket");
    no_secret(&format!("{location:?} {location}"));
    let tier = ColdTier::open(&location).unwrap();
    let error = tier.check().unwrap_err();
    assert!(matches!(error, BusError::Unavailable { .. }), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains("127.0.0.1:1") || text.contains("s3://bucket"),
        "{text}"
    );
    no_secret(&text);
    no_secret(&format!("{error:?}"));
    let error = tier
        .archive_records("t", 0, &records("t", 0, 0, 3))
        .unwrap_err();
    assert!(error.is_transient(), "an outage is retryable: {error}");
    no_secret(&format!("{error} {error:?}"));
}

#[test]
fn a_bucket_that_does_not_exist_is_a_clear_error_and_nothing_is_archived() {
    let Some(ColdLocation::S3 { s3: real, .. }) = common::s3("config-missing-bucket") else {
        return;
    };
    let endpoint = real.endpoint.unwrap();
    let bucket = unique("no-such-bucket").to_lowercase();
    let tier = ColdTier::open(&s3(&endpoint, &bucket)).unwrap();
    let error = tier.check().unwrap_err();
    let text = format!("{error}");
    assert!(
        matches!(error, BusError::InvalidArgument { .. }),
        "not retryable: {error:?}"
    );
    assert!(
        text.contains(&bucket) && text.contains("does not exist"),
        "{text}"
    );
    no_secret(&format!("{error} {error:?}"));
    assert!(
        tier.archive_records("t", 0, &records("t", 0, 0, 3))
            .is_err()
    );
    eprintln!("missing bucket: {text}");
}

#[test]
fn credentials_in_a_location_are_refused_and_never_shown() {
    for url in [
        format!("s3://AKID:{SECRET}@bucket/p"),
        format!("s3://bucket/p?endpoint=http://x&secret={SECRET}"),
    ] {
        let error = ColdLocation::parse(&url).unwrap_err();
        assert!(matches!(error, BusError::InvalidArgument { .. }), "{error}");
        no_secret(&error.to_string());
    }
    let parsed =
        ColdLocation::parse("s3://bucket/some/prefix?endpoint=http://127.0.0.1:8333").unwrap();
    assert_eq!(
        parsed.to_string(),
        "s3://bucket/some/prefix?endpoint=http://127.0.0.1:8333&region=us-east-1"
    );
    assert!(ColdLocation::parse("ftp://x").is_err());
    assert!(matches!(
        ColdLocation::parse("memory:").unwrap(),
        ColdLocation::Memory
    ));
}

#[test]
fn a_local_tier_in_an_unwritable_place_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let error = ColdTier::open(&ColdLocation::Local {
        root: file.join("below"),
    })
    .unwrap_err();
    assert!(!error.to_string().is_empty());
    let _ = unique("x");
}
