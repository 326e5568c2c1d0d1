//! The reading side of the cursor topic: every consumer's latest committed
//! record, read from the start of the topic by a fresh `read_committed`
//! reader, and (for an owner to build on) settled past every transaction
//! still open below the high watermark.

use std::collections::BTreeMap;
use std::time::Duration;
use std::time::Instant;

use bus_core::BusError;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::{Offset, TopicPartitionList};

use super::owner::Stored;
use super::{KafkaCursorStore, SETTLE_WAIT};
use crate::client::{self, remaining};
use crate::errors::map_error;

impl KafkaCursorStore {
    /// Every consumer's latest committed record: the cursor topic read
    /// from its start to its end (read_committed, partition EOF) by a
    /// fresh reader, so nothing cached can be stale.
    ///
    /// A read_committed read ends at the first open transaction (its last
    /// stable offset), which may be another consumer's write in flight: a
    /// `settled` read (taken after `init_transactions`, to build on) goes
    /// on until it has passed the high watermark a read_uncommitted client
    /// sees, i.e. until no transaction below it is open, waiting up to
    /// [`SETTLE_WAIT`] more for the broker to abort one a dead process left.
    pub(super) fn read_all(
        &self,
        settled: bool,
    ) -> Result<BTreeMap<(String, String), Stored>, BusError> {
        let mut out = BTreeMap::new();
        if !self.topic_exists()? {
            return Ok(out);
        }
        let options = &self.bus.core.options;
        let mut config = client::reader_config(options);
        config
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true");
        let reader: BaseConsumer = config
            .create()
            .map_err(|error| map_error(options, "creating the cursor reader", error))?;
        let mut list = TopicPartitionList::new();
        // Offset 0, not `Offset::Beginning`: librdkafka resolves a logical
        // offset with an extra ListOffsets round, ~500 ms per reader opened
        // here (a connect to an existing bus took 550 ms, 50 ms with 0). An
        // offset 0 compaction removed is out of range and resets to the
        // earliest (`auto.offset.reset=earliest`).
        list.add_partition_offset(&self.topic, 0, Offset::Offset(0))
            .and_then(|()| reader.assign(&list))
            .map_err(|error| map_error(options, "assigning the cursor topic", error))?;
        let deadline = if settled {
            self.deadline() + SETTLE_WAIT
        } else {
            self.deadline()
        };
        let mut at_end = false;
        loop {
            if Instant::now() >= deadline {
                return Err(crate::errors::timed_out(
                    options,
                    "reading the cursor topic",
                ));
            }
            if at_end && (!settled || self.passed_high_watermark(&reader, deadline)?) {
                return Ok(out);
            }
            match reader.poll(remaining(deadline).min(Duration::from_millis(50))) {
                None => {}
                Some(Err(KafkaError::PartitionEOF(_))) => at_end = true,
                Some(Err(error)) => {
                    // Right after the topic is created, or while a broker
                    // restarts: tried again until the deadline.
                    tracing::debug!(%error, "kafka: reading the cursor topic, retrying");
                }
                Some(Ok(message)) => {
                    let Some(Ok((topic, name))) = message
                        .key()
                        .map(serde_json::from_slice::<(String, String)>)
                    else {
                        continue;
                    };
                    match message.payload() {
                        None => {
                            out.remove(&(topic, name));
                        }
                        Some(payload) => match serde_json::from_slice::<Stored>(payload) {
                            Ok(stored) => {
                                out.insert((topic, name), stored);
                            }
                            Err(error) => {
                                return Err(BusError::backend(
                                    "kafka",
                                    format!(
                                        "the cursor of consumer {name:?} of topic {topic:?} is not readable: {error}"
                                    ),
                                ));
                            }
                        },
                    }
                }
            }
        }
    }

    /// Whether `reader` (at a partition EOF) stands at or past the high
    /// watermark: its position moves past commit and abort markers, and a
    /// read_uncommitted client's watermark counts open transactions.
    fn passed_high_watermark(
        &self,
        reader: &BaseConsumer,
        deadline: Instant,
    ) -> Result<bool, BusError> {
        let options = &self.bus.core.options;
        let position = reader
            .position()
            .map_err(|error| map_error(options, "reading the cursor topic", error))?
            .elements()
            .first()
            .and_then(|element| match element.offset() {
                Offset::Offset(offset) => Some(offset),
                _ => None,
            });
        // Called only after a partition EOF: with no position, nothing
        // was ever fetched (an empty topic), which is a position of 0.
        let position = position.unwrap_or(0);
        let high = match self.watermarks.get() {
            Some(client) => client,
            None => {
                let mut config = client::reader_config(options);
                config.set("isolation.level", "read_uncommitted");
                let client: BaseConsumer = config.create().map_err(|error| {
                    map_error(options, "creating the cursor watermark client", error)
                })?;
                // A racing caller may have set one first: either serves.
                let _ = self.watermarks.set(client);
                self.watermarks
                    .get()
                    .ok_or_else(|| BusError::backend("kafka", "no cursor watermark client"))?
            }
        };
        let (_, high) = client::retry(
            options,
            "reading the cursor topic's watermarks",
            deadline,
            high.client(),
            || {
                high.fetch_watermarks(
                    &self.topic,
                    0,
                    remaining(deadline).min(Duration::from_secs(1)),
                )
            },
        )?;
        Ok(position >= high)
    }

    pub(super) fn read_one(&self, topic: &str, name: &str) -> Result<Option<Stored>, BusError> {
        self.read_key(topic, name, false)
    }

    /// The record of one consumer, settled (see [`Self::read_all`]).
    pub(super) fn read_settled(&self, topic: &str, name: &str) -> Result<Option<Stored>, BusError> {
        self.read_key(topic, name, true)
    }

    pub(super) fn read_key(
        &self,
        topic: &str,
        name: &str,
        settled: bool,
    ) -> Result<Option<Stored>, BusError> {
        Ok(self
            .read_all(settled)?
            .remove(&(topic.to_owned(), name.to_owned())))
    }
}
