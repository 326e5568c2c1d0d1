//! What the bus has provisioned, recorded in a compacted Kafka topic (the
//! manifest topic, `__bus_manifest` by default): one record per bus topic,
//! keyed by its name, holding its whole [`TopicSpec`] and Kafka name. Kafka
//! refuses unknown topic configs, so this is where the dedup window and the
//! exact record limit live; it is also the bus's marker: a Kafka topic
//! without an entry is not a bus topic, and an operation on it is refused
//! before anything reaches the broker (contract C2). Every bus on the same
//! cluster and manifest topic (other processes included) sees the same set.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bus_core::{BusError, TopicSpec};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::KafkaOptions;
use crate::client::{self, Reader, remaining};
use crate::errors::map_error;

/// One provisioned bus topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    /// The Kafka topic holding its records.
    pub kafka_topic: String,
    /// The manifest it was provisioned with.
    pub spec: TopicSpec,
}

/// The local view of the manifest topic, caught up on demand.
pub(crate) struct Registry {
    consumer: Reader,
    /// Next offset of the manifest topic to read.
    next: u64,
    /// Fetching is paused between refreshes, so an idle bus sends no Fetch.
    paused: bool,
    entries: BTreeMap<String, Entry>,
}

impl Registry {
    /// A registry reading `options.manifest_topic` from its start.
    pub(crate) fn open(options: &KafkaOptions) -> Result<Self, BusError> {
        let consumer = client::reader(options)?;
        let mut list = TopicPartitionList::new();
        // Offset 0, not `Offset::Beginning`: librdkafka resolves a logical
        // offset with an extra ListOffsets round, ~500 ms per reader opened
        // here (a connect to an existing bus took 550 ms, 50 ms with 0). An
        // offset 0 compaction removed is out of range and resets to the
        // earliest (`auto.offset.reset=earliest`).
        list.add_partition_offset(&options.manifest_topic, 0, Offset::Offset(0))
            .and_then(|()| consumer.assign(&list))
            .map_err(|error| map_error(options, "assigning the manifest topic", error))?;
        Ok(Self {
            consumer,
            next: 0,
            paused: false,
            entries: BTreeMap::new(),
        })
    }

    /// The entry of `name` as last read, without a refresh.
    pub(crate) fn cached(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    /// Every entry as last read.
    pub(crate) fn entries(&self) -> &BTreeMap<String, Entry> {
        &self.entries
    }

    /// Records an entry this bus just wrote.
    pub(crate) fn remember(&mut self, name: &str, entry: Option<Entry>) {
        match entry {
            Some(entry) => self.entries.insert(name.to_owned(), entry),
            None => self.entries.remove(name),
        };
    }

    /// Reads what other buses wrote since the last refresh.
    pub(crate) fn refresh(
        &mut self,
        options: &KafkaOptions,
        meta: &Reader,
        deadline: Instant,
    ) -> Result<(), BusError> {
        let topic = options.manifest_topic.as_str();
        let (_, high) = client::retry(
            options,
            "reading the manifest topic",
            deadline,
            meta.client(),
            || meta.fetch_watermarks(topic, 0, remaining(deadline).min(Duration::from_secs(1))),
        )?;
        let high = u64::try_from(high).unwrap_or(0);
        if self.next >= high {
            return Ok(());
        }
        if self.paused {
            crate::reader::pause(options, &self.consumer, topic, 0, false)?;
            self.paused = false;
        }
        while self.next < high {
            if Instant::now() >= deadline {
                return Err(crate::errors::timed_out(
                    options,
                    "reading the manifest topic",
                ));
            }
            let Some(polled) = self
                .consumer
                .poll(remaining(deadline).min(Duration::from_millis(200)))
            else {
                continue;
            };
            let message = match polled {
                Ok(message) => message,
                Err(_) => continue,
            };
            let Ok(offset) = u64::try_from(message.offset()) else {
                continue;
            };
            if offset < self.next {
                continue;
            }
            self.next = offset + 1;
            let Some(Ok(name)) = message.key_view::<str>() else {
                continue;
            };
            let entry = message
                .payload()
                .and_then(|bytes| serde_json::from_slice::<Entry>(bytes).ok());
            match entry {
                Some(entry) => self.entries.insert(name.to_owned(), entry),
                None => self.entries.remove(name),
            };
        }
        self.paused = crate::reader::pause(options, &self.consumer, topic, 0, true).is_ok();
        Ok(())
    }
}
