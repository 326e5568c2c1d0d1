//! `kafka://` URLs through `KafkaOptions::from_url`: never a panic, only
//! `InvalidArgument` errors (from parsing and from `validate`), the
//! librdkafka configuration builds, and `Debug` does not depend on the
//! password (contract C13).
#![no_main]

use bus_core::BusError;
use bus_kafka::KafkaOptions;
use bus_kafka::fuzzing::{client_config, sasl};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(url) = std::str::from_utf8(data) else {
        return;
    };
    let options = match KafkaOptions::from_url(url) {
        Ok(options) => options,
        Err(error) => {
            assert!(
                matches!(error, BusError::InvalidArgument { .. }),
                "{error:?}"
            );
            return;
        }
    };
    if let Err(error) = options.validate() {
        assert!(
            matches!(error, BusError::InvalidArgument { .. }),
            "{error:?}"
        );
    }
    let config = client_config(&options);
    assert!(config.iter().any(|(k, _)| k == "bootstrap.servers"));
    if let Some((mechanism, user, password)) = sasl(&options) {
        let other = options
            .clone()
            .sasl(mechanism, user, format!("{password}x"));
        assert_eq!(
            format!("{other:?}"),
            format!("{options:?}"),
            "Debug shows the password"
        );
    }
});
