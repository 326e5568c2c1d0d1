//! The raw-client reference benchmarks compare the bus with: plain
//! rdkafka doing the same work (serialize, produce to partition 0 with the
//! key, await delivery; replay decoding every record).

use std::time::Duration;

use bus_core::BusError;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde_json::Value;

use bus_kafka::kafka_topic_name;

/// Records per replay page.
const PAGE: usize = 1_000;

/// Raw rdkafka doing the work the bus does, on a topic the bus provisioned.
pub struct RawKafka {
    brokers: String,
    topic: String,
    producer: FutureProducer,
    runtime: tokio::runtime::Runtime,
}

impl RawKafka {
    /// A raw producer (idempotent, acks=all, `linger.ms=1`, like the bus)
    /// for the bus topic `topic`.
    pub fn new(brokers: &str, topic: &str) -> Result<Self, BusError> {
        Self::with_linger(brokers, topic, 1)
    }

    /// [`RawKafka::new`] with `linger.ms` set to `linger_ms`.
    pub fn with_linger(brokers: &str, topic: &str, linger_ms: u32) -> Result<Self, BusError> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", linger_ms.to_string())
            .set("batch.size", "900000")
            .create()
            .map_err(|e| BusError::backend("kafka", format!("raw producer: {e}")))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(Self {
            brokers: brokers.to_owned(),
            topic: kafka_topic_name(topic),
            producer,
            runtime,
        })
    }

    /// Runs `future` on the reference's own runtime.
    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Serializes each event and waits for its delivery report.
    pub fn serial(&self, events: &[Value]) -> Result<(), BusError> {
        self.runtime.block_on(async {
            for event in events {
                let payload = serde_json::to_vec(event).unwrap_or_default();
                let record = FutureRecord::to(&self.topic)
                    .partition(0)
                    .key("agent-1")
                    .payload(&payload);
                self.producer
                    .send(record, Timeout::Never)
                    .await
                    .map_err(|(e, _)| BusError::backend("kafka", format!("raw send: {e}")))?;
            }
            Ok(())
        })
    }

    /// Serializes a batch, enqueues it all, then waits for every report.
    pub fn batch(&self, events: &[Value]) -> Result<(), BusError> {
        let payloads: Vec<Vec<u8>> = events
            .iter()
            .map(|event| serde_json::to_vec(event).unwrap_or_default())
            .collect();
        self.runtime.block_on(async {
            let pending: Result<Vec<_>, BusError> = payloads
                .iter()
                .map(|payload| {
                    let record = FutureRecord::to(&self.topic)
                        .partition(0)
                        .key("agent-1")
                        .payload(payload);
                    self.producer
                        .send_result(record)
                        .map_err(|(e, _)| BusError::backend("kafka", format!("raw enqueue: {e}")))
                })
                .collect();
            for delivery in pending? {
                let _ = delivery.await;
            }
            Ok(())
        })
    }

    /// Reads the partition from 0 to its high watermark, decoding each
    /// record into what the bus returns (offset, key, value, time).
    pub fn replay(&self) -> Result<usize, BusError> {
        let failed = |what: &str, e: rdkafka::error::KafkaError| {
            BusError::backend("kafka", format!("raw {what}: {e}"))
        };
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set(
                "group.id",
                format!("bench-{}", uuid::Uuid::new_v4().simple()),
            )
            .set("enable.auto.commit", "false")
            // The same tuning as the bus's readers: without it librdkafka
            // pauses fetching for a second whenever its 64 MiB queue is
            // full, and a replay of 1,000,000 records runs at a third.
            .set("fetch.wait.max.ms", "10")
            .set("fetch.queue.backoff.ms", "5")
            .set("queued.min.messages", "100000")
            .set("queued.max.messages.kbytes", "16384")
            .create()
            .map_err(|e| failed("consumer", e))?;
        let (_, high) = consumer
            .fetch_watermarks(&self.topic, 0, Duration::from_secs(10))
            .map_err(|e| failed("watermarks", e))?;
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&self.topic, 0, Offset::Offset(0))
            .and_then(|()| consumer.assign(&list))
            .map_err(|e| failed("assign", e))?;
        let (mut seen, mut page) = (0, Vec::with_capacity(PAGE));
        while let Some(message) = consumer.poll(Duration::from_secs(10)) {
            let message = message.map_err(|e| failed("poll", e))?;
            let value: Value =
                serde_json::from_slice(message.payload().unwrap_or_default()).unwrap_or_default();
            let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
            page.push((
                message.offset(),
                key,
                value,
                message.timestamp().to_millis(),
            ));
            if page.len() == PAGE {
                std::hint::black_box(std::mem::take(&mut page));
            }
            seen += 1;
            if message.offset() + 1 >= high {
                break;
            }
        }
        Ok(seen)
    }
}

/// Raw rdkafka's positioned read: one consumer assigned to partition 0
/// once, then a seek and a poll per read (the reader settings of the bus).
pub struct RawPointReader {
    consumer: BaseConsumer,
    topic: String,
}

impl RawPointReader {
    /// A consumer assigned to partition 0 of the bus topic `topic`.
    pub fn new(brokers: &str, topic: &str) -> Result<Self, BusError> {
        let failed = |what: &str, e: rdkafka::error::KafkaError| {
            BusError::backend("kafka", format!("raw {what}: {e}"))
        };
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set(
                "group.id",
                format!("bench-{}", uuid::Uuid::new_v4().simple()),
            )
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "10")
            .set("fetch.queue.backoff.ms", "5")
            .set("queued.min.messages", "100000")
            .set("queued.max.messages.kbytes", "16384");
        for pair in std::env::var("BENCH_RAW_KAFKA_SET")
            .unwrap_or_default()
            .split(',')
        {
            if let Some((name, value)) = pair.split_once('=') {
                config.set(name, value);
            }
        }
        let consumer: BaseConsumer = config.create().map_err(|e| failed("consumer", e))?;
        let topic = kafka_topic_name(topic);
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&topic, 0, Offset::Offset(0))
            .and_then(|()| consumer.assign(&list))
            .map_err(|e| failed("assign", e))?;
        Ok(Self { consumer, topic })
    }

    /// The record at `offset`, decoded as the bus decodes it: seek, then
    /// poll until it arrives.
    pub fn read(&self, offset: u64) -> Result<Value, BusError> {
        let failed = |what: &str, e: rdkafka::error::KafkaError| {
            BusError::backend("kafka", format!("raw {what}: {e}"))
        };
        let at = i64::try_from(offset).unwrap_or(i64::MAX);
        self.consumer
            .seek(&self.topic, 0, Offset::Offset(at), Duration::from_secs(10))
            .map_err(|e| failed("seek", e))?;
        loop {
            let message = self
                .consumer
                .poll(Duration::from_secs(10))
                .ok_or_else(|| BusError::backend("kafka", "raw poll: nothing in 10 s"))?
                .map_err(|e| failed("poll", e))?;
            if message.offset() == at {
                return serde_json::from_slice(message.payload().unwrap_or_default())
                    .map_err(BusError::from);
            }
        }
    }
}
