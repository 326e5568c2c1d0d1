//! Provisioning (contract C1) with the admin client: create what is
//! missing, verify what exists, record every topic in the manifest topic.

use std::time::{Duration, Instant};

use bus_core::{BusError, Manifest, TopicSpec};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::BaseRecord;
use rdkafka::util::Timeout;

use crate::client::{self, kafka_topic_name, list_topics, remaining, topic_ready};
use crate::errors::map_error;
use crate::flush;
use crate::registry::Entry;
use crate::{Core, KafkaOptions};
use bus_core::backend::sync::lock;

type Admin = rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>;

/// Bytes a Kafka record batch may take beyond the topic's `max_record_bytes`
/// (record and batch overhead, headers, librdkafka's batching of several
/// small records up to `batch.size`): `max.message.bytes` is the limit plus
/// this, so a bus limit of any size never rejects a batch the bus allows.
pub(crate) const TOPIC_SLACK_BYTES: u64 = 1024 * 1024;

fn admin_options(deadline: Instant) -> AdminOptions {
    let left = remaining(deadline);
    AdminOptions::new()
        .request_timeout(Some(Timeout::After(left)))
        .operation_timeout(Some(Timeout::After(left)))
}

/// Creates the compacted manifest topic when the cluster lacks it.
pub(crate) fn ensure_manifest_topic(
    options: &KafkaOptions,
    admin: &Admin,
    deadline: Instant,
) -> Result<(), BusError> {
    ensure_compacted_topic(options, admin, &options.manifest_topic, deadline)
}

/// Creates a one-partition compacted topic of the bus (the manifest topic,
/// the durable consumers' cursor topic) when the cluster lacks it, at the
/// manifest's replication factor.
pub(crate) fn ensure_compacted_topic(
    options: &KafkaOptions,
    admin: &Admin,
    topic: &str,
    deadline: Instant,
) -> Result<(), BusError> {
    let topic = topic.to_owned();
    if list_topics(options, admin.inner(), deadline)?.contains_key(&topic) {
        return flush::verify_topics(options, admin, &[(topic.clone(), topic)], deadline);
    }
    let factor = match options.manifest_replication {
        Some(factor) => i32::from(factor),
        None => {
            if broker_count(options, admin, deadline)? >= 3 {
                3
            } else {
                1
            }
        }
    };
    let new = flush::new_topic(
        options,
        NewTopic::new(&topic, 1, TopicReplication::Fixed(factor)).set("cleanup.policy", "compact"),
    );
    create(options, admin, &[new], deadline)?;
    wait_ready(options, admin, &topic, 1, deadline)
}

/// Retention checks at least this often count as native retention: the
/// broker expires records within seconds of `retention.ms`, not minutes.
const PROMPT_RETENTION_CHECK_MS: u64 = 5_000;

/// A replication factor the cluster cannot hold: refused before anything is created.
pub(crate) fn replication_too_large(index: usize, spec: &TopicSpec, nodes: usize) -> BusError {
    BusError::invalid(
        format!("topics[{index}].replication_factor"),
        format!(
            "topic {:?} asks for {} replicas but the cluster has {nodes} node(s) available; \
             lower replication_factor or add nodes",
            spec.name, spec.replication_factor
        ),
    )
}

/// How many brokers the cluster's metadata lists.
pub(crate) fn broker_count(
    options: &KafkaOptions,
    admin: &Admin,
    deadline: Instant,
) -> Result<usize, BusError> {
    let metadata = admin
        .inner()
        .fetch_metadata(None, remaining(deadline))
        .map_err(|error| map_error(options, "reading metadata", error))?;
    Ok(metadata.brokers().len())
}

/// Whether the broker checks retention promptly
/// (`log.retention.check.interval.ms` ≤ 5 s; Kafka's default is 5 min).
pub(crate) fn broker_checks_retention_promptly(
    options: &KafkaOptions,
    admin: &Admin,
    deadline: Instant,
) -> Result<bool, BusError> {
    let metadata = admin
        .inner()
        .fetch_metadata(None, remaining(deadline))
        .map_err(|error| map_error(options, "reading metadata", error))?;
    let Some(broker) = metadata.brokers().first().map(|broker| broker.id()) else {
        return Ok(false);
    };
    let configs = tokio::runtime::Handle::current()
        .block_on(admin.describe_configs(
            &[rdkafka::admin::ResourceSpecifier::Broker(broker)],
            &admin_options(deadline),
        ))
        .map_err(|error| map_error(options, "describing the broker config", error))?;
    Ok(configs
        .into_iter()
        .filter_map(Result::ok)
        .filter_map(|config| {
            config
                .get("log.retention.check.interval.ms")
                .and_then(|entry| entry.value.as_deref()?.parse::<u64>().ok())
        })
        .any(|interval| interval <= PROMPT_RETENTION_CHECK_MS))
}

/// C1: verify everything first (so a conflict creates nothing), then create
/// the missing topics, wait for them, and record them.
pub(crate) fn provision(
    core: &Core,
    manifest: &Manifest,
    deadline: Instant,
) -> Result<(), BusError> {
    manifest.validate()?;
    manifest.refuse_cold("the Kafka backend")?;
    let mut registry = lock(&core.registry);
    registry.refresh(&core.options, &core.pool.meta(), deadline)?;
    let existing = list_topics(&core.options, core.admin.inner(), deadline)?;
    let mut missing: Vec<&TopicSpec> = Vec::new();
    let mut record: Vec<Entry> = Vec::new();
    let mut present: Vec<(String, String)> = Vec::new();
    for spec in &manifest.topics {
        let kafka_topic = kafka_topic_name(&spec.name);
        let entry = Entry {
            kafka_topic: kafka_topic.clone(),
            spec: spec.clone(),
        };
        // The recorded spec decides first, whatever the metadata shows: a
        // broker whose metadata lags, or a Kafka topic deleted behind the
        // bus's back, must not let another spec overwrite the record.
        let known = registry.cached(&spec.name);
        if let Some(known) = known {
            spec.conflict_with(&known.spec)?;
        }
        match existing.get(&kafka_topic) {
            Some(&partitions) => {
                present.push((spec.name.clone(), kafka_topic.clone()));
                let partitions = u32::try_from(partitions).unwrap_or(u32::MAX);
                if partitions != spec.partitions {
                    return Err(BusError::Conflict {
                        topic: spec.name.clone(),
                        property: "partitions".to_owned(),
                        existing: partitions.to_string(),
                        requested: spec.partitions.to_string(),
                        fix: "change the manifest to match, or delete the Kafka topic and provision it again (its records would be lost)".to_owned(),
                    });
                }
                if known.is_none() {
                    // A topic created but not yet recorded (a crash in
                    // between, or another bus racing us): adopt it.
                    record.push(entry);
                }
            }
            None => {
                missing.push(spec);
                if known.is_none() {
                    record.push(entry);
                }
            }
        }
    }
    flush::verify_topics(&core.options, &core.admin, &present, deadline)?;
    if missing.iter().any(|spec| spec.replication_factor > 1) {
        let brokers = broker_count(&core.options, &core.admin, deadline)?;
        for (index, spec) in manifest.topics.iter().enumerate() {
            let missing_here = missing.iter().any(|m| m.name == spec.name);
            if missing_here && usize::from(spec.replication_factor) > brokers {
                return Err(replication_too_large(index, spec, brokers));
            }
        }
    }
    let configs: Vec<(String, String, String)> = missing
        .iter()
        .map(|spec| {
            let retention = spec
                .retention_ms
                .map_or_else(|| "-1".to_owned(), |ms| ms.to_string());
            let max = (spec.max_record_bytes + TOPIC_SLACK_BYTES).to_string();
            (kafka_topic_name(&spec.name), retention, max)
        })
        .collect();
    let new_topics: Vec<NewTopic<'_>> = missing
        .iter()
        .zip(&configs)
        .map(|(spec, (name, retention, max))| {
            let topic = NewTopic::new(
                name,
                i32::try_from(spec.partitions).unwrap_or(i32::MAX),
                TopicReplication::Fixed(i32::from(spec.replication_factor)),
            )
            .set("cleanup.policy", "delete")
            .set("retention.ms", retention)
            .set("max.message.bytes", max)
            .set("message.timestamp.type", "LogAppendTime")
            // acks=all then waits for two replicas: one node may be lost.
            .set(
                "min.insync.replicas",
                if spec.replication_factor >= 3 {
                    "2"
                } else {
                    "1"
                },
            );
            flush::new_topic(&core.options, topic)
        })
        .collect();
    if !new_topics.is_empty() {
        create(&core.options, &core.admin, &new_topics, deadline)?;
    }
    for spec in &missing {
        let partitions = usize::try_from(spec.partitions).unwrap_or(usize::MAX);
        wait_ready(
            &core.options,
            &core.admin,
            &kafka_topic_name(&spec.name),
            partitions,
            deadline,
        )?;
    }
    for entry in record {
        let value = serde_json::to_vec(&entry)?;
        write_entry(core, &entry.spec.name, Some(&value), deadline)?;
        let name = entry.spec.name.clone();
        registry.remember(&name, Some(entry));
    }
    Ok(())
}

/// Drops the records of one partition below `offset` (never past the
/// head) with the admin API's DeleteRecords: the log start offset moves up
/// and offsets are kept (C4). What a cold tier calls after archiving
/// (C24). Returns how many records were dropped.
pub(crate) fn delete_below(
    core: &Core,
    kafka_topic: &str,
    partition: i32,
    offset: u64,
    deadline: Instant,
) -> Result<u64, BusError> {
    let (first, next) = core
        .pool
        .watermarks(&core.options, kafka_topic, partition, deadline)?;
    let cut = offset.min(next);
    if cut <= first {
        return Ok(0);
    }
    let mut list = rdkafka::TopicPartitionList::new();
    let at = i64::try_from(cut)
        .map_err(|_| BusError::invalid("offset", format!("{cut} is past Kafka's offsets")))?;
    list.add_partition_offset(kafka_topic, partition, rdkafka::Offset::Offset(at))
        .map_err(|error| map_error(&core.options, "deleting records", error))?;
    let result = tokio::runtime::Handle::current()
        .block_on(core.admin.delete_records(&list, &admin_options(deadline)))
        .map_err(|error| map_error(&core.options, "deleting records", error))?;
    for element in result.elements() {
        if let Err(error) = element.error() {
            return Err(map_error(
                &core.options,
                &format!("deleting records of {kafka_topic} partition {partition} below {cut}"),
                error,
            ));
        }
    }
    Ok(cut - first)
}

/// Deletes bus topics and their manifest entries.
pub(crate) fn delete_topics(
    core: &Core,
    names: &[String],
    deadline: Instant,
) -> Result<(), BusError> {
    let mut registry = lock(&core.registry);
    registry.refresh(&core.options, &core.pool.meta(), deadline)?;
    let kafka: Vec<String> = names
        .iter()
        .filter_map(|name| registry.cached(name).map(|entry| entry.kafka_topic.clone()))
        .collect();
    let refs: Vec<&str> = kafka.iter().map(String::as_str).collect();
    if !refs.is_empty() {
        let results = tokio::runtime::Handle::current()
            .block_on(core.admin.delete_topics(&refs, &admin_options(deadline)))
            .map_err(|error| map_error(&core.options, "deleting topics", error))?;
        for result in results {
            if let Err((name, code)) = result
                && code != RDKafkaErrorCode::UnknownTopicOrPartition
            {
                return Err(BusError::backend(
                    "kafka",
                    format!("deleting topic {name:?} failed: {code}"),
                ));
            }
        }
    }
    for (name, topic) in names.iter().zip(&kafka) {
        write_entry(core, name, None, deadline)?;
        registry.remember(name, None);
        core.pool.forget(topic);
        lock(&core.partitions).retain(|(t, _), _| t != name);
    }
    Ok(())
}

/// Creates `topics` (one that exists already is fine: another bus may
/// have raced this one). A transient failure (a dropped connection, a
/// controller moving) is tried again until `deadline` ([`client::retry`]);
/// any other ends the call.
fn create(
    options: &KafkaOptions,
    admin: &Admin,
    topics: &[NewTopic<'_>],
    deadline: Instant,
) -> Result<(), BusError> {
    let what = "creating topics";
    let transient = |error: &KafkaError| map_error(options, what, error.clone()).is_transient();
    client::retry(options, what, deadline, admin.inner(), || {
        let results = match tokio::runtime::Handle::current()
            .block_on(admin.create_topics(topics, &admin_options(deadline)))
        {
            Ok(results) => results,
            Err(error) if transient(&error) => return Err(error),
            Err(error) => return Ok(Err(map_error(options, what, error))),
        };
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) if transient(&KafkaError::AdminOp(code)) => {
                    return Err(KafkaError::AdminOp(code));
                }
                Err((name, code)) => {
                    return Ok(Err(BusError::backend(
                        "kafka",
                        format!(
                            "creating topic {name:?} failed: {code} (check the broker's limits, e.g. replication factor against the number of brokers)"
                        ),
                    )));
                }
            }
        }
        Ok(Ok(()))
    })?
}

/// Polls metadata until `topic` shows all its partitions with a leader.
fn wait_ready(
    options: &KafkaOptions,
    admin: &Admin,
    topic: &str,
    partitions: usize,
    deadline: Instant,
) -> Result<(), BusError> {
    let mut pause = Duration::from_millis(5);
    loop {
        if topic_ready(options, admin.inner(), topic, partitions, deadline)? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(crate::errors::timed_out(
                options,
                &format!("waiting for topic {topic:?} to appear in metadata"),
            ));
        }
        std::thread::park_timeout(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Writes (or, with `None`, tombstones) the manifest entry of `name`.
fn write_entry(
    core: &Core,
    name: &str,
    value: Option<&[u8]>,
    deadline: Instant,
) -> Result<(), BusError> {
    let topic = core.options.manifest_topic.as_str();
    let mut outcome = crate::publish::deliver(core, 1, &[], deadline, |_, ticket| {
        let record = BaseRecord::with_opaque_to(topic, ticket)
            .partition(0)
            .key(name);
        match value {
            Some(value) => record.payload(value),
            None => record,
        }
    });
    outcome
        .pop()
        .unwrap_or_else(|| {
            Err(crate::errors::timed_out(
                &core.options,
                "recording the manifest",
            ))
        })
        .map(drop)
}
