//! A stored record → an SDK [`Event`], parsed by the SDK's binary-mode
//! machinery.

use cloudevents::event::SpecVersion;
use cloudevents::message::{BinaryDeserializer, BinarySerializer, MessageAttributeValue};
use cloudevents::{AttributesReader, AttributesWriter, Data, Event};

use super::{Spelling, is_json, sdk_error};
use crate::{BusError, StoredRecord};

/// A record seen as a CloudEvents message in binary content mode: the
/// SDK's [`BinaryDeserializer`], so any SDK [`BinarySerializer`] (an
/// [`Event`] builder, another binding's message writer) can read it. The
/// data it hands on is the bytes a binding would carry: the value's JSON
/// text, or the text itself for a string under a non-JSON content type.
///
/// [`RecordMessage::new`] checks what the SDK would otherwise only find
/// late or not at all: one spelling, a known `specversion`, a non-empty
/// `id`, `source` and `type`.
#[derive(Debug, Clone, Copy)]
pub struct RecordMessage<'a> {
    record: &'a StoredRecord,
    spelling: Spelling,
    spec_version: &'a str,
}

impl<'a> RecordMessage<'a> {
    /// `record` as a CloudEvents message, its spelling detected from its
    /// `ce_specversion` or `ce-specversion` header.
    ///
    /// # Errors
    /// `InvalidArgument` on the header at fault: no `specversion` in
    /// either spelling (field `ce_specversion`), both spellings, a
    /// `specversion` the SDK does not know, an empty or missing `id`,
    /// `source` or `type`.
    pub fn new(record: &'a StoredRecord) -> Result<Self, BusError> {
        let mut found = Spelling::ALL.into_iter().filter_map(|spelling| {
            attribute(record, spelling, "specversion").map(|version| (spelling, version))
        });
        let Some((spelling, spec_version)) = found.next() else {
            return Err(BusError::invalid(
                Spelling::Underscore.header("specversion"),
                "no ce_specversion or ce-specversion header: the record is not a CloudEvent \
                 in binary content mode",
            ));
        };
        if let Some((other, _)) = found.next() {
            return Err(BusError::invalid(
                other.header("specversion"),
                format!(
                    "the record carries both {:?} and {:?}; one spelling per record",
                    spelling.header("specversion"),
                    other.header("specversion")
                ),
            ));
        }
        if let Err(error) = SpecVersion::try_from(spec_version) {
            return Err(BusError::invalid(
                spelling.header("specversion"),
                format!("{error}; the CloudEvents SDK knows 1.0 and 0.3"),
            ));
        }
        for name in ["id", "source", "type"] {
            match attribute(record, spelling, name) {
                Some(value) if !value.is_empty() => {}
                found => {
                    return Err(BusError::invalid(
                        spelling.header(name),
                        format!(
                            "a CloudEvent's required attribute {name} is {}",
                            if found.is_some() { "empty" } else { "missing" }
                        ),
                    ));
                }
            }
        }
        Ok(Self {
            record,
            spelling,
            spec_version,
        })
    }

    /// The spelling the record's attribute headers use.
    pub fn spelling(&self) -> Spelling {
        self.spelling
    }

    fn content_type(&self) -> Option<&'a str> {
        attribute(self.record, self.spelling, "datacontenttype")
    }
}

impl BinaryDeserializer for RecordMessage<'_> {
    fn deserialize_binary<R: Sized, V: BinarySerializer<R>>(
        self,
        mut visitor: V,
    ) -> cloudevents::message::Result<R> {
        let spec_version = SpecVersion::try_from(self.spec_version)?;
        let known = spec_version.attribute_names();
        visitor = visitor.set_spec_version(spec_version)?;
        for (header, value) in self.record.headers.iter() {
            let Some(name) = self.spelling.attribute(header) else {
                continue;
            };
            let value = MessageAttributeValue::String(value.to_owned());
            visitor = match name.as_str() {
                "specversion" => visitor,
                name if known.contains(&name) => visitor.set_attribute(name, value)?,
                name => visitor.set_extension(name, value)?,
            };
        }
        match &self.record.event.value {
            serde_json::Value::Null => visitor.end(),
            serde_json::Value::String(text) if !is_json(self.content_type()) => {
                visitor.end_with_data(text.clone().into_bytes())
            }
            value => visitor.end_with_data(serde_json::to_vec(value)?),
        }
    }
}

/// The CloudEvent `record` carries (see the [module docs](super) for the
/// mapping): the SDK parses its attribute headers, and the data is the
/// record's value as [`Data::Json`] (or [`Data::String`] for a string
/// under a non-JSON content type), `datacontenttype` defaulting to
/// `application/json`.
///
/// # Errors
/// As [`RecordMessage::new`]; then `InvalidArgument` on the header the SDK
/// refused (a `time` that is not RFC 3339, a `dataschema` that is not a
/// URI, an attribute unknown to the `specversion`, an empty extension
/// name), or on `content-type` for a value that is not a string under a
/// non-JSON content type.
pub fn to_event(record: &StoredRecord) -> Result<Event, BusError> {
    let message = RecordMessage::new(record)?;
    let spelling = message.spelling;
    if let Some((header, _)) = record.headers.iter().find(|(header, _)| {
        spelling
            .attribute(header)
            .is_some_and(|name| name.is_empty())
    }) {
        return Err(BusError::invalid(
            header,
            "a header that is only the prefix names no attribute",
        ));
    }
    let content_type = message.content_type();
    let data = match &record.event.value {
        serde_json::Value::Null => None,
        serde_json::Value::String(text) if !is_json(content_type) => {
            Some(Data::String(text.clone()))
        }
        value if is_json(content_type) => Some(Data::Json(value.clone())),
        _ => {
            return Err(BusError::invalid(
                spelling.header("datacontenttype"),
                format!(
                    "the record's value is JSON but not a string, and its content type \
                     {content_type:?} is not JSON"
                ),
            ));
        }
    };
    let mut event = BinaryDeserializer::into_event(message).map_err(|error| {
        let field = match &error {
            cloudevents::message::Error::ParseTimeError { .. } => spelling.header("time"),
            cloudevents::message::Error::ParseUrlError { .. } => spelling.header("dataschema"),
            cloudevents::message::Error::UnknownAttribute { name } => spelling.header(name),
            _ => "headers".to_owned(),
        };
        sdk_error(field, &error)
    })?;
    // The SDK keeps the bytes it was handed; the value is the JSON itself.
    if let Some(data) = data {
        event.set_data_unchecked(data);
        if event.datacontenttype().is_none() {
            event.set_datacontenttype(Some("application/json"));
        }
    }
    Ok(event)
}

/// The value of attribute `name`'s header in `spelling`.
fn attribute<'a>(record: &'a StoredRecord, spelling: Spelling, name: &str) -> Option<&'a str> {
    record
        .headers
        .iter()
        .find(|(header, _)| spelling.attribute(header).as_deref() == Some(name))
        .map(|(_, value)| value)
}
