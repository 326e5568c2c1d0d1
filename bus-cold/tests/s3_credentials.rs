//! Wrong and missing S3 credentials (C13, C24, #30): a SeaweedFS of the
//! test's own that takes one pair of keys. The right keys archive and
//! read; a wrong secret, an unknown key id and no keys at all are each a
//! clear, non-retryable error that names the refusal and never shows the
//! secret, and archive nothing.
#![allow(clippy::unwrap_used)]

mod common;

use bus_cold::{ColdLocation, ColdTier};
use bus_core::BusError;
use common::server::Server;
use common::{records, unique};

const KEY_ID: &str = "AKBUSCOLDTEST";
const SECRET: &str = "the-right-secret-0123456789";

/// `server`'s location under `prefix`, signed with `keys` (or anonymous).
fn with_keys(server: &Server, prefix: &str, keys: Option<(&str, &str)>) -> ColdLocation {
    let mut location = server.location(prefix);
    if let ColdLocation::S3 { s3, .. } = &mut location {
        s3.access_key_id = keys.map(|(id, _)| id.to_owned());
        s3.secret_access_key = keys.map(|(_, secret)| secret.to_owned().into());
    }
    location
}

#[test]
fn wrong_or_missing_credentials_are_a_clear_error_and_archive_nothing() {
    if common::s3("s3-credentials").is_none() {
        return;
    }
    let server = Server::with_keys(KEY_ID, SECRET);
    server.start();
    let prefix = unique("s3-credentials");
    let topic = "creds";
    let right = ColdTier::open(&with_keys(&server, &prefix, Some((KEY_ID, SECRET)))).unwrap();
    right.check().unwrap();
    assert_eq!(
        right
            .archive_records(topic, 0, &records(topic, 0, 0, 10))
            .unwrap(),
        10
    );

    let wrong_secret = "a-wrong-secret-9876543210";
    let refused = [
        ("a wrong secret", Some((KEY_ID, wrong_secret))),
        ("an unknown key id", Some(("AKUNKNOWN", wrong_secret))),
        ("no keys", None),
    ];
    for (what, keys) in refused {
        let tier = ColdTier::open(&with_keys(&server, &prefix, keys)).unwrap();
        for (call, outcome) in [
            ("check", tier.check().map(|()| 0)),
            (
                "archive",
                tier.archive_records(topic, 0, &records(topic, 0, 10, 20)),
            ),
            ("read", tier.read(topic, 0, 0, 10).map(|r| r.len() as u64)),
        ] {
            let error = outcome.expect_err(&format!("{what}: {call} succeeded"));
            let text = format!("{error} {error:?}");
            assert!(
                matches!(&error, BusError::InvalidArgument { field, .. } if field == "cold.credentials"),
                "{what}: {call}: {error:?}"
            );
            assert!(!error.is_transient(), "{what}: {call}: retryable: {error}");
            assert!(text.contains("refused"), "{what}: {call}: {text}");
            assert!(
                !text.contains(SECRET) && !text.contains(wrong_secret),
                "{what}: {call}: {text}"
            );
        }
    }
    // Nothing was archived by the refused tiers: the tier ends where the
    // right keys left it.
    assert_eq!(right.manifest(topic, 0).unwrap().end(), 10);
    assert_eq!(right.read(topic, 0, 0, 100).unwrap().len(), 10);
}
