//! The producer side: a `send <topic>` span around a publish, and the
//! W3C trace context it writes into the record's headers.

use opentelemetry::trace::{Span as _, SpanKind, Status};
use opentelemetry::{Context, KeyValue, global::BoxedSpan};

use super::{TRACEPARENT, TRACESTATE, error_type, start, w3c};
use crate::{BatchRecord, BatchRecordWithHeaders, BusError, Headers, PublishAck};

/// One publish (or batch) in its `send` span.
pub(crate) struct Sending {
    span: BoxedSpan,
    system: &'static str,
    /// The headers to publish with instead of the caller's: theirs plus
    /// the trace context. `None`: publish as the caller asked.
    headers: Option<Headers>,
}

impl Sending {
    /// Starts the span for a publish of one record to `topic` with the
    /// caller's `headers`, and, when `inject` (the backend keeps headers)
    /// and the span has a valid context, works out the headers carrying
    /// it.
    ///
    /// # Errors
    /// `InvalidArgument` on `headers.traceparent` when the caller's own
    /// `traceparent` is not W3C.
    pub(crate) fn start(
        system: &'static str,
        topic: &str,
        headers: &Headers,
        inject: bool,
    ) -> Result<Self, BusError> {
        let mut span = start(system, "send", SpanKind::Producer, &Context::current());
        let recording = span.is_recording();
        if recording {
            span.update_name(format!("send {topic}"));
            span.set_attribute(KeyValue::new(
                "messaging.destination.name",
                topic.to_owned(),
            ));
        }
        let mut sending = Self {
            span,
            system,
            headers: None,
        };
        sending.headers = sending.carry(topic, headers, inject, "headers.traceparent")?;
        Ok(sending)
    }

    /// The headers a record published in this span carries: `None` to
    /// publish `headers` as they are (the caller's own `traceparent`,
    /// which stays and is linked, or no context to add), else `headers`
    /// with this span's context.
    ///
    /// # Errors
    /// `InvalidArgument` on `field` when the caller's own `traceparent`
    /// is not W3C.
    fn carry(
        &mut self,
        topic: &str,
        headers: &Headers,
        inject: bool,
        field: &str,
    ) -> Result<Option<Headers>, BusError> {
        if let Some(given) = headers.get(TRACEPARENT) {
            // The caller's creation context is kept as it is.
            let creation = w3c::parse(given, headers.get(TRACESTATE)).map_err(|why| {
                let error = BusError::invalid(
                    field,
                    format!(
                        "{given:?} is not a W3C traceparent ({why}); leave it out and the bus writes the current span's"
                    ),
                );
                self.fail(&error);
                error
            })?;
            if self.span.is_recording() {
                self.span.add_link(creation, Vec::new());
            }
            Ok(None)
        } else if inject && self.span.span_context().is_valid() {
            Ok(with_context(topic, headers, self.span.span_context()))
        } else {
            Ok(None)
        }
    }

    /// The records of a batch publish of `publish_batch`, each with this
    /// span's context in its headers; `None` to publish them as they are
    /// (the bus keeps no headers, or the span has no valid context).
    pub(crate) fn batch_records(
        &mut self,
        topic: &str,
        records: &[BatchRecord],
        inject: bool,
    ) -> Option<Vec<BatchRecordWithHeaders>> {
        if !inject || !self.span.span_context().is_valid() {
            return None;
        }
        let headers = with_context(topic, &Headers::new(), self.span.span_context())?;
        Some(
            records
                .iter()
                .map(|record| record.clone().with_headers(headers.clone()))
                .collect(),
        )
    }

    /// The records of a batch publish of `publish_batch_with_headers`,
    /// each without a `traceparent` of its own given this span's context;
    /// `None` to publish them as they are. A record's own context stays
    /// and is linked, as in a single publish.
    ///
    /// # Errors
    /// `InvalidArgument` on `records[i].headers.traceparent` when a
    /// record's own `traceparent` is not W3C (nothing is published).
    pub(crate) fn batch_headers(
        &mut self,
        topic: &str,
        records: &[BatchRecordWithHeaders],
        inject: bool,
    ) -> Result<Option<Vec<BatchRecordWithHeaders>>, BusError> {
        let mut carried: Option<Vec<BatchRecordWithHeaders>> = None;
        for (i, record) in records.iter().enumerate() {
            let field = format!("records[{i}].headers.traceparent");
            if let Some(headers) = self.carry(topic, &record.headers, inject, &field)? {
                let all = carried.get_or_insert_with(|| records.to_vec());
                all[i].headers = headers;
            }
        }
        Ok(carried)
    }

    /// Starts the span for a batch of `records` records; the records'
    /// headers get its context from [`Sending::batch_records`] or
    /// [`Sending::batch_headers`].
    pub(crate) fn batch(system: &'static str, topic: &str, records: usize) -> Self {
        let mut span = start(system, "send", SpanKind::Producer, &Context::current());
        if span.is_recording() {
            span.update_name(format!("send {topic}"));
            span.set_attributes([
                KeyValue::new("messaging.destination.name", topic.to_owned()),
                KeyValue::new(
                    "messaging.batch.message_count",
                    i64::try_from(records).unwrap_or(i64::MAX),
                ),
            ]);
        }
        Self {
            span,
            system,
            headers: None,
        }
    }

    /// The headers to publish with in place of the caller's, when the
    /// trace context was added to them.
    pub(crate) fn headers(&self) -> Option<&Headers> {
        self.headers.as_ref()
    }

    /// Ends the span of a single publish with what it did: the ack's
    /// partition and offset, the record's UID (`uid` or the value's
    /// `metadata.uid`), or the error.
    pub(crate) fn finish(
        mut self,
        uid: Option<&str>,
        value: &serde_json::Value,
        result: &Result<PublishAck, BusError>,
    ) {
        if self.span.is_recording() {
            match result {
                Ok(ack) => {
                    self.span
                        .set_attributes(place(self.system, ack.partition, ack.offset));
                    if let Some(uid) = uid.or_else(|| crate::embedded_uid(value)) {
                        self.span
                            .set_attribute(KeyValue::new("messaging.message.id", uid.to_owned()));
                    }
                }
                Err(error) => self.fail(error),
            }
        }
        self.span.end();
    }

    /// Ends the span of a batch.
    pub(crate) fn finish_batch(mut self, result: &Result<Vec<PublishAck>, BusError>) {
        if let Err(error) = result {
            self.fail(error);
        }
        self.span.end();
    }

    fn fail(&mut self, error: &BusError) {
        if self.span.is_recording() {
            self.span
                .set_attribute(KeyValue::new("error.type", error_type(error)));
            self.span.set_status(Status::error(error.to_string()));
        }
    }
}

/// The attributes of a record's place: partition, offset.
pub(super) fn place(system: &'static str, partition: u32, offset: u64) -> Vec<KeyValue> {
    let offset = i64::try_from(offset).unwrap_or(i64::MAX);
    let mut attributes = vec![
        KeyValue::new("messaging.destination.partition.id", partition.to_string()),
        KeyValue::new("bus.offset", offset),
    ];
    if system == "kafka" {
        attributes.push(KeyValue::new("messaging.kafka.offset", offset));
    }
    attributes
}

/// `headers` plus the W3C context of `span`; `None` (with a `warn!`) when
/// the limits of [`Headers`] leave no room for it.
fn with_context(
    topic: &str,
    headers: &Headers,
    span: &opentelemetry::trace::SpanContext,
) -> Option<Headers> {
    let mut with = headers.clone();
    if let Err(error) = with.insert(TRACEPARENT, w3c::traceparent(span)) {
        tracing::warn!(topic, %error, "the record's headers leave no room for its traceparent: published without trace context");
        return None;
    }
    let state = span.trace_state().header();
    if !state.is_empty()
        && headers.get(TRACESTATE).is_none()
        && let Err(error) = with.insert(TRACESTATE, state)
    {
        tracing::warn!(topic, %error, "the record's headers leave no room for its tracestate: published with traceparent only");
    }
    Some(with)
}
