//! Record authentication on arbitrary parts and tags: the bus's own tag
//! verifies, any other tag does not, and the hex carried in NATS/Kafka
//! headers has one spelling per tag (up to case).
#![no_main]

use arbitrary::Arbitrary;
use bus_core::auth::{RecordAuth, RecordParts, TagFault, from_hex, to_hex};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input<'a> {
    control_key: [u8; 32],
    topic: &'a str,
    partition: u32,
    key: &'a str,
    uid: Option<&'a str>,
    value: &'a [u8],
    tag: &'a [u8],
    hex: &'a str,
}

fuzz_target!(|input: Input<'_>| {
    let auth = RecordAuth::new(&input.control_key);
    let parts = RecordParts {
        topic: input.topic,
        partition: input.partition,
        key: input.key,
        uid: input.uid,
        value: input.value,
    };
    let own = auth.tag(parts);
    assert!(auth.verify(parts, &own));
    assert_eq!(auth.check(parts, Some(&own)), Ok(()));
    assert_eq!(auth.check(parts, None), Err(TagFault::Missing));
    let genuine = input.tag == own;
    assert_eq!(auth.verify(parts, input.tag), genuine);
    assert_eq!(
        auth.check(parts, Some(input.tag)),
        if genuine {
            Ok(())
        } else {
            Err(TagFault::Mismatch)
        }
    );
    assert_eq!(from_hex(&to_hex(input.tag)).as_deref(), Some(input.tag));
    if let Some(bytes) = from_hex(input.hex) {
        assert_eq!(
            to_hex(&bytes),
            input.hex.to_ascii_lowercase(),
            "{:?} decodes as hex but is not the hex of its bytes",
            input.hex
        );
    }
});
