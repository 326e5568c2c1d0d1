//! Secrets in a URL never reach `--help`, error lines or warnings.

use crate::support::*;

const SECRETS: [&str; 4] = ["PASSWORD-1", "TOKEN-2", "secret-dir-3", "PASSWORD-4"];

#[test]
fn help_never_shows_the_value_of_bus_url() {
    let dir = dir();
    for args in [&["--help"][..], &["topics", "--help"], &["tail", "--help"]] {
        let help = bus(&dir)
            .env("BUS_URL", "nats://alice:PASSWORD-1@127.0.0.1:4222")
            .args(args)
            .output()
            .expect("bus --help");
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(text.contains("BUS_URL"), "the variable is named: {text}");
        assert!(
            !text.contains("PASSWORD-1"),
            "{args:?} leaks the password:\n{text}"
        );
    }
}

#[test]
fn error_lines_never_show_a_password_a_token_or_a_creds_path() {
    let dir = dir();
    let data = dir._temp.path().join("data").display().to_string();
    let urls = [
        format!("file://{data}?token=TOKEN-2"),
        "nats://alice:PASSWORD-1@127.0.0.1:1?connect_timeout_ms=300&timeout_ms=300".to_owned(),
        "nats://127.0.0.1:1?creds=/tmp/secret-dir-3/alice.creds&connect_timeout_ms=300".to_owned(),
        "nats://TOKEN-2@127.0.0.1:1?connect_timeout_ms=300&timeout_ms=300".to_owned(),
        "kafkas://bob:PASSWORD-4@127.0.0.1:1?timeout_ms=300".to_owned(),
        "carrier-pigeon://bob:PASSWORD-4@roof".to_owned(),
    ];
    for url in &urls {
        let result = run(&dir, &["--url", url, "topics"], None);
        assert_ne!(result.code, 0, "{url} cannot work");
        for secret in SECRETS {
            assert!(
                !result.stderr.contains(secret) && !result.stdout.contains(secret),
                "{url}: {secret} leaked: {}",
                result.stderr
            );
        }
        assert_eq!(
            result.stderr.lines().count(),
            1,
            "one line: {}",
            result.stderr
        );
    }
}
