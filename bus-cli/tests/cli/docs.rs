//! Help with examples, shell completions and the man page, all from the
//! same definitions.

use crate::support::*;

#[test]
fn every_subcommand_has_help_with_an_example() {
    let dir = dir();
    for sub in [
        &["provision"][..],
        &["topics"],
        &["describe"],
        &["publish"],
        &["fetch"],
        &["tail"],
        &["find"],
        &["consume"],
        &["consumers"],
        &["consumer"],
        &["consumer", "reset"],
        &["consumer", "delete"],
        &["bench"],
        &["maintenance"],
        &["profile"],
        &["profile", "add"],
        &["completions"],
        &["man"],
    ] {
        let mut args = sub.to_vec();
        args.push("--help");
        let help = ok(&dir, &args, None);
        assert!(
            help.contains("Example"),
            "{sub:?} --help lacks an example:\n{help}"
        );
    }
}

#[test]
fn completions_and_man_page_are_generated() {
    let dir = dir();
    let bash = ok(&dir, &["completions", "bash"], None);
    assert!(bash.contains("_bus") && bash.contains("tail"), "{bash}");
    let zsh = ok(&dir, &["completions", "zsh"], None);
    assert!(zsh.starts_with("#compdef bus"), "{zsh}");
    let man = ok(&dir, &["man"], None);
    assert!(man.contains(".TH bus") && man.contains("BUS_URL"), "{man}");
}

#[test]
fn bench_with_a_url_measures_only_that_backend() {
    let dir = dir();
    let out = ok(
        &dir,
        &[
            "--url",
            "memory://",
            "bench",
            "--records",
            "200",
            "--samples",
            "20",
            "--threads",
            "2",
            "--idle-secs",
            "0",
            "--json",
        ],
        None,
    );
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).expect("rows");
    assert!(!rows.is_empty());
    assert!(
        rows.iter().all(|row| row["backend"] == "memory"),
        "{rows:?}"
    );
}

#[test]
fn bench_on_a_named_directory_runs_beside_it_and_leaves_it_alone() {
    let dir = provisioned();
    let data = dir._temp.path().join("data");
    let listing = |path: &std::path::Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(path)
            .expect("list")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    };
    let before = listing(&data);
    let result = run(
        &dir,
        &[
            "--url",
            &dir.url,
            "bench",
            "--records",
            "200",
            "--samples",
            "20",
            "--threads",
            "2",
            "--idle-secs",
            "0",
            "--json",
        ],
        None,
    );
    assert_eq!(result.code, 0, "{}", result.stderr);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&result.stdout).expect("rows");
    assert!(
        rows.iter().all(|row| row["backend"] == "embedded"),
        "{rows:?}"
    );
    let beside = ".data.bench-";
    assert!(
        result.stderr.contains(beside),
        "the bench says where it ran: {}",
        result.stderr
    );
    assert_eq!(listing(&data), before, "the named bus was written to");
    assert!(
        !listing(dir._temp.path())
            .iter()
            .any(|name| name.contains(beside)),
        "the bench directory was left behind"
    );
}
