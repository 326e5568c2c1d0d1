//! The `bus` command in a real terminal, driven through tmux (send-keys,
//! capture-pane): `tail --follow` read live and stopped with Ctrl-C, and the
//! progress line of a long publish. Skips loudly without tmux
//! (scripts/install-deps.sh installs it).
#![cfg(feature = "embedded")]

use std::process::Command;
use std::time::{Duration, Instant};

/// One tmux server of our own (its own socket), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(env: &[(&str, String)]) -> Option<Self> {
        if Command::new("tmux").arg("-V").output().is_err() {
            eprintln!("SKIPPED: tmux is not installed (scripts/install-deps.sh installs it)");
            return None;
        }
        let socket = format!("bus-cli-{}-{}", std::process::id(), bus::now_ms());
        let mut command = Command::new("tmux");
        command.args([
            "-L",
            &socket,
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "t",
        ]);
        command.args(["-x", "200", "-y", "50"]);
        for (name, value) in env {
            command.args(["-e", &format!("{name}={value}")]);
        }
        command.args(["bash", "--norc", "--noprofile"]);
        let status = command.status().expect("tmux new-session");
        assert!(status.success(), "tmux new-session failed");
        Some(Self { socket })
    }

    fn keys(&self, keys: &[&str]) {
        let status = Command::new("tmux")
            .args(["-L", &self.socket, "send-keys", "-t", "t"])
            .args(keys)
            .status()
            .expect("send-keys");
        assert!(status.success());
    }

    fn screen(&self) -> String {
        let output = Command::new("tmux")
            .args(["-L", &self.socket, "capture-pane", "-p", "-t", "t"])
            .output()
            .expect("capture-pane");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Polls the screen until `check` holds (20 s).
    fn wait_for(&self, what: &str, check: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let screen = self.screen();
            if check(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .status();
    }
}

fn bus_cmd(url: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_bus"))
        .env("BUS_URL", url)
        .env_remove("BUS_PROFILE")
        .args(args)
        .output()
        .expect("bus")
}

#[test]
fn tail_follow_in_a_terminal_shows_live_records_and_stops_on_ctrl_c() {
    let temp = tempfile::tempdir().expect("tempdir");
    let url = format!("file://{}", temp.path().join("data").display());
    let manifest = temp.path().join("topics.toml");
    std::fs::write(&manifest, "[[topics]]\nname = \"audit\"\npartitions = 2\n").expect("manifest");
    assert!(
        bus_cmd(&url, &["provision", &manifest.display().to_string()])
            .status
            .success()
    );
    assert!(
        bus_cmd(
            &url,
            &["publish", "audit", "--key", "a", r#"{"n":"first"}"#]
        )
        .status
        .success()
    );
    let Some(tmux) = Tmux::start(&[
        ("BUS_URL", url.clone()),
        (
            "BUS_CONFIG",
            temp.path().join("profiles.toml").display().to_string(),
        ),
        ("PATH", std::env::var("PATH").unwrap_or_default()),
    ]) else {
        return;
    };
    let bin = env!("CARGO_BIN_EXE_bus");
    tmux.keys(&[&format!("{bin} tail audit --follow"), "Enter"]);
    tmux.wait_for("the stored record", |screen| {
        screen.contains(r#""n":"first""#)
    });
    assert!(
        bus_cmd(&url, &["publish", "audit", "--key", "b", r#"{"n":"live"}"#])
            .status
            .success()
    );
    tmux.wait_for("the live record", |screen| screen.contains(r#""n":"live""#));
    tmux.keys(&["C-c"]);
    tmux.keys(&["echo tail-exit=$?", "Enter"]);
    tmux.wait_for("tail to stop on Ctrl-C", |screen| {
        screen.contains("tail-exit=130")
    });

    // A long publish shows its progress line on the terminal (stderr), and
    // clears it when done; stdout (the acks) goes to a file.
    // The second line waits for a file the test creates (typing into the
    // terminal would move the cursor under the progress line).
    let go = temp.path().join("go");
    tmux.keys(&[
        &format!(
            "(echo '{{\"n\":1}}'; until [ -e {go} ]; do sleep 0.05; done; echo '{{\"n\":2}}') | {bin} publish audit --key p > {acks}; echo publish-exit=$?",
            go = go.display(),
            acks = temp.path().join("acks").display()
        ),
        "Enter",
    ]);
    tmux.wait_for("the progress line", |screen| {
        screen
            .lines()
            .any(|line| line.starts_with("publish") && line.contains(" 1 "))
    });
    std::fs::write(&go, "").expect("go");
    let screen = tmux.wait_for("publish to finish", |screen| {
        screen.contains("publish-exit=0")
    });
    assert!(
        !screen.lines().any(|line| line.starts_with("publish ")),
        "the progress line is cleared:\n{screen}"
    );
    let acks = std::fs::read_to_string(temp.path().join("acks")).expect("acks");
    assert_eq!(acks.lines().count(), 2, "{acks}");
}
