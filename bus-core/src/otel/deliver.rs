//! The consumer side: a `process <topic>` span per delivered record, and a
//! `receive <topic>` span per fetch.

use opentelemetry::trace::{Span as _, SpanKind, TraceContextExt as _};
use opentelemetry::{Context, KeyValue, global::BoxedSpan};

use super::{creation_context, error_type, send::place, start};
use crate::{BusError, Headers, StoredEvent, StoredRecord};

/// The `process` span of the record a subscription or consumer handed out
/// last; it ends when the next item is asked for, or with the owner.
#[derive(Debug)]
pub(crate) struct Deliveries {
    system: &'static str,
    current: Option<Context>,
}

impl Deliveries {
    pub(crate) fn new(system: &'static str) -> Self {
        Self {
            system,
            current: None,
        }
    }

    /// Starts the span of a delivery of `event` from `topic` (ending the
    /// previous one): a child of the record's creation context when its
    /// headers carry one, else of the current context.
    pub(crate) fn begin(&mut self, topic: &str, event: &StoredEvent, headers: &Headers) {
        self.end();
        let creation = creation_context(headers);
        let ambient = Context::current();
        let parent = match &creation {
            Some(creation) => ambient.with_remote_span_context(creation.clone()),
            None => ambient.clone(),
        };
        let mut span = start(self.system, "process", SpanKind::Consumer, &parent);
        if !span.span_context().is_valid() {
            // Nothing records and no context to pass on.
            return;
        }
        if span.is_recording() {
            span.update_name(format!("process {topic}"));
            span.set_attribute(KeyValue::new(
                "messaging.destination.name",
                topic.to_owned(),
            ));
            span.set_attributes(place(self.system, event.partition, event.offset));
            if self.system == "kafka" {
                span.set_attribute(KeyValue::new(
                    "messaging.kafka.message.key",
                    event.key.clone(),
                ));
            }
            if let Some(uid) = crate::embedded_uid(&event.value) {
                span.set_attribute(KeyValue::new("messaging.message.id", uid.to_owned()));
            }
            if let Some(creation) = creation {
                span.add_link(creation, Vec::new());
                if ambient.has_active_span() {
                    span.add_link(ambient.span().span_context().clone(), Vec::new());
                }
            }
        }
        self.current = Some(parent.with_span(span));
    }

    /// Ends the span of the last delivery, if one is open.
    pub(crate) fn end(&mut self) {
        if let Some(context) = self.current.take() {
            context.span().end();
        }
    }

    /// The context of the open delivery span.
    pub(crate) fn context(&self) -> Option<&Context> {
        self.current.as_ref()
    }
}

impl Drop for Deliveries {
    fn drop(&mut self) {
        self.end();
    }
}

/// One fetch in its `receive` span.
pub(crate) struct Receiving {
    span: BoxedSpan,
}

impl Receiving {
    pub(crate) fn start(system: &'static str, topic: &str, partition: u32) -> Self {
        let mut span = start(system, "receive", SpanKind::Client, &Context::current());
        if span.is_recording() {
            span.update_name(format!("receive {topic}"));
            span.set_attributes([
                KeyValue::new("messaging.destination.name", topic.to_owned()),
                KeyValue::new("messaging.destination.partition.id", partition.to_string()),
            ]);
        }
        Self { span }
    }

    /// Ends the span of a fetch that returned `records`, linked to each
    /// one's creation context.
    pub(crate) fn finish_records(mut self, result: &Result<Vec<StoredRecord>, BusError>) {
        if self.span.is_recording()
            && let Ok(records) = result
        {
            for record in records {
                if let Some(creation) = creation_context(&record.headers) {
                    self.span.add_link(creation, Vec::new());
                }
            }
        }
        self.finish(result.as_ref().map(Vec::len));
    }

    /// Ends the span of a fetch that returned `events` (no headers, so no
    /// links).
    pub(crate) fn finish_events(self, result: &Result<Vec<StoredEvent>, BusError>) {
        self.finish(result.as_ref().map(Vec::len));
    }

    fn finish(mut self, count: Result<usize, &BusError>) {
        if self.span.is_recording() {
            match count {
                Ok(count) => self.span.set_attribute(KeyValue::new(
                    "messaging.batch.message_count",
                    i64::try_from(count).unwrap_or(i64::MAX),
                )),
                Err(error) => {
                    self.span
                        .set_attribute(KeyValue::new("error.type", error_type(error)));
                    self.span
                        .set_status(opentelemetry::trace::Status::error(error.to_string()));
                }
            }
        }
        self.span.end();
    }
}
