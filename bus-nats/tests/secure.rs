//! TLS and authentication against real nats-servers of the test's own: one
//! requiring mutual TLS (a CA the test made) and a user and password, one
//! requiring a token. Each works by builder or URL; a wrong password or
//! token, a missing client certificate and an untrusted server certificate
//! fail within the timeouts, and no error or `Debug` text shows a secret.

mod common;

use std::time::Duration;

use bus_conformance::tls::Certificates;
use bus_conformance::util::{assert_refused_quietly, poll_until};
use bus_conformance::{brokers_required, loud};
use bus_core::{EventBus, Manifest, TopicSpec};
use bus_nats::{NatsBus, NatsOptions};
use common::{Server, free_port, server_binary, start};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(2);
const USER: (&str, &str) = ("alice", "alice-Pw-3b9d");
const TOKEN: &str = "tok-8e41c0";

fn options(url: &str) -> NatsOptions {
    NatsOptions::from_url(url)
        .unwrap_or_else(|e| panic!("url {url}: {e}"))
        .prefix("secure")
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT)
}

/// Checks that connecting with `options` fails in time without showing `secret`.
fn refused(what: &str, secret: &str, options: NatsOptions) {
    assert!(
        !format!("{options:?}").contains(secret),
        "{what}: Debug shows a secret"
    );
    let limit = TIMEOUT * 2 + Duration::from_secs(1);
    assert_refused_quietly(what, limit, &[secret], || NatsBus::connect_with(options));
}

/// Publishes, reads back and finds one record: the whole path works.
fn round_trip(bus: &NatsBus, topic: &str) {
    bus.provision(&Manifest::new([TopicSpec::new(topic, 1)]))
        .unwrap_or_else(|e| panic!("provision: {e}"));
    let ack = bus
        .publish_idempotent(topic, "k", &json!({"secure": true}), "evt-1")
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let got = bus
        .fetch(topic, 0, ack.offset, 10)
        .unwrap_or_else(|e| panic!("fetch: {e}"));
    assert_eq!(
        got.first().map(|e| &e.value),
        Some(&json!({"secure": true}))
    );
    assert_eq!(
        bus.find_event_by_uid(topic, "k", "evt-1").ok().flatten(),
        Some(ack)
    );
}

#[test]
fn tls_and_credentials_work_and_refuse_without_leaking_secrets() {
    let Some(binary) = server_binary() else {
        let why = "no nats-server (set BUS_NATS_SERVER_BIN, put it on PATH or run scripts/nats.sh install)";
        assert!(!brokers_required(), "BUS_REQUIRE_BROKERS=1 but {why}");
        loud(&format!("SKIPPED nats::secure: {why}"));
        return;
    };
    let certs_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let certs = Certificates::generate(certs_dir.path());

    // Mutual TLS and a user with a password.
    let store = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let port = free_port();
    let _tls_server = Server(start(
        &binary,
        port,
        store.path(),
        &format!(
            "tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify: true }}\n\
             authorization {{ users: [ {{ user: \"{}\", password: \"{}\" }} ] }}\n",
            certs.server_cert.display(),
            certs.server_key.display(),
            certs.ca.display(),
            USER.0,
            USER.1,
        ),
    ));
    let url = format!("tls://127.0.0.1:{port}");
    let good = options(&url)
        .user_and_password(USER.0, USER.1)
        .require_tls(Some(certs.ca.clone()))
        .client_certificate(certs.client_cert.clone(), certs.client_key.clone());
    assert!(
        !format!("{good:?}").contains(USER.1),
        "Debug shows the password"
    );
    let bus = poll_until("the TLS server to serve", Duration::from_secs(30), || {
        NatsBus::connect_with(good.clone()).ok()
    });
    round_trip(&bus, "mtls");
    drop(bus);
    let wrong = "wrong-Pw-0a7c";
    refused(
        "wrong password",
        wrong,
        options(&url)
            .user_and_password(USER.0, wrong)
            .require_tls(Some(certs.ca.clone()))
            .client_certificate(certs.client_cert.clone(), certs.client_key.clone()),
    );
    refused(
        "no client certificate",
        USER.1,
        options(&url)
            .user_and_password(USER.0, USER.1)
            .require_tls(Some(certs.ca.clone())),
    );
    refused(
        "a server certificate from an unknown CA",
        USER.1,
        options(&url)
            .user_and_password(USER.0, USER.1)
            .require_tls(None)
            .client_certificate(certs.client_cert.clone(), certs.client_key.clone()),
    );

    // A token, given in the URL.
    let store = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let port = free_port();
    let _token_server = Server(start(
        &binary,
        port,
        store.path(),
        &format!("authorization {{ token: \"{TOKEN}\" }}\n"),
    ));
    let with_token = options(&format!("nats://{TOKEN}@127.0.0.1:{port}"));
    assert!(
        !format!("{with_token:?}").contains(TOKEN),
        "Debug shows the token"
    );
    let bus = poll_until("the token server to serve", Duration::from_secs(30), || {
        NatsBus::connect_with(with_token.clone()).ok()
    });
    round_trip(&bus, "token");
    drop(bus);
    let wrong = "tok-wrong-55";
    refused(
        "wrong token",
        wrong,
        options(&format!("nats://{wrong}@127.0.0.1:{port}")),
    );
    refused(
        "no token",
        TOKEN,
        options(&format!("nats://127.0.0.1:{port}")),
    );
}
