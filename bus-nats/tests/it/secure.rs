//! TLS and authentication against real nats-servers of the test's own: one
//! requiring mutual TLS (a CA the test made) and a user and password, one
//! requiring a token, one in operator mode taking a `.creds` file (JWTs the
//! test signed). Each works by builder or URL; a wrong password or token, a
//! missing client certificate, an untrusted server certificate and a user of
//! an untrusted account fail within the timeouts, and no error or `Debug`
//! text shows a secret.

use crate::common;

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bus_conformance::tls::Certificates;
use bus_conformance::util::{assert_refused_quietly, poll_until};
use bus_core::{EventBus, Manifest, TopicSpec};
use bus_nats::{NatsBus, NatsOptions};
use common::{Server, free_port, server_binary_or_skip, start};
use nkeys::KeyPair;
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
    let Some(binary) = server_binary_or_skip("secure") else {
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

/// A JWT signed by `issuer`, as `nsc` would write it (claims version 2).
fn signed_jwt(issuer: &KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    let encode = |bytes: &[u8]| URL_SAFE_NO_PAD.encode(bytes);
    let header = json!({"typ": "JWT", "alg": "ed25519-nkey"});
    let iat = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let claims = json!({
        "jti": uuid::Uuid::new_v4().simple().to_string().to_uppercase(),
        "iat": iat,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let signed = format!(
        "{}.{}",
        encode(header.to_string().as_bytes()),
        encode(claims.to_string().as_bytes())
    );
    let signature = issuer
        .sign(signed.as_bytes())
        .unwrap_or_else(|e| panic!("sign: {e}"));
    format!("{signed}.{}", encode(&signature))
}

/// An account JWT signed by `operator`; JetStream on when `jetstream`.
fn account_jwt(operator: &KeyPair, account: &KeyPair, name: &str, jetstream: bool) -> String {
    let js = if jetstream { -1 } else { 0 };
    signed_jwt(
        operator,
        &account.public_key(),
        name,
        json!({
            "type": "account",
            "version": 2,
            "limits": {
                "subs": -1, "data": -1, "payload": -1,
                "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1,
                "mem_storage": js, "disk_storage": js, "streams": js, "consumer": js,
            },
        }),
    )
}

/// A `.creds` file for a new user of `account`.
fn creds(account: &KeyPair, name: &str) -> String {
    let user = KeyPair::new_user();
    let jwt = signed_jwt(
        account,
        &user.public_key(),
        name,
        json!({"type": "user", "version": 2, "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1}),
    );
    let seed = user.seed().unwrap_or_else(|e| panic!("seed: {e}"));
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    )
}

/// The user's NKey seed in a `.creds` file: the secret no text may show.
fn seed_of(creds: &str) -> String {
    creds
        .lines()
        .find(|line| line.starts_with("SU"))
        .unwrap_or_else(|| panic!("no seed line in the creds file"))
        .to_owned()
}

#[test]
fn credentials_file_works_and_refuses_without_leaking_the_seed() {
    let Some(binary) = server_binary_or_skip("secure credentials file") else {
        return;
    };
    // An operator of the test's own trusts one application account (with
    // JetStream) and a system account; a second operator's account is not
    // trusted.
    let operator = KeyPair::new_operator();
    let system = KeyPair::new_account();
    let app = KeyPair::new_account();
    let operator_jwt = signed_jwt(
        &operator,
        &operator.public_key(),
        "bus-test-operator",
        json!({"type": "operator", "version": 2}),
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let operator_file = dir.path().join("operator.jwt");
    std::fs::write(&operator_file, &operator_jwt).unwrap_or_else(|e| panic!("write: {e}"));
    let store = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let port = free_port();
    let _server = Server(start(
        &binary,
        port,
        store.path(),
        &format!(
            "operator: \"{}\"\nsystem_account: {}\nresolver: MEMORY\n\
             resolver_preload: {{\n  {}: \"{}\"\n  {}: \"{}\"\n}}\n",
            operator_file.display(),
            system.public_key(),
            system.public_key(),
            account_jwt(&operator, &system, "SYS", false),
            app.public_key(),
            account_jwt(&operator, &app, "app", true),
        ),
    ));

    let good_file = dir.path().join("app.creds");
    let good = creds(&app, "app-user");
    std::fs::write(&good_file, &good).unwrap_or_else(|e| panic!("write: {e}"));
    let seed = seed_of(&good);
    let url = format!("nats://127.0.0.1:{port}");
    let by_builder = options(&url).credentials_file(&good_file);
    assert!(
        !format!("{by_builder:?}").contains(&seed),
        "Debug shows the seed"
    );
    let bus = poll_until(
        "the operator-mode server to serve",
        Duration::from_secs(30),
        || NatsBus::connect_with(by_builder.clone()).ok(),
    );
    round_trip(&bus, "creds");
    drop(bus);
    // The same file named in the URL.
    let by_url = options(&format!("{url}?creds={}", good_file.display()));
    let bus = NatsBus::connect_with(by_url).unwrap_or_else(|e| panic!("creds by URL: {e}"));
    assert_eq!(
        bus.find_event_by_uid("creds", "k", "evt-1")
            .unwrap_or_else(|e| panic!("find: {e}"))
            .map(|ack| ack.offset),
        Some(0),
        "the record published with the builder's credentials"
    );
    drop(bus);

    // A user of an account the server does not trust.
    let stranger = KeyPair::new_account();
    let bad_file = dir.path().join("stranger.creds");
    let bad = creds(&stranger, "stranger");
    std::fs::write(&bad_file, &bad).unwrap_or_else(|e| panic!("write: {e}"));
    let bad_seed = seed_of(&bad);
    refused(
        "a user of an untrusted account",
        &bad_seed,
        options(&url).credentials_file(&bad_file),
    );
    // No credentials at all.
    refused("no credentials", &seed, options(&url));
    // A file that is not there.
    refused(
        "a missing creds file",
        &seed,
        options(&url).credentials_file(dir.path().join("absent.creds")),
    );
}
