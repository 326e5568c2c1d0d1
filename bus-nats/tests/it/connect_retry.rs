//! Connecting asks JetStream again when its first account query goes
//! unanswered (a server of a cluster that has just formed can drop it while
//! the meta group elects its leader): here a plain server whose only
//! JetStream "API" is this test's responder, which ignores the first query
//! and answers the next with a real server's account info.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bus_nats::{NatsBus, NatsOptions};
use futures::StreamExt;

use crate::common::{Server, free_port, server_binary_or_skip, start};

#[test]
fn an_unanswered_account_query_is_asked_again_within_the_timeout() {
    let Some(binary) = server_binary_or_skip("connect_retry") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap_or_else(|e| panic!("runtime: {e}"));
    // A real account answer, from a JetStream server of the test's own.
    let store = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let js_port = free_port();
    let _js_server = Server(start(&binary, js_port, store.path(), ""));
    let answer = runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(client) = async_nats::connect(format!("127.0.0.1:{js_port}")).await
                && let Ok(reply) = client.request("$JS.API.INFO", "".into()).await
            {
                return reply.payload;
            }
            assert!(
                Instant::now() < deadline,
                "the JetStream server never answered"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });

    // A plain server (no JetStream) with a responder that drops the first query.
    let port = free_port();
    let _plain = Server(
        Command::new(&binary)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start nats-server: {e}")),
    );
    let asked = Arc::new(AtomicUsize::new(0));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let responder = {
        let asked = Arc::clone(&asked);
        runtime.spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            let client = loop {
                if let Ok(client) = async_nats::connect(format!("127.0.0.1:{port}")).await {
                    break client;
                }
                assert!(Instant::now() < deadline, "the plain server never answered");
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let mut queries = client
                .subscribe("$JS.API.INFO")
                .await
                .unwrap_or_else(|e| panic!("subscribe: {e}"));
            client
                .flush()
                .await
                .unwrap_or_else(|e| panic!("flush: {e}"));
            let _ = ready_tx.send(());
            while let Some(query) = queries.next().await {
                if asked.fetch_add(1, Ordering::SeqCst) == 0 {
                    continue; // dropped, as a server electing its meta leader may
                }
                if let Some(reply) = query.reply {
                    let _ = client.publish(reply, answer.clone()).await;
                    let _ = client.flush().await;
                }
            }
        })
    };
    ready_rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("the responder never subscribed: {e}"));

    let options = NatsOptions::new([format!("nats://127.0.0.1:{port}")])
        .timeout(Duration::from_secs(8))
        .connect_timeout(Duration::from_secs(8));
    let connected = NatsBus::connect_with(options);
    responder.abort();
    assert!(
        connected.is_ok(),
        "connect failed after {} account queries: {:?}",
        asked.load(Ordering::SeqCst),
        connected.err()
    );
    assert!(
        asked.load(Ordering::SeqCst) >= 2,
        "the query was not asked again"
    );
}
