//! The conformance suite's harness for a real nats-server (`BUS_NATS_URL`):
//! each case owns a stream prefix; its streams are deleted when it ends.

use bus_conformance::{Harness, Namespace, RawRecord, Unavailable};
use bus_core::auth::to_hex;
use bus_core::{BusError, EventBus};
use bus_nats::naming::{
    KEY_HEADER, TAG_HEADER, UID_HEADER, encode_header_text, record_subject, stream_name,
};
use bus_nats::{NatsBus, NatsOptions};

/// The suite's harness; `through_async` runs every case through the async
/// surface of a bus made by `NatsBus::connect_async`.
pub struct Nats {
    pub through_async: bool,
}

struct NatsNamespace {
    through_async: bool,
    options: NatsOptions,
    runtime: tokio::runtime::Runtime,
    raw: Option<async_nats::jetstream::Context>,
}

impl Harness for Nats {
    fn backend(&self) -> &'static str {
        "nats"
    }

    fn namespace(&self) -> Result<Box<dyn Namespace>, Unavailable> {
        let url = bus_conformance::brokers::nats_url()?;
        let options = NatsOptions::from_url(&url)
            .map_err(|error| Unavailable(format!("BUS_NATS_URL: {error}")))?
            .prefix(format!("bt-{}", bus_conformance::namespace_id(12)));
        Ok(Box::new(NatsNamespace {
            through_async: self.through_async,
            options,
            runtime: bus_conformance::current_thread_runtime()?,
            raw: None,
        }))
    }
}

impl NatsNamespace {
    /// A plain async-nats client beside the bus, as a foreign writer.
    fn raw(&mut self) -> Result<async_nats::jetstream::Context, BusError> {
        if let Some(raw) = &self.raw {
            return Ok(raw.clone());
        }
        let servers = self.options.servers.clone();
        // The JetStream context spawns a task: build it inside the runtime.
        let raw = self
            .runtime
            .block_on(async {
                async_nats::connect(servers)
                    .await
                    .map(async_nats::jetstream::new)
            })
            .map_err(|error| BusError::backend("nats", format!("raw connect: {error}")))?;
        self.raw = Some(raw.clone());
        Ok(raw)
    }
}

impl Namespace for NatsNamespace {
    fn open(&mut self) -> Result<Box<dyn EventBus>, BusError> {
        let options = self.options.clone();
        #[cfg(feature = "async")]
        if self.through_async {
            return Ok(Box::new(bus_conformance::ThroughAsync::build(|| {
                NatsBus::connect_async_with(options)
            })?));
        }
        assert!(!self.through_async, "the async surface needs feature async");
        Ok(Box::new(NatsBus::connect_with(options)?))
    }

    fn inject_raw(
        &mut self,
        _bus: &mut Option<Box<dyn EventBus>>,
        topic: &str,
        partition: u32,
        raw: &RawRecord,
    ) -> Result<(), BusError> {
        let js = self.raw()?;
        let stream = stream_name(&self.options.prefix, topic, partition);
        let subject = record_subject(&stream, raw.uid.as_deref());
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(KEY_HEADER, encode_header_text(&raw.key));
        if let Some(uid) = &raw.uid {
            headers.insert(UID_HEADER, encode_header_text(uid));
        }
        if let Some(tag) = &raw.tag {
            headers.insert(TAG_HEADER, to_hex(tag));
        }
        // The caller's headers (C25) as the bus writes them.
        for (name, value) in raw.headers.iter() {
            headers.insert(name, encode_header_text(value));
        }
        let payload = bytes::Bytes::from(raw.value.clone());
        self.runtime
            .block_on(async move {
                js.publish_with_headers(subject, headers, payload)
                    .await?
                    .await
            })
            .map(drop)
            .map_err(|error| BusError::backend("nats", format!("raw publish: {error}")))
    }
}

impl Drop for NatsNamespace {
    fn drop(&mut self) {
        let Ok(js) = self.raw() else { return };
        let prefix = self.options.prefix.clone();
        self.runtime
            .block_on(async move { super::delete_streams(&js, &prefix).await });
    }
}
