//! Which named settings hold secrets, for every place that prints settings
//! (`Debug`, error messages, the CLI's redaction and profiles).

/// Fragments of a setting's name that mark its value as a secret (or as
/// the secret itself in PEM form): passwords and passphrases, tokens,
/// client secrets, private keys inline, JAAS and OAuth configurations.
const SECRET_FRAGMENTS: &[&str] = &[
    "pass",
    "secret",
    "token",
    "pem",
    "jaas",
    "config",
    "credential",
    "private",
];

/// Whether a setting named `name` (e.g. a librdkafka property such as
/// `ssl.key.password`, `sasl.oauthbearer.client.secret` or `ssl.key.pem`)
/// holds a secret. Errs on the side of hiding: a harmless value under a
/// secret-looking name is hidden too.
#[must_use]
pub fn is_secret_setting(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_FRAGMENTS
        .iter()
        .any(|fragment| name.contains(fragment))
}

#[cfg(test)]
mod tests {
    use super::is_secret_setting;

    #[test]
    fn secret_settings_are_recognised() {
        for name in [
            "ssl.key.password",
            "ssl.key.pem",
            "ssl.keystore.password",
            "sasl.password",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
            "sasl.oauthbearer.assertion.private.key.passphrase",
            "sasl.oauthbearer.assertion.private.key.pem",
            "SSL.KEY.PASSWORD",
        ] {
            assert!(is_secret_setting(name), "{name}");
        }
        for name in [
            "client.id",
            "linger.ms",
            "ssl.endpoint.identification.algorithm",
        ] {
            assert!(!is_secret_setting(name), "{name}");
        }
    }
}
