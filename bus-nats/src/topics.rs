//! Provisioning (contract C1): one stream per partition, the topic's spec
//! recorded in stream metadata so every process answers `topics()` and
//! `partitions()` from the server. Partition 0's stream is created last and
//! marks the topic as complete.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::context::CreateStreamErrorKind;
use async_nats::jetstream::response::Response;
use async_nats::jetstream::stream::{Config, DiscardPolicy, Info, StorageType};
use async_nats::jetstream::{Context, ErrorCode};
use bus_core::{BusError, Manifest, TopicSpec};
use futures::StreamExt;
use futures::future::try_join_all;

use crate::errors::{ApiFailure, api_error, timed_out, unavailable, unavailable_caused};
use crate::naming::{
    META_PARTITION, META_SPEC, META_TOPIC, META_UID_SUBJECTS, UidSubjects, stream_name,
    stream_subjects,
};
use crate::shared::{Recorded, Shared};

/// Room kept beside the value for a record's headers: a key and a UID of
/// up to 1 KiB each, percent-encoded (3 bytes a byte at worst), plus the
/// tag, the message id, the condition and the header framing.
pub(crate) const HEADER_ALLOWANCE: usize = 8 * 1024;

/// JetStream refuses duplicate windows below this.
const MIN_DUPLICATE_WINDOW: Duration = Duration::from_millis(100);

/// The stream's info, `None` when it does not exist.
pub(crate) async fn stream_info(js: &Context, stream: &str) -> Result<Option<Info>, ApiFailure> {
    let response: Response<Info> = js
        .request(format!("STREAM.INFO.{stream}"), &serde_json::json!({}))
        .await
        .map_err(ApiFailure::Request)?;
    match response {
        Response::Ok(info) => Ok(Some(info)),
        Response::Err { error } if error.error_code() == ErrorCode::STREAM_NOT_FOUND => Ok(None),
        Response::Err { error } => Err(ApiFailure::Api(error)),
    }
}

/// Why nothing answered a publish on `topic`'s `stream`: a stream the
/// server says does not exist makes the topic unknown (and forgotten, so a
/// topic provisioned again is looked up afresh); a stream that exists, or a
/// server that cannot say, is an outage, and the topic stays known.
pub(crate) async fn unanswered(shared: &Shared, topic: &str, stream: &str, what: &str) -> BusError {
    match stream_info(&shared.js, stream).await {
        Ok(None) => {
            shared.forget(topic);
            BusError::UnknownTopic(topic.to_owned())
        }
        Ok(Some(_)) => unavailable(format!(
            "{what}: JetStream did not answer for stream {stream} (is the server shutting down?)"
        )),
        Err(failure) => failure.into_bus(what, shared.timeout),
    }
}

/// How a stream's metadata says it spells UID subjects; `None` for a
/// spelling this version does not know.
fn recorded_uid_subjects(config: &Config) -> Option<UidSubjects> {
    UidSubjects::from_recorded(config.metadata.get(META_UID_SUBJECTS).map(String::as_str))
}

/// The topic recorded on a partition-0 stream, if it is one of ours for
/// `topic` (a spelling of UID subjects this version does not know makes it
/// none of ours: writing to it would break its dedup).
fn recorded_spec(config: &Config, topic: Option<&str>) -> Option<Recorded> {
    let metadata = &config.metadata;
    if metadata.get(META_PARTITION).map(String::as_str) != Some("0") {
        return None;
    }
    let name = metadata.get(META_TOPIC)?;
    if topic.is_some_and(|topic| topic != name) {
        return None;
    }
    let spec: TopicSpec = serde_json::from_str(metadata.get(META_SPEC)?).ok()?;
    let uid_subjects = recorded_uid_subjects(config)?;
    (spec.name == *name).then_some(Recorded { spec, uid_subjects })
}

/// The spec of `topic` as the server records it, `None` when not provisioned.
pub(crate) async fn lookup(shared: &Shared, topic: &str) -> Result<Option<Recorded>, BusError> {
    let stream = stream_name(&shared.prefix, topic, 0);
    let info = stream_info(&shared.js, &stream).await.map_err(|failure| {
        failure.into_bus(&format!("looking up topic {topic:?}"), shared.timeout)
    })?;
    Ok(info.and_then(|info| recorded_spec(&info.config, Some(topic))))
}

/// Every topic of this prefix on the server.
pub(crate) async fn list(shared: &Shared) -> Result<Vec<Recorded>, BusError> {
    let ours = format!("{}_", shared.prefix);
    let mut streams = shared.js.streams();
    let mut specs = Vec::new();
    while let Some(info) = streams.next().await {
        let info =
            info.map_err(|error| unavailable_caused(format!("listing streams: {error}"), error))?;
        if info.config.name.starts_with(&ours) {
            specs.extend(recorded_spec(&info.config, None));
        }
    }
    // The listing is paged by offset; on a cluster, streams created by
    // others while it pages can shift a stream onto the next page twice.
    specs.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
    specs.dedup_by(|a, b| a.spec.name == b.spec.name);
    Ok(specs)
}

fn stream_config(prefix: &str, spec: &TopicSpec, partition: u32) -> Config {
    let name = stream_name(prefix, &spec.name, partition);
    let max_age = spec
        .retention_ms
        .map_or(Duration::ZERO, Duration::from_millis);
    // JetStream wants the duplicate window within max_age; the per-UID
    // subjects keep dedup for as long as records are retained anyway.
    let mut duplicate_window =
        Duration::from_millis(spec.dedup_window_ms).max(MIN_DUPLICATE_WINDOW);
    if !max_age.is_zero() {
        duplicate_window = duplicate_window.min(max_age);
    }
    let mut metadata = HashMap::from([
        (META_TOPIC.to_owned(), spec.name.clone()),
        (META_PARTITION.to_owned(), partition.to_string()),
        (
            META_SPEC.to_owned(),
            serde_json::to_string(spec).unwrap_or_default(),
        ),
    ]);
    if let Some(spelling) = UidSubjects::CURRENT.recorded_as() {
        metadata.insert(META_UID_SUBJECTS.to_owned(), spelling.to_owned());
    }
    Config {
        subjects: vec![stream_subjects(&name)],
        name,
        storage: StorageType::File,
        discard: DiscardPolicy::Old,
        max_age,
        duplicate_window,
        num_replicas: usize::from(spec.replication_factor),
        allow_direct: true,
        metadata,
        description: Some(format!("bus topic {:?} partition {partition}", spec.name)),
        ..Config::default()
    }
}

async fn create_partition(
    shared: &Shared,
    index: usize,
    spec: &TopicSpec,
    partition: u32,
) -> Result<(), BusError> {
    let config = stream_config(&shared.prefix, spec, partition);
    let name = config.name.clone();
    match shared.js.create_stream(config).await {
        Ok(_) => Ok(()),
        Err(error) => {
            if let CreateStreamErrorKind::JetStream(api) = error.kind()
                && api.error_code() == ErrorCode::STREAM_NAME_EXIST
            {
                // Another process provisioned it meanwhile: fine if it agrees.
                return match stream_info(&shared.js, &name).await {
                    Ok(Some(info)) => match info.config.metadata.get(META_SPEC) {
                        Some(recorded) => {
                            let existing: TopicSpec =
                                serde_json::from_str(recorded).map_err(|_| foreign(&name))?;
                            spec.conflict_with(&existing)?;
                            // Created by another version of the bus: its UID
                            // subjects are spelled otherwise than this one
                            // assumes for a topic it creates.
                            let found = recorded_uid_subjects(&info.config);
                            if found == Some(UidSubjects::CURRENT) {
                                return Ok(());
                            }
                            Err(BusError::Conflict {
                                topic: spec.name.clone(),
                                property: format!("the UID subjects of stream {name}"),
                                existing: format!(
                                    "{:?}",
                                    info.config.metadata.get(META_UID_SUBJECTS)
                                ),
                                requested: format!("{:?}", UidSubjects::CURRENT.recorded_as()),
                                fix: "another version of the bus created the stream; provision \
                                      again to use it as it is, or with a version that knows it"
                                    .to_owned(),
                            })
                        }
                        None => Err(foreign(&name)),
                    },
                    Ok(None) => Err(BusError::backend(
                        "nats",
                        format!(
                            "stream {name} vanished while provisioning {:?}; provision again",
                            spec.name
                        ),
                    )),
                    Err(failure) => Err(failure.into_bus("provisioning", shared.timeout)),
                };
            }
            let what = format!(
                "creating stream {name} for topic {:?} partition {partition}",
                spec.name
            );
            Err(match error.kind() {
                CreateStreamErrorKind::TimedOut => timed_out(&what, shared.timeout),
                CreateStreamErrorKind::JetStreamUnavailable => {
                    unavailable_caused(format!("{what}: {error}"), error)
                }
                CreateStreamErrorKind::JetStream(api)
                    if spec.replication_factor > 1
                        && [
                            REPLICAS_NOT_SUPPORTED,
                            ErrorCode::INSUFFICIENT_RESOURCES,
                            ErrorCode::CLUSTER_NO_PEERS,
                        ]
                        .contains(&api.error_code()) =>
                {
                    replication_too_large(index, spec, &api.to_string())
                }
                CreateStreamErrorKind::JetStream(api) => api_error(&what, api),
                _ => BusError::backend_caused("nats", format!("{what}: {error}"), error),
            })
        }
    }
}

/// JetStream's "replicas > 1 not supported in non-clustered mode".
const REPLICAS_NOT_SUPPORTED: ErrorCode = ErrorCode(10074);

fn replication_too_large(index: usize, spec: &TopicSpec, server: &str) -> BusError {
    BusError::invalid(
        format!("topics[{index}].replication_factor"),
        format!(
            "topic {:?} asks for {} replicas, more than the NATS cluster can place ({server}); \
             lower replication_factor or add servers",
            spec.name, spec.replication_factor
        ),
    )
}

fn foreign(stream: &str) -> BusError {
    BusError::backend(
        "nats",
        format!("stream {stream} exists but was not made by bus; pick another prefix or delete it"),
    )
}

/// Verifies every topic of `manifest` against the server first (so a
/// conflict creates nothing), then creates the missing ones.
pub(crate) async fn provision(
    shared: &Shared,
    manifest: &Manifest,
) -> Result<Vec<Recorded>, BusError> {
    manifest.refuse_cold("the NATS backend")?;
    for (index, spec) in manifest.topics.iter().enumerate() {
        check_record_limit(index, spec, shared.max_payload)?;
    }
    let mut missing = Vec::new();
    let mut present = Vec::new();
    for (index, spec) in manifest.topics.iter().enumerate() {
        match lookup(shared, &spec.name).await? {
            Some(existing) => {
                spec.conflict_with(&existing.spec)?;
                present.push(existing);
            }
            None => missing.push((index, spec.clone())),
        }
    }
    // The client cannot ask how many servers there are: the most replicated
    // topic goes first, so a factor the cluster cannot place fails before
    // anything is created.
    missing.sort_by_key(|(index, spec)| (std::cmp::Reverse(spec.replication_factor), *index));
    for (index, spec) in &missing {
        create_partition(shared, *index, spec, spec.partitions - 1).await?;
        try_join_all(
            (1..spec.partitions - 1)
                .map(|partition| create_partition(shared, *index, spec, partition)),
        )
        .await?;
        if spec.partitions > 1 {
            create_partition(shared, *index, spec, 0).await?;
        }
    }
    present.extend(missing.into_iter().map(|(_, spec)| Recorded {
        spec,
        uid_subjects: UidSubjects::CURRENT,
    }));
    Ok(present)
}

/// A topic whose largest record cannot fit in one NATS message is refused
/// when provisioned, not at its first big publish.
fn check_record_limit(index: usize, spec: &TopicSpec, max_payload: usize) -> Result<(), BusError> {
    let needed = usize::try_from(spec.max_record_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(HEADER_ALLOWANCE);
    if needed <= max_payload {
        return Ok(());
    }
    Err(BusError::invalid(
        format!("topics[{index}].max_record_bytes"),
        format!(
            "topic {:?} allows records of {} bytes, which with {HEADER_ALLOWANCE} bytes of headers \
             exceed the NATS server's max_payload of {max_payload} bytes; raise max_payload in the \
             server's config (e.g. `max_payload: 8MB`, at most 64MB) or lower max_record_bytes",
            spec.name, spec.max_record_bytes
        ),
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn record_limits_must_fit_the_server() {
        let spec = TopicSpec::new("t", 1);
        check_record_limit(0, &spec, 8 * 1024 * 1024).unwrap();
        // nats-server's default max_payload is 1 MiB: the default limit plus
        // headers does not fit.
        match check_record_limit(3, &spec, 1024 * 1024) {
            Err(BusError::InvalidArgument { field, .. }) => {
                assert_eq!(field, "topics[3].max_record_bytes");
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
}
