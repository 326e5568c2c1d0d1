//! Acks that mean `Disk` on Kafka (contract C15): a broker leaves
//! flushing to the operating system unless `flush.messages` (a topic's
//! setting) or `log.flush.interval.messages` (the broker's default for it)
//! says otherwise. At 1, the log's append (leader and follower alike)
//! fsyncs before it returns, so the produce response, and the bus's ack,
//! comes after the fsync. [`KafkaOptions::flush_each_message`] provisions
//! the bus's topics that way; this file sets it, verifies it on topics that
//! exist, and asks the brokers whether they flush every message anyway.

use std::time::Instant;

use bus_core::BusError;
use rdkafka::admin::{AdminOptions, NewTopic, ResourceSpecifier};
use rdkafka::util::Timeout;

use crate::KafkaOptions;
use crate::client::remaining;
use crate::errors::map_error;

type Admin = rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>;

/// The topic setting.
const TOPIC_SETTING: &str = "flush.messages";
/// The broker's default for it.
const BROKER_SETTING: &str = "log.flush.interval.messages";

fn admin_options(deadline: Instant) -> AdminOptions {
    let left = remaining(deadline);
    AdminOptions::new()
        .request_timeout(Some(Timeout::After(left)))
        .operation_timeout(Some(Timeout::After(left)))
}

/// `topic` with `flush.messages=1` when the bus flushes each message.
pub(crate) fn new_topic<'a>(options: &KafkaOptions, topic: NewTopic<'a>) -> NewTopic<'a> {
    if options.flush_each_message {
        topic.set(TOPIC_SETTING, "1")
    } else {
        topic
    }
}

/// With [`KafkaOptions::flush_each_message`], every existing topic in
/// `topics` (bus name, Kafka name) must flush each message: one that does
/// not is a [`BusError::Conflict`] naming it, its value and the command
/// that fixes it (the bus does not change a topic it did not create).
pub(crate) fn verify_topics(
    options: &KafkaOptions,
    admin: &Admin,
    topics: &[(String, String)],
    deadline: Instant,
) -> Result<(), BusError> {
    if !options.flush_each_message || topics.is_empty() {
        return Ok(());
    }
    let resources: Vec<ResourceSpecifier<'_>> = topics
        .iter()
        .map(|(_, kafka)| ResourceSpecifier::Topic(kafka))
        .collect();
    let results = tokio::runtime::Handle::current()
        .block_on(admin.describe_configs(&resources, &admin_options(deadline)))
        .map_err(|error| map_error(options, "describing topic configs", error))?;
    for ((name, kafka), result) in topics.iter().zip(results) {
        let config = result.map_err(|code| {
            BusError::backend(
                "kafka",
                format!("describing the config of topic {kafka:?} failed: {code}"),
            )
        })?;
        let value = config
            .get(TOPIC_SETTING)
            .and_then(|entry| entry.value.clone())
            .unwrap_or_default();
        if value != "1" {
            return Err(BusError::Conflict {
                topic: name.clone(),
                property: TOPIC_SETTING.to_owned(),
                existing: value,
                requested: "1".to_owned(),
                fix: format!(
                    "the bus flushes each message (flush_each_message) but Kafka topic {kafka:?} \
                     was created without it: kafka-configs.sh --alter --entity-type topics \
                     --entity-name {kafka} --add-config flush.messages=1, or connect without \
                     flush_each_message"
                ),
            });
        }
    }
    Ok(())
}

/// Whether every broker of the cluster flushes each message by default
/// (`log.flush.interval.messages=1`).
pub(crate) fn brokers_flush_each_message(
    options: &KafkaOptions,
    admin: &Admin,
    deadline: Instant,
) -> Result<bool, BusError> {
    let metadata = admin
        .inner()
        .fetch_metadata(None, remaining(deadline))
        .map_err(|error| map_error(options, "reading metadata", error))?;
    let ids: Vec<i32> = metadata
        .brokers()
        .iter()
        .map(|broker| broker.id())
        .collect();
    if ids.is_empty() {
        return Ok(false);
    }
    let resources: Vec<ResourceSpecifier<'_>> = ids
        .iter()
        .map(|id| ResourceSpecifier::Broker(*id))
        .collect();
    let results = tokio::runtime::Handle::current()
        .block_on(admin.describe_configs(&resources, &admin_options(deadline)))
        .map_err(|error| map_error(options, "describing the broker config", error))?;
    Ok(results.len() == ids.len()
        && results.into_iter().all(|result| {
            result.ok().is_some_and(|config| {
                config
                    .get(BROKER_SETTING)
                    .and_then(|entry| entry.value.as_deref()?.parse::<u64>().ok())
                    == Some(1)
            })
        }))
}
