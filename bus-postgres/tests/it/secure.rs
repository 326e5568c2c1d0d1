//! TLS and passwords against a private PostgreSQL with `ssl=on`: a bus that
//! trusts the server's CA connects over TLS and works (subscriptions too); one
//! that trusts another CA is refused; a wrong password is refused; neither
//! error nor `Debug` shows the password.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bus_conformance::tls::Certificates;
use bus_core::{BusError, EventBus, Manifest, Selector, StartAt, SubscribeOptions, TopicSpec};
use bus_postgres::{PostgresBus, PostgresOptions};
use common::Server;
use serde_json::json;

const PASSWORD: &str = "bus";

/// Copies the server's certificate and key next to its data, readable by the
/// server's user only (PostgreSQL refuses a key others can read).
fn tls_setup(dir: &Path, certs: &Certificates) -> String {
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    std::fs::copy(&certs.server_cert, &cert).expect("copy cert");
    std::fs::copy(&certs.server_key, &key).expect("copy key");
    let root = Command::new("id").arg("-u").output().expect("id -u").stdout == b"0\n";
    if root {
        for file in [&cert, &key] {
            let status = Command::new("chown")
                .arg("postgres")
                .arg(file)
                .status()
                .expect("chown");
            assert!(status.success());
        }
    }
    let status = Command::new("chmod")
        .arg("600")
        .arg(&key)
        .status()
        .expect("chmod");
    assert!(status.success());
    format!(
        "-c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
        cert.display(),
        key.display()
    )
}

fn tls_url(server: &Server, ca: &Path, password: &str) -> String {
    let base = server
        .url
        .replace(&format!(":{PASSWORD}@"), &format!(":{password}@"));
    format!(
        "{base}?schema=secure&timeout_ms=3000&sslmode=verify-full&sslrootcert={}",
        ca.display()
    )
}

#[test]
fn tls_with_the_servers_ca_works_and_another_ca_or_password_is_refused() {
    let certs_dir = tempfile::tempdir().expect("certs dir");
    let certs = Certificates::generate(certs_dir.path());
    let Some(server) = Server::start_or_skip_with("tls", |dir| tls_setup(dir, &certs)) else {
        return;
    };

    let url = tls_url(&server, &certs.ca, PASSWORD);
    let options = PostgresOptions::from_url(&url).expect("url");
    assert!(options.tls.is_some());
    let bus = PostgresBus::connect_with(options).expect("connect over TLS");
    bus.provision(&Manifest::new([TopicSpec::new("t", 1)]))
        .expect("provision");
    let mut subscription = bus
        .subscribe(
            "t",
            Selector::Partition(0),
            StartAt::Beginning,
            SubscribeOptions::default(),
        )
        .expect("subscribe over TLS");
    let ack = bus
        .publish("t", "k", &json!({"tls": true}))
        .expect("publish");
    let item = subscription
        .recv_timeout(Duration::from_secs(10))
        .expect("recv")
        .expect("a record");
    assert_eq!(item.event().map(|e| e.offset), Some(ack.offset));

    let other_dir = tempfile::tempdir().expect("other certs dir");
    let other = Certificates::generate(other_dir.path());
    let refused = PostgresBus::connect(&tls_url(&server, &other.ca, PASSWORD));
    let error = refused.expect_err("a server whose CA is not trusted must be refused");
    assert!(
        error.is_transient() || matches!(error, BusError::BackendFailure { .. }),
        "{error:?}"
    );

    let secret = "not-the-password-9f3";
    let refused = PostgresBus::connect(&tls_url(&server, &certs.ca, secret));
    let error = refused.expect_err("a wrong password must be refused");
    let shown = format!("{error} {error:?}");
    assert!(!shown.contains(secret), "{shown}");
    let options = PostgresOptions::from_url(&tls_url(&server, &certs.ca, secret)).expect("url");
    assert!(!format!("{options:?}").contains(secret));
    assert!(!format!("{bus:?}").contains(&format!(":{PASSWORD}@")));
}
