//! One exit code per class of failure, each listed in `--help`; errors on one line.

use crate::support::*;

#[test]
fn help_lists_every_exit_code() {
    let dir = dir();
    let help = ok(&dir, &["--help"], None);
    for code in ["2 ", "3 ", "4 ", "5 ", "6 ", "7 ", "1 "] {
        assert!(
            help.lines().any(|line| line.trim_start().starts_with(code)),
            "exit code {code} missing from --help:\n{help}"
        );
    }
}

#[test]
fn a_conflicting_manifest_exits_5() {
    let dir = provisioned();
    let bad = dir._temp.path().join("conflict.toml");
    std::fs::write(&bad, "[[topics]]\nname = \"audit\"\npartitions = 2\n").expect("write");
    let result = run(&dir, &["provision", &bad.display().to_string()], None);
    assert_eq!(result.code, 5, "{}", result.stderr);
    assert!(result.stderr.contains("audit"), "{}", result.stderr);
}

#[test]
fn a_locked_directory_exits_6() {
    let dir = provisioned();
    // This process holds the embedded directory's writer lock.
    let _writer = bus::connect(&dir.url).expect("writer");
    let result = run_with(&dir, &["maintenance"], &[("BUS_LOCK_WAIT_MS", "200")]);
    assert_eq!(result.code, 6, "{}", result.stderr);
}

#[test]
fn a_damaged_record_exits_7() {
    let dir = provisioned();
    ok(
        &dir,
        &[
            "publish",
            "one",
            "--key",
            "k",
            r#"{"payload":"AAAAAAAAAAAA"}"#,
        ],
        None,
    );
    ok(&dir, &["publish", "one", "--key", "k", r#"{"n":2}"#], None);
    let log = dir
        ._temp
        .path()
        .join("data/topics/one/p0000/00000000000000000000.log");
    let mut bytes = std::fs::read(&log).expect("segment");
    let at = bytes
        .windows(4)
        .position(|window| window == b"AAAA")
        .expect("the value is in the segment");
    bytes[at] = b'B';
    std::fs::write(&log, bytes).expect("damage");
    let result = run(&dir, &["fetch", "one"], None);
    assert_eq!(result.code, 7, "{}", result.stderr);
}

#[test]
fn other_backend_failures_exit_1() {
    let dir = dir();
    let file = dir._temp.path().join("a-file");
    std::fs::write(&file, "not a directory").expect("write");
    let manifest = dir.manifest.display().to_string();
    let result = run(
        &dir,
        &[
            "--url",
            &format!("file://{}", file.display()),
            "provision",
            &manifest,
        ],
        None,
    );
    assert_eq!(result.code, 1, "{}", result.stderr);
}

#[test]
fn a_manifest_parse_error_is_one_line() {
    let dir = dir();
    let bad = dir._temp.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[topics]]\nname = \"x\"\npartitions = 1\npartitons = 2\n",
    )
    .expect("write");
    let result = run(&dir, &["provision", &bad.display().to_string()], None);
    assert_eq!(result.code, 2, "{}", result.stderr);
    assert_eq!(result.stderr.lines().count(), 1, "{}", result.stderr);
    assert!(result.stderr.contains("line 4"), "{}", result.stderr);
}

#[test]
fn read_commands_on_a_missing_directory_fail_and_create_nothing() {
    let dir = dir();
    let path = dir._temp.path().join("data");
    for args in [
        &["topics"][..],
        &["describe", "audit"],
        &["fetch", "audit", "--partition", "0"],
        &["find", "audit", "--key", "k", "--uid", "u"],
        &["tail", "audit"],
        &["maintenance"],
    ] {
        let result = run(&dir, args, None);
        assert_eq!(result.code, 2, "bus {args:?}: {}", result.stderr);
        assert!(
            result.stderr.contains("does not exist"),
            "bus {args:?}: {}",
            result.stderr
        );
        assert!(!path.exists(), "bus {args:?} created {}", path.display());
    }
}

#[test]
fn max_lag_without_follow_is_bad_usage() {
    let dir = provisioned();
    let result = run(&dir, &["tail", "audit", "--max-lag", "5"], None);
    assert_eq!(result.code, 2, "{}", result.stderr);
    assert!(result.stderr.contains("--follow"), "{}", result.stderr);
}
