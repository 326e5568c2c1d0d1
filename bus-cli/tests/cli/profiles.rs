//! Named profiles: `--profile` / `BUS_PROFILE`, secrets from the
//! environment or a file, never stored in the profiles file nor shown.

use serde_json::Value;

use crate::support::*;

#[test]
fn a_profile_picks_the_url_and_wins_over_bus_url() {
    let dir = provisioned();
    ok(&dir, &["profile", "add", "local", &dir.url], None);
    let listed = ok(&dir, &["profile", "ls"], None);
    assert!(listed.starts_with("local\t"), "{listed}");
    for (args, env) in [
        (&["--profile", "local", "topics", "--json"][..], None),
        (&["topics", "--json"][..], Some(("BUS_PROFILE", "local"))),
    ] {
        let mut command = bus(&dir);
        command.env("BUS_URL", "memory://").args(args);
        if let Some((name, value)) = env {
            command.env(name, value);
        }
        let output = command.output().expect("bus");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            text.contains("\"audit\""),
            "{args:?} {env:?} reads the profile's bus: {text}"
        );
    }
    let missing = run(&dir, &["--profile", "nope", "topics"], None);
    assert_eq!(missing.code, 4, "{}", missing.stderr);
}

#[test]
fn secrets_come_from_env_or_file_and_are_never_stored_or_shown() {
    let dir = dir();
    let refused = run(
        &dir,
        &["profile", "add", "inline", "nats://alice:PASSWORD-9@h:4222"],
        None,
    );
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(!refused.stderr.contains("PASSWORD-9"), "{}", refused.stderr);

    ok(
        &dir,
        &[
            "profile",
            "add",
            "prod",
            "kafkas://bob@kafka.example:9093?ca=/ca.pem",
            "--password-env",
            "PROD_PW",
        ],
        None,
    );
    let token_file = dir._temp.path().join("token");
    std::fs::write(&token_file, "TOKEN-9\n").expect("token");
    ok(
        &dir,
        &[
            "profile",
            "add",
            "edge",
            "nats://edge.example:4222",
            "--token-file",
            &token_file.display().to_string(),
        ],
        None,
    );
    let stored = std::fs::read_to_string(dir._temp.path().join("profiles.toml")).expect("file");
    assert!(
        stored.contains("PROD_PW") && !stored.contains("TOKEN-9"),
        "{stored}"
    );

    let show = run_with(
        &dir,
        &["profile", "show", "prod"],
        &[("PROD_PW", "PASSWORD-9")],
    );
    assert_eq!(show.code, 0, "{}", show.stderr);
    assert!(!show.stdout.contains("PASSWORD-9"), "{}", show.stdout);
    let shown: Value = serde_json::from_str(&show.stdout).expect("json");
    assert_eq!(
        shown["resolved_url"],
        "kafkas://bob:***@kafka.example:9093?ca=/ca.pem"
    );
    let edge = ok(&dir, &["profile", "show", "edge"], None);
    assert!(
        edge.contains("nats://***@edge.example:4222") && !edge.contains("TOKEN-9"),
        "{edge}"
    );
}
