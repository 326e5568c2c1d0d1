//! The raw-client reference benchmarks compare the bus with: plain
//! async-nats doing the same work (serialize, publish with the key header,
//! await each PubAck; replay parsing every value) on a stream of its own.

use async_nats::jetstream::{self, consumer, stream};
use bus_core::BusError;
use futures::StreamExt;
use serde_json::Value;

use bus_nats::naming::{KEY_HEADER, encode_header_text};

/// Raw async-nats on a file-storage stream named `name` (deleted on drop).
pub struct RawNats {
    runtime: tokio::runtime::Runtime,
    js: jetstream::Context,
    name: String,
}

fn failed(what: &str, error: impl std::fmt::Display) -> BusError {
    BusError::backend("nats", format!("raw nats {what}: {error}"))
}

impl RawNats {
    /// Connects to `servers` and creates the stream `name` afresh.
    pub fn new(servers: &[String], name: &str) -> Result<Self, BusError> {
        Self::replicated(servers, name, 1)
    }

    /// [`RawNats::new`] with a stream of `replicas` replicas (on a cluster).
    pub fn replicated(servers: &[String], name: &str, replicas: u16) -> Result<Self, BusError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let js = runtime.block_on(async {
            let client = async_nats::connect(servers)
                .await
                .map_err(|e| failed("connect", e))?;
            let js = jetstream::new(client);
            let _ = js.delete_stream(name).await;
            js.create_stream(stream::Config {
                name: name.to_owned(),
                subjects: vec![format!("{name}.>")],
                storage: stream::StorageType::File,
                allow_direct: true,
                num_replicas: usize::from(replicas.max(1)),
                ..Default::default()
            })
            .await
            .map_err(|e| failed("create stream", e))?;
            Ok::<_, BusError>(js)
        })?;
        Ok(Self {
            runtime,
            js,
            name: name.to_owned(),
        })
    }

    /// The stream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn headers() -> async_nats::HeaderMap {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(KEY_HEADER, encode_header_text("k"));
        headers
    }

    /// Publishes each event and awaits its PubAck before the next.
    pub fn serial(&self, events: &[Value]) -> Result<(), BusError> {
        let subject = format!("{}.r", self.name);
        self.runtime.block_on(async {
            for event in events {
                let bytes = serde_json::to_vec(event)?;
                self.js
                    .publish_with_headers(subject.clone(), Self::headers(), bytes.into())
                    .await
                    .map_err(|e| failed("publish", e))?
                    .await
                    .map_err(|e| failed("ack", e))?;
            }
            Ok(())
        })
    }

    /// Publishes `events` in pipelined chunks of 1,000: all sent, then acks awaited.
    pub fn batch(&self, events: &[Value]) -> Result<(), BusError> {
        let subject = format!("{}.r", self.name);
        self.runtime.block_on(async {
            for chunk in events.chunks(1_000) {
                let mut acks = Vec::with_capacity(chunk.len());
                for event in chunk {
                    let bytes = serde_json::to_vec(event)?;
                    acks.push(
                        self.js
                            .publish_with_headers(subject.clone(), Self::headers(), bytes.into())
                            .await
                            .map_err(|e| failed("publish", e))?,
                    );
                }
                for ack in acks {
                    ack.await.map_err(|e| failed("ack", e))?;
                }
            }
            Ok(())
        })
    }

    /// Reads the whole stream with an ordered consumer, parsing each value.
    pub fn replay(&self) -> Result<usize, BusError> {
        self.runtime.block_on(async {
            let mut stream = self
                .js
                .get_stream(&self.name)
                .await
                .map_err(|e| failed("get stream", e))?;
            let stored = stream
                .info()
                .await
                .map_err(|e| failed("stream info", e))?
                .state
                .messages;
            let ordered = stream
                .create_consumer(consumer::pull::OrderedConfig::default())
                .await
                .map_err(|e| failed("ordered consumer", e))?;
            let mut messages = ordered
                .messages()
                .await
                .map_err(|e| failed("messages", e))?;
            let mut seen = 0usize;
            while (seen as u64) < stored {
                let Some(message) = messages.next().await else {
                    break;
                };
                let message = message.map_err(|e| failed("message", e))?;
                let _: Value = serde_json::from_slice(&message.payload)?;
                seen += 1;
            }
            Ok(seen)
        })
    }
}

/// What [`spawn_push_readers`] calls with each message: the reader's index
/// and the payload.
pub type OnMessage = std::sync::Arc<dyn Fn(usize, &[u8]) + Send + Sync>;

/// The thread of [`spawn_push_readers`]: each reader's last receipt.
pub type PushReaders = std::thread::JoinHandle<Result<Vec<std::time::Instant>, BusError>>;

/// Raw async-nats live readers, what bus subscriptions are measured
/// against: on a thread of their own, one connection and a current-thread
/// runtime, `readers` ordered push consumers of `stream` from
/// `start_sequence`, each a task calling `on_message(reader, payload)` as
/// each message arrives until it has seen `count`.
///
/// Returns once every consumer exists on the server; the thread's result is
/// the instant each reader saw its last message.
pub fn spawn_push_readers(
    servers: &[String],
    stream: &str,
    start_sequence: u64,
    readers: usize,
    count: usize,
    on_message: OnMessage,
) -> Result<PushReaders, BusError> {
    let (servers, stream) = (servers.to_vec(), stream.to_owned());
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<Result<(), BusError>>(1);
    let thread = std::thread::Builder::new()
        .name("raw-nats-push".to_owned())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let started = async {
                    let client = async_nats::connect(servers)
                        .await
                        .map_err(|e| failed("connect", e))?;
                    let js = jetstream::new(client.clone());
                    let handle = js
                        .get_stream(&stream)
                        .await
                        .map_err(|e| failed("get stream", e))?;
                    let mut all = Vec::with_capacity(readers);
                    for _ in 0..readers {
                        let consumer = handle
                            .create_consumer(consumer::push::OrderedConfig {
                                deliver_subject: client.new_inbox(),
                                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                                    start_sequence,
                                },
                                ..Default::default()
                            })
                            .await
                            .map_err(|e| failed("ordered push consumer", e))?;
                        all.push(
                            consumer
                                .messages()
                                .await
                                .map_err(|e| failed("messages", e))?,
                        );
                    }
                    Ok::<_, BusError>(all)
                }
                .await;
                let all = match started {
                    Ok(all) => {
                        let _ = ready_tx.send(Ok(()));
                        all
                    }
                    Err(error) => {
                        let _ = ready_tx.send(Err(error));
                        return Ok(Vec::new());
                    }
                };
                let tasks = all.into_iter().enumerate().map(|(reader, mut messages)| {
                    let on_message = std::sync::Arc::clone(&on_message);
                    async move {
                        let mut seen = 0;
                        while seen < count {
                            match messages.next().await {
                                Some(Ok(message)) => {
                                    on_message(reader, &message.payload);
                                    seen += 1;
                                }
                                Some(Err(error)) => return Err(failed("message", error)),
                                None => break,
                            }
                        }
                        Ok(std::time::Instant::now())
                    }
                });
                futures::future::join_all(tasks).await.into_iter().collect()
            })
        })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(thread),
        Ok(Err(error)) => {
            let _ = thread.join();
            Err(error)
        }
        Err(_) => Err(match thread.join() {
            Ok(Err(error)) => error,
            _ => failed(
                "push readers",
                "the thread ended before its consumers existed",
            ),
        }),
    }
}

impl Drop for RawNats {
    fn drop(&mut self) {
        let _ = self.runtime.block_on(self.js.delete_stream(&self.name));
    }
}

/// Deletes the streams of the bus prefix `prefix` on `servers` (comma
/// separated `host:port` list): what a benchmark run leaves behind. Errors
/// are ignored (a server that is gone has nothing to delete).
pub fn delete_streams(servers: &str, prefix: &str) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    runtime.block_on(async {
        let Ok(client) = async_nats::connect(servers).await else {
            return;
        };
        let js = jetstream::new(client);
        let ours = format!("{prefix}_");
        let names: Vec<String> = js
            .stream_names()
            .filter_map(|name| async move { name.ok() })
            .collect()
            .await;
        for name in names.into_iter().filter(|name| name.starts_with(&ours)) {
            let _ = js.delete_stream(&name).await;
        }
    });
}
