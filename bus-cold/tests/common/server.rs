//! A SeaweedFS of a test's own (`scripts/seaweedfs.sh` on free ports and
//! its own directory), optionally taking only one pair of keys.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use bus_cold::{ColdLocation, S3Location};

/// A SeaweedFS of the test's own, stopped when dropped.
pub struct Server {
    dir: tempfile::TempDir,
    ports: [(&'static str, u16); 4],
    /// The only keys the server takes (an identities file), if any.
    keys: Option<(String, String)>,
}

impl Server {
    /// Four free ports whose gRPC twins (port + 10000) are free too, all
    /// below the kernel's ephemeral range (32768 and up), so no client
    /// connection of another test takes one before the server binds it.
    pub fn new() -> Self {
        let mut ports = Vec::new();
        let mut pick = u16::try_from(std::process::id() % 2_000).unwrap_or(0);
        while ports.len() < 4 {
            pick = (pick + 7) % 2_000;
            let port = 20_000 + pick;
            if port_free(port) && port_free(port + 10_000) && !ports.contains(&port) {
                ports.push(port);
            }
        }
        Self {
            dir: tempfile::tempdir().unwrap(),
            ports: [
                ("BUS_S3_PORT", ports[0]),
                ("BUS_SEAWEEDFS_MASTER_PORT", ports[1]),
                ("BUS_SEAWEEDFS_VOLUME_PORT", ports[2]),
                ("BUS_SEAWEEDFS_FILER_PORT", ports[3]),
            ],
            keys: None,
        }
    }

    /// A server that takes only `access_key` / `secret_key` (anonymous
    /// and other requests are refused with 403).
    pub fn with_keys(access_key: &str, secret_key: &str) -> Self {
        let mut server = Self::new();
        let identities = serde_json::json!({
            "identities": [{
                "name": "bus",
                "credentials": [{ "accessKey": access_key, "secretKey": secret_key }],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }]
        });
        std::fs::write(server.identities(), identities.to_string()).unwrap();
        server.keys = Some((access_key.to_owned(), secret_key.to_owned()));
        server
    }

    fn identities(&self) -> PathBuf {
        self.dir.path().join("s3.json")
    }

    pub fn script(&self, command: &str) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/seaweedfs.sh");
        let mut run = Command::new("bash");
        run.arg(script).arg(command).envs(self.env());
        if command == "start" {
            run.arg(self.data());
        }
        let output = run.output().unwrap();
        assert!(
            output.status.success(),
            "seaweedfs.sh {command}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The script's port variables (and the identities file and keys).
    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env: Vec<(&'static str, String)> = self
            .ports
            .iter()
            .map(|(name, port)| (*name, port.to_string()))
            .collect();
        if let Some((access_key, secret_key)) = &self.keys {
            env.push((
                "BUS_SEAWEEDFS_S3_CONFIG",
                self.identities().display().to_string(),
            ));
            env.push(("AWS_ACCESS_KEY_ID", access_key.clone()));
            env.push(("AWS_SECRET_ACCESS_KEY", secret_key.clone()));
        }
        env
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn start(&self) {
        self.script("start");
    }

    pub fn stop(&self) {
        self.script("stop");
    }

    pub fn location(&self, prefix: &str) -> ColdLocation {
        ColdLocation::S3 {
            s3: S3Location {
                endpoint: Some(format!("http://127.0.0.1:{}", self.ports[0].1)),
                bucket: "bus-cold".into(),
                region: "us-east-1".into(),
                access_key_id: None,
                secret_access_key: None,
            },
            prefix: prefix.to_owned(),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/seaweedfs.sh");
        let _ = Command::new("bash")
            .arg(script)
            .arg("stop")
            .envs(self.env())
            .output();
    }
}

fn port_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}
