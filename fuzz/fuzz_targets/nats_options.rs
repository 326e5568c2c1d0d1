//! `nats://` URLs through `NatsOptions::from_url`: never a panic, only
//! `InvalidArgument` errors, parsed options pass their own check, and their
//! `Debug` does not depend on the password or token (contract C13).
#![no_main]

use bus_core::BusError;
use bus_nats::NatsOptions;
use bus_nats::fuzzing::secrets;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(url) = std::str::from_utf8(data) else {
        return;
    };
    let options = match NatsOptions::from_url(url) {
        Ok(options) => options,
        Err(error) => {
            assert!(
                matches!(error, BusError::InvalidArgument { .. }),
                "{error:?}"
            );
            return;
        }
    };
    options.check().expect("parsed options pass their check");
    assert!(!options.servers.is_empty());
    let shown = format!("{options:?}");
    let (password, token) = secrets(&options);
    let mut other = options.clone();
    if let (Some(user), Some(password)) = (&options.user, password) {
        other = other.user_and_password(user.clone(), format!("{password}x"));
    }
    if let Some(token) = token {
        other = other.token(format!("{token}x"));
    }
    assert_eq!(format!("{other:?}"), shown, "Debug shows a secret");
});
