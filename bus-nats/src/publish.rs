//! Publishing (contracts C4, C6, C12): each record awaits its PubAck; a
//! batch sends every record first and then awaits the acks (pipelined).

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use bus_core::auth::{RecordAuth, RecordParts};
use bus_core::{
    BusError, Headers, PublishAck, backend::PreparedRecord, backend::prepare_record_with,
};
use bytes::Bytes;

use crate::errors::{PublishFailure, publish_failure};
use crate::get::Reads;
use crate::naming::record_subject_as;
use crate::record::{Guard, headers_len, record_headers};
use crate::shared::{RESEND_INTERVAL, Shared, TopicState};
use crate::topics::{stream_info, unanswered};
use crate::uid::{Resolved, UidSubject};

/// Publishes of one UID record tried before giving up on a subject that
/// keeps changing under it.
const MAX_SETTLE_ATTEMPTS: usize = 8;

/// A validated, signed record ready to send.
pub(crate) struct Prepared {
    partition: u32,
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
    /// A UID record keeps what it needs to find the UID's first record or
    /// to be sent again under another guard (see [`crate::uid`]).
    resend: Option<Resend>,
}

struct Resend {
    key: String,
    uid: String,
    /// Signed again with the record on every resend (C25).
    headers: Headers,
    auth: Option<RecordAuth>,
}

/// Checks and encodes one record; nothing is sent yet, so a batch with a
/// bad record stores nothing.
pub(crate) fn prepare(
    shared: &Shared,
    topic: &TopicState,
    key: &str,
    value: &serde_json::Value,
    uid: Option<&str>,
    carried: &Headers,
) -> Result<Prepared, BusError> {
    let spec = &topic.spec;
    // Signed below, with the headers that carry the tag.
    let PreparedRecord {
        partition,
        uid,
        value: payload,
        ..
    } = prepare_record_with(spec, key, value, uid, carried, None)?;
    let stream = topic
        .partitions
        .get(partition as usize)
        .map(|state| state.stream.as_str())
        .ok_or_else(|| {
            BusError::backend(
                "nats",
                format!("topic {:?} lost partition {partition}", spec.name),
            )
        })?;
    let parts = RecordParts {
        topic: &spec.name,
        partition,
        key,
        uid,
        value: &payload,
    };
    let auth = shared.auth();
    // Without a `Nats-Msg-Id`, "the subject holds nothing" is the condition
    // itself: a last subject sequence of 0.
    let guard = if topic.uid_subjects.with_msg_id() {
        Guard::Empty
    } else {
        Guard::After(0)
    };
    let headers = record_headers(auth.as_ref(), parts, carried, guard)?;
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
        subject: record_subject_as(stream, uid, topic.uid_subjects),
        headers,
        resend: uid.map(|uid| Resend {
            key: key.to_owned(),
            uid: uid.to_owned(),
            headers: carried.clone(),
            auth,
        }),
        payload: Bytes::from(payload),
    })
}

/// Sends `records` in order, then awaits every ack; returns them in order.
pub(crate) async fn send_all(
    shared: Arc<Shared>,
    topic: Arc<TopicState>,
    records: Vec<Prepared>,
) -> Result<Vec<PublishAck>, BusError> {
    let name = topic.spec.name.as_str();
    let what = format!("publish to topic {name:?}");
    let deadline = tokio::time::Instant::now() + shared.timeout;
    let mut pending = Vec::with_capacity(records.len());
    for record in records {
        let size = record.payload.len() + headers_len(&record.headers);
        let headers = Some(record.headers.clone());
        let retry = record
            .resend
            .map(|resend| (record.subject.clone(), record.payload.clone(), resend));
        // A record without a UID is sent again only after "no responders":
        // no server took it, so it cannot be stored twice.
        let again = retry
            .is_none()
            .then(|| (record.subject.clone(), record.payload.clone()));
        // A UID record may be sent again (the message id deduplicates), so
        // it waits for its ack in short attempts; others wait once.
        let js = if retry.is_some() {
            &shared.resend_js
        } else {
            &shared.js
        };
        let sent = js
            .publish_with_headers(record.subject, record.headers, record.payload)
            .await;
        pending.push((record.partition, size, sent, retry, headers, again));
    }
    let mut acks = Vec::with_capacity(pending.len());
    for (partition, size, sent, retry, headers, again) in pending {
        let mut acked = match sent {
            Ok(future) => future.await,
            Err(error) => Err(error),
        };
        // "No responders" for a record without a UID: its stream has no
        // leader yet (a replicated stream just created, or electing after
        // its leader died). Unless the stream is gone, send it again shortly
        // until the timeout.
        if let (Some((subject, payload)), Some(headers)) = (&again, &headers) {
            let mut stream_exists = false;
            while let Err(error) = &acked {
                let no_leader = error.kind() == PublishErrorKind::StreamNotFound;
                let in_time =
                    tokio::time::Instant::now() + NO_LEADER_PAUSE + RESEND_INTERVAL <= deadline;
                if !no_leader
                    || !in_time
                    || (!stream_exists && stream_gone(&shared, &topic, partition).await)
                {
                    break;
                }
                stream_exists = true;
                tokio::time::sleep(NO_LEADER_PAUSE).await;
                acked = send_again(&shared.js, subject, headers, payload).await;
            }
        }
        if let (Some((subject, payload, _)), Some(headers)) = (&retry, &headers) {
            let mut stream_exists = false;
            let mut resends = 0_u32;
            while let Err(error) = &acked {
                let pause = match error.kind() {
                    PublishErrorKind::TimedOut => Duration::ZERO,
                    // The connection moves to another server: not at once.
                    PublishErrorKind::BrokenPipe => Duration::from_millis(50),
                    // "No responders": a clustered stream has no leader
                    // while a new one is elected after its leader died.
                    // Unless the stream is gone, send again shortly rather
                    // than wait a whole timeout for its info.
                    PublishErrorKind::StreamNotFound
                        if stream_exists || !stream_gone(&shared, &topic, partition).await =>
                    {
                        stream_exists = true;
                        NO_LEADER_PAUSE
                    }
                    _ => break,
                };
                if tokio::time::Instant::now() + pause + RESEND_INTERVAL > deadline {
                    tracing::warn!(
                        topic = name,
                        partition,
                        attempts = resends + 1,
                        error = %error,
                        "nats: giving up resending a UID record: the publish timeout is near"
                    );
                    break;
                }
                resends += 1;
                tracing::debug!(
                    topic = name,
                    partition,
                    attempt = resends + 1,
                    error = %error,
                    "nats: resending a UID record"
                );
                tokio::time::sleep(pause).await;
                acked = send_again(&shared.resend_js, subject, headers, payload).await;
            }
        }
        let sequence = match (acked, retry) {
            (Ok(ack), Some(retry)) if ack.duplicate => {
                // A window duplicate names whatever carried the UID's
                // Nats-Msg-Id: check it like a conflict.
                bus_core::backend::metrics::dedup_hits("nats", name, 1);
                settle(&shared, &topic, partition, &retry, &what).await?
            }
            (Ok(ack), _) => {
                bus_core::backend::metrics::stored("nats", name, 1, size as u64);
                ack.sequence
            }
            (Err(error), retry) => match failure(&shared, name, &what, size, error) {
                PublishFailure::AlreadyStored(sequence) => match retry {
                    Some(retry) => settle(&shared, &topic, partition, &retry, &what).await?,
                    None => sequence,
                },
                PublishFailure::InProcess => match retry {
                    Some(retry) => settle(&shared, &topic, partition, &retry, &what).await?,
                    None => {
                        return Err(BusError::backend(
                            "nats",
                            format!(
                                "{what}: the server reports a duplicate message id in process for a \
                             record without a UID"
                            ),
                        ));
                    }
                },
                PublishFailure::NoResponders => {
                    let stream = &topic.partition(partition)?.stream;
                    return Err(unanswered(&shared, name, stream, &what).await);
                }
                PublishFailure::Other(error) => return Err(error),
            },
        };
        if let Some(state) = topic.partitions.get(partition as usize) {
            state.saw(sequence);
        }
        acks.push(PublishAck {
            topic: name.to_owned(),
            partition,
            offset: sequence.saturating_sub(1),
        });
    }
    Ok(acks)
}

/// Sends a record again through `js` and awaits its ack.
async fn send_again(
    js: &async_nats::jetstream::Context,
    subject: &str,
    headers: &HeaderMap,
    payload: &Bytes,
) -> Result<async_nats::jetstream::publish::PublishAck, PublishError> {
    match js
        .publish_with_headers(subject.to_owned(), headers.clone(), payload.clone())
        .await
    {
        Ok(future) => future.await,
        Err(error) => Err(error),
    }
}

/// Between two sends of a record while its stream has no leader.
const NO_LEADER_PAUSE: Duration = Duration::from_millis(200);

/// Whether the server says `partition`'s stream does not exist (asked with
/// the short resend timeout: a stream electing a leader may not answer).
async fn stream_gone(shared: &Shared, topic: &TopicState, partition: u32) -> bool {
    match topic.partitions.get(partition as usize) {
        Some(state) => matches!(
            stream_info(&shared.resend_js, &state.stream).await,
            Ok(None)
        ),
        None => true,
    }
}

fn failure(
    shared: &Shared,
    topic: &str,
    what: &str,
    size: usize,
    error: PublishError,
) -> PublishFailure {
    publish_failure(error, what, shared.timeout, size, shared.max_payload, topic)
}

/// The UID's subject already holds something: answer with its first
/// authentic record (the refusal names the subject's last message, which may
/// be a replay), or store this one after the forgeries, conditioned on the
/// subject's last sequence (so concurrent retries still store one record).
async fn settle(
    shared: &Shared,
    topic: &TopicState,
    partition: u32,
    (subject, payload, resend): &(String, Bytes, Resend),
    what: &str,
) -> Result<u64, BusError> {
    let name = topic.spec.name.as_str();
    let state = topic.partitions.get(partition as usize).ok_or_else(|| {
        BusError::backend("nats", format!("topic {name:?} lost partition {partition}"))
    })?;
    let stream = shared
        .js
        .get_stream_no_info(&state.stream)
        .await
        .map_err(|error| BusError::backend_caused("nats", format!("{what}: {error}"), error))?;
    let lookup = UidSubject {
        reads: Reads::new(&stream, shared.clustered),
        subject,
        topic: name,
        partition,
        uid: &resend.uid,
        auth: resend.auth.as_ref(),
        what,
    };
    let mut in_process_waits = 0_u32;
    let mut waited = std::time::Duration::ZERO;
    let mut attempt = 0;
    while attempt < MAX_SETTLE_ATTEMPTS {
        attempt += 1;
        let last = match lookup.resolve().await? {
            Resolved::Authentic(sequence) => return Ok(sequence),
            Resolved::Absent { last } => last,
        };
        let parts = RecordParts {
            topic: name,
            partition,
            key: &resend.key,
            uid: Some(&resend.uid),
            value: payload,
        };
        let headers = record_headers(
            resend.auth.as_ref(),
            parts,
            &resend.headers,
            Guard::After(last),
        )?;
        let size = payload.len() + headers_len(&headers);
        let acked = match shared
            .js
            .publish_with_headers(subject.clone(), headers, payload.clone())
            .await
        {
            Ok(future) => future.await,
            Err(error) => Err(error),
        };
        match acked {
            Ok(ack) if !ack.duplicate => return Ok(ack.sequence),
            Ok(ack) => tracing::debug!(
                topic = name,
                partition,
                attempt,
                duplicate_of = ack.sequence,
                "nats: a UID record's conditional publish was a duplicate; looking again"
            ),
            Err(error) => match failure(shared, name, what, size, error) {
                // Someone stored on the subject meanwhile: look again.
                PublishFailure::AlreadyStored(stored) => tracing::debug!(
                    topic = name,
                    partition,
                    attempt,
                    stored,
                    "nats: a UID record's subject changed meanwhile; looking again"
                ),
                // Another publish of this UID is being replicated: give it
                // a moment (backoff, bounded by the operation timeout) and
                // look again, without spending an attempt.
                PublishFailure::InProcess => {
                    let pause = std::time::Duration::from_millis(1 << in_process_waits.min(6));
                    if waited + pause > shared.timeout {
                        tracing::warn!(
                            topic = name,
                            partition,
                            attempt,
                            waits = in_process_waits,
                            "nats: giving up on a UID record another publish keeps in process"
                        );
                        return Err(crate::errors::timed_out(what, shared.timeout));
                    }
                    tracing::debug!(
                        topic = name,
                        partition,
                        attempt,
                        pause_ms = pause.as_millis(),
                        "nats: a UID record is in process elsewhere; waiting"
                    );
                    waited += pause;
                    in_process_waits += 1;
                    attempt -= 1;
                    tokio::time::sleep(pause).await;
                }
                PublishFailure::NoResponders => {
                    return Err(unanswered(shared, name, &state.stream, what).await);
                }
                PublishFailure::Other(error) => return Err(error),
            },
        }
    }
    tracing::warn!(
        topic = name,
        partition,
        attempts = MAX_SETTLE_ATTEMPTS,
        "nats: giving up storing a UID record: its subject kept changing"
    );
    Err(BusError::backend(
        "nats",
        format!(
            "{what}: the subject of a UID kept changing during {MAX_SETTLE_ATTEMPTS} attempts; retry"
        ),
    ))
}
