//! An SDK [`Event`] → what to publish: key, JSON value, headers.

use cloudevents::event::ExtensionValue;
use cloudevents::message::{BinaryDeserializer, BinarySerializer, MessageAttributeValue};
use cloudevents::{AttributesReader, AttributesWriter, Data, Event};

use super::{Spelling, is_json, sdk_error};
use crate::{BatchRecord, BatchRecordWithHeaders, BusError, EventBus, Headers, PublishAck};

/// An event ready for
/// [`EventBus::publish_with_headers`](crate::EventBus::publish_with_headers).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PublishParts {
    /// The partition key: the `partitionkey` extension, else the subject,
    /// else the id.
    pub key: String,
    /// The event's data as JSON (`null` for an event without data).
    pub value: serde_json::Value,
    /// The attributes and extensions as headers, checked against the
    /// [`Headers`] limits.
    pub headers: Headers,
}

impl PublishParts {
    /// The record for
    /// [`publish_batch_with_headers`](crate::EventBus::publish_batch_with_headers):
    /// several events in one batch, checked as a whole before anything is
    /// stored.
    pub fn into_batch_record(self) -> BatchRecordWithHeaders {
        BatchRecord::new(self.key, self.value).with_headers(self.headers)
    }
}

/// Maps `event` to a record in binary content mode, its attribute headers
/// spelled by `spelling` (see the [module docs](super) for the mapping).
///
/// # Errors
/// `InvalidArgument`: an empty `id`, `source` or `type` (field `ce_id`, …);
/// data the bus cannot store as JSON (field `data`); JSON data under a
/// non-JSON content type (field `content-type`); headers over the
/// [`Headers`] limits, e.g. a value over 1 KiB (field `headers`).
pub fn to_publish(event: &Event, spelling: Spelling) -> Result<PublishParts, BusError> {
    for (name, value) in [
        ("id", event.id()),
        ("source", event.source().as_str()),
        ("type", event.ty()),
    ] {
        if value.is_empty() {
            return Err(BusError::invalid(
                spelling.header(name),
                format!("a CloudEvent's {name} must not be empty"),
            ));
        }
    }
    let value = data_to_value(event, spelling)?;
    let key = match event.extension("partitionkey") {
        Some(ExtensionValue::String(key)) => key.clone(),
        Some(other) => other.to_string(),
        None => event.subject().unwrap_or(event.id()).to_owned(),
    };

    // The SDK walks the attributes and extensions; the data is mapped above.
    let mut attributes = event.clone();
    let (content_type, schema, _) = attributes.take_data();
    let content_type = content_type.or_else(|| event.data().map(|_| "application/json".to_owned()));
    attributes.set_datacontenttype(content_type);
    attributes.set_dataschema(schema);
    let headers = attributes
        .deserialize_binary(HeaderWriter {
            spelling,
            headers: Headers::new(),
        })
        .map_err(error_from_writer)?;
    Ok(PublishParts {
        key,
        value,
        headers,
    })
}

/// Publishes `event` on `topic` of `bus`, its headers spelled for the bus's
/// backend ([`Spelling::for_bus`]). No UID: a caller that wants the bus to
/// deduplicate retries passes one to
/// [`publish_with_headers`](crate::EventBus::publish_with_headers) itself
/// (the event's `id` is unique per `source`).
///
/// # Errors
/// As [`to_publish`], then as
/// [`publish_with_headers`](crate::EventBus::publish_with_headers).
pub fn publish(
    bus: &(impl EventBus + ?Sized),
    topic: &str,
    event: &Event,
) -> Result<PublishAck, BusError> {
    let parts = to_publish(event, Spelling::for_bus(bus))?;
    bus.publish_with_headers(topic, &parts.key, &parts.value, None, &parts.headers)
}

fn data_to_value(event: &Event, spelling: Spelling) -> Result<serde_json::Value, BusError> {
    let content_type = event.datacontenttype();
    let json = is_json(content_type);
    let described = content_type.unwrap_or("none");
    match event.data() {
        None => Ok(serde_json::Value::Null),
        Some(Data::Json(value)) if json => Ok(value.clone()),
        Some(Data::Json(_)) => Err(BusError::invalid(
            spelling.header("datacontenttype"),
            format!(
                "JSON data under the content type {described:?}; use application/json (or *+json)"
            ),
        )),
        Some(Data::String(text)) if json => serde_json::from_str(text).map_err(|error| {
            BusError::invalid(
                "data",
                format!("text data under the content type {described:?} is not JSON: {error}"),
            )
        }),
        Some(Data::String(text)) => Ok(serde_json::Value::String(text.clone())),
        Some(Data::Binary(bytes)) if json => serde_json::from_slice(bytes).map_err(|error| {
            BusError::invalid(
                "data",
                format!("binary data under the content type {described:?} is not JSON: {error}"),
            )
        }),
        Some(Data::Binary(bytes)) => Err(BusError::invalid(
            "data",
            format!(
                "{} bytes of binary data under the content type {described:?}: bus values are \
                 JSON; encode the bytes (e.g. base64 into a JSON string) first",
                bytes.len()
            ),
        )),
    }
}

fn error_from_writer(error: cloudevents::message::Error) -> BusError {
    match error {
        cloudevents::message::Error::Other { source } => match source.downcast::<BusError>() {
            Ok(bus) => *bus,
            Err(other) => sdk_error(
                "headers",
                &cloudevents::message::Error::Other { source: other },
            ),
        },
        other => sdk_error("headers", &other),
    }
}

/// The SDK's [`BinarySerializer`] writing our [`Headers`]: the SDK calls it
/// once per attribute and extension, formatting each value (`time` as
/// RFC 3339) as its bindings do. A header the bus refuses stops the walk,
/// its [`BusError`] boxed in the SDK's error (unboxed by `to_publish`).
struct HeaderWriter {
    spelling: Spelling,
    headers: Headers,
}

impl HeaderWriter {
    fn set(
        mut self,
        name: &str,
        value: &MessageAttributeValue,
    ) -> cloudevents::message::Result<Self> {
        match self
            .headers
            .insert(self.spelling.header(name), value.to_string())
        {
            Ok(_) => Ok(self),
            Err(error) => Err(cloudevents::message::Error::Other {
                source: Box::new(error),
            }),
        }
    }
}

impl BinarySerializer<Headers> for HeaderWriter {
    fn set_spec_version(
        self,
        spec_version: cloudevents::event::SpecVersion,
    ) -> cloudevents::message::Result<Self> {
        let value = MessageAttributeValue::String(spec_version.as_str().to_owned());
        self.set("specversion", &value)
    }

    fn set_attribute(
        self,
        name: &str,
        value: MessageAttributeValue,
    ) -> cloudevents::message::Result<Self> {
        self.set(name, &value)
    }

    fn set_extension(
        self,
        name: &str,
        value: MessageAttributeValue,
    ) -> cloudevents::message::Result<Self> {
        self.set(name, &value)
    }

    fn end_with_data(self, _bytes: Vec<u8>) -> cloudevents::message::Result<Headers> {
        // The data was taken before the walk; the value carries it.
        self.end()
    }

    fn end(self) -> cloudevents::message::Result<Headers> {
        Ok(self.headers)
    }
}
