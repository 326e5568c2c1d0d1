//! `-v` and `RUST_LOG`: the library's tracing events reach stderr, never
//! stdout, and only when asked for.

use crate::support::*;

const ROUND: &str = "group-commit round written and synced";

#[test]
fn quiet_by_default() {
    let dir = provisioned();
    let run = run(&dir, &["publish", "one", "--key", "k", "1"], None);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!run.stderr.contains(ROUND), "stderr: {}", run.stderr);
    assert_eq!(json_lines(&run.stdout).len(), 1);
}

#[test]
fn double_v_shows_debug_events_on_stderr_only() {
    let dir = provisioned();
    let run = run(&dir, &["-vv", "publish", "one", "--key", "k", "1"], None);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains(ROUND), "stderr: {}", run.stderr);
    assert!(run.stderr.contains("DEBUG"), "stderr: {}", run.stderr);
    // stdout is still exactly one JSON ack.
    let acks = json_lines(&run.stdout);
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0]["offset"], 0);
}

#[test]
fn one_v_is_not_debug() {
    let dir = provisioned();
    let run = run(&dir, &["-v", "publish", "one", "--key", "k", "1"], None);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!run.stderr.contains(ROUND), "stderr: {}", run.stderr);
}

#[test]
fn rust_log_wins_over_the_flags() {
    let dir = provisioned();
    let run = run_with(
        &dir,
        &["publish", "one", "--key", "k", "1"],
        &[("RUST_LOG", "bus_embedded=debug")],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains(ROUND), "stderr: {}", run.stderr);
}
