//! Publishing (contracts C4, C6, C12): each record awaits its PubAck; a
//! batch sends every record first and then awaits the acks (pipelined).

use std::sync::Arc;

use async_nats::HeaderMap;
use bus_core::auth::RecordParts;
use bus_core::{
    BusError, PublishAck, encode_value, partition_for, resolve_uid, validate_key, validate_uid,
};
use bytes::Bytes;

use crate::errors::{PublishFailure, publish_failure};
use crate::naming::record_subject;
use crate::record::{headers_len, record_headers};
use crate::shared::{Shared, TopicState};

/// A validated, signed record ready to send.
pub(crate) struct Prepared {
    partition: u32,
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
}

/// Checks and encodes one record; nothing is sent yet, so a batch with a
/// bad record stores nothing.
pub(crate) fn prepare(
    shared: &Shared,
    topic: &TopicState,
    key: &str,
    value: &serde_json::Value,
    uid: Option<&str>,
) -> Result<Prepared, BusError> {
    let spec = &topic.spec;
    validate_key(key)?;
    let uid = resolve_uid(value, uid)?;
    if let Some(uid) = uid {
        validate_uid(uid)?;
    }
    let payload = encode_value(&spec.name, value, spec.max_record_bytes)?;
    let partition = partition_for(key, spec.partitions);
    let stream = topic
        .partitions
        .get(partition as usize)
        .map(|state| state.stream.as_str())
        .ok_or_else(|| {
            BusError::Backend(format!("topic {:?} lost partition {partition}", spec.name))
        })?;
    let parts = RecordParts {
        topic: &spec.name,
        partition,
        key,
        uid,
        value: &payload,
    };
    let headers = record_headers(shared.auth().as_ref(), parts)?;
    // The server would refuse a message over its max_payload; say so with
    // the sizes instead of letting the publish fail obscurely.
    let size = payload.len() + headers_len(&headers);
    if size > shared.max_payload {
        return Err(BusError::TooLarge {
            topic: spec.name.clone(),
            size: size as u64,
            limit: shared.max_payload as u64,
        });
    }
    Ok(Prepared {
        partition,
        subject: record_subject(stream, uid),
        headers,
        payload: Bytes::from(payload),
    })
}

/// Sends `records` in order, then awaits every ack; returns them in order.
pub(crate) async fn send_all(
    shared: Arc<Shared>,
    topic: String,
    records: Vec<Prepared>,
) -> Result<Vec<PublishAck>, BusError> {
    let what = format!("publish to topic {topic:?}");
    let mut pending = Vec::with_capacity(records.len());
    for record in records {
        let size = record.payload.len() + headers_len(&record.headers);
        let sent = shared
            .js
            .publish_with_headers(record.subject, record.headers, record.payload)
            .await;
        pending.push((record.partition, size, sent));
    }
    let mut acks = Vec::with_capacity(pending.len());
    for (partition, size, sent) in pending {
        let acked = match sent {
            Ok(future) => future.await,
            Err(error) => Err(error),
        };
        let sequence = match acked {
            Ok(ack) => ack.sequence,
            Err(error) => {
                match publish_failure(
                    &error,
                    &what,
                    shared.timeout,
                    size,
                    shared.max_payload,
                    &topic,
                ) {
                    PublishFailure::AlreadyStored(sequence) => sequence,
                    PublishFailure::StreamGone => {
                        shared.forget(&topic);
                        return Err(BusError::UnknownTopic(topic));
                    }
                    PublishFailure::Other(error) => return Err(error),
                }
            }
        };
        acks.push(PublishAck {
            topic: topic.clone(),
            partition,
            offset: sequence.saturating_sub(1),
        });
    }
    Ok(acks)
}
