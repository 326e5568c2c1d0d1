//! The records of a batch publish: [`BatchRecord`] (the key, value and UID
//! a batch has always taken), [`BatchRecordWithHeaders`] (the same with
//! headers, C25), and [`BatchItem`], the borrowed view of either that a
//! backend's one batch path takes, so `publish_batch` and
//! `publish_batch_with_headers` share every check and write.

use serde_json::Value;

use crate::{BusError, Headers};

/// One record of a batch publish.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRecord {
    /// Partition key.
    pub key: String,
    /// The event payload.
    pub value: serde_json::Value,
    /// Stable event UID for deduplication, if any.
    pub uid: Option<String>,
}

impl BatchRecord {
    /// A record without an explicit UID.
    pub fn new(key: impl Into<String>, value: serde_json::Value) -> Self {
        Self {
            key: key.into(),
            value,
            uid: None,
        }
    }

    /// Sets the UID.
    #[must_use]
    pub fn with_uid(mut self, uid: impl Into<String>) -> Self {
        self.uid = Some(uid.into());
        self
    }

    /// This record with `headers`, for
    /// [`EventBus::publish_batch_with_headers`](crate::EventBus::publish_batch_with_headers).
    #[must_use]
    pub fn with_headers(self, headers: Headers) -> BatchRecordWithHeaders {
        BatchRecordWithHeaders {
            record: self,
            headers,
        }
    }
}

/// One record of a batch publish with headers (C25): what
/// [`EventBus::publish_batch_with_headers`](crate::EventBus::publish_batch_with_headers)
/// takes. A record beside its headers, as [`StoredRecord`](crate::StoredRecord)
/// is an event beside its headers, so [`BatchRecord`] keeps its fields.
///
/// ```
/// use bus_core::{BatchRecord, Headers};
///
/// let headers = Headers::try_from_pairs([("ce_type", "order.created")]).unwrap();
/// let record = BatchRecord::new("order-7", serde_json::json!({"total": 12})).with_headers(headers);
/// assert_eq!(record.headers.get("ce_type"), Some("order.created"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRecordWithHeaders {
    /// Key, value and UID.
    pub record: BatchRecord,
    /// The record's headers, checked at publish against the limits of
    /// [`Headers`] (a bad one refuses the whole batch).
    pub headers: Headers,
}

impl From<BatchRecord> for BatchRecordWithHeaders {
    fn from(record: BatchRecord) -> Self {
        record.with_headers(Headers::new())
    }
}

static NO_HEADERS: Headers = Headers::new();

/// A borrowed record of a batch, with or without headers: what a backend's
/// batch path takes, so a batch with headers and one without go through the
/// same checks and the same write (backend kit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchItem<'a> {
    /// Partition key.
    pub key: &'a str,
    /// The event payload.
    pub value: &'a Value,
    /// Stable event UID for deduplication, if any.
    pub uid: Option<&'a str>,
    /// The record's headers (empty for a [`BatchRecord`]).
    pub headers: &'a Headers,
}

impl<'a> From<&'a BatchRecord> for BatchItem<'a> {
    fn from(record: &'a BatchRecord) -> Self {
        Self {
            key: &record.key,
            value: &record.value,
            uid: record.uid.as_deref(),
            headers: &NO_HEADERS,
        }
    }
}

impl<'a> From<&'a BatchRecordWithHeaders> for BatchItem<'a> {
    fn from(record: &'a BatchRecordWithHeaders) -> Self {
        Self {
            headers: &record.headers,
            ..Self::from(&record.record)
        }
    }
}

impl BatchItem<'_> {
    /// The views of `records`, in order.
    pub fn all<'a, R>(records: &'a [R]) -> Vec<BatchItem<'a>>
    where
        &'a R: Into<BatchItem<'a>>,
    {
        records.iter().map(Into::into).collect()
    }

    /// An owned record with its headers (for work moved to another thread).
    pub fn to_owned_record(&self) -> BatchRecordWithHeaders {
        BatchRecordWithHeaders {
            record: BatchRecord {
                key: self.key.to_owned(),
                value: self.value.clone(),
                uid: self.uid.map(str::to_owned),
            },
            headers: self.headers.clone(),
        }
    }
}

/// What the provided `publish_batch_with_headers` of a backend that does not
/// store headers does before it publishes: every record's headers checked
/// (a bad one is the caller's error, whatever the backend), then
/// [`BusError::Unsupported`] if any record has headers, so none is dropped
/// silently; otherwise the records without them.
pub(crate) fn without_headers(
    records: &[BatchRecordWithHeaders],
    backend: &str,
) -> Result<Vec<BatchRecord>, BusError> {
    for record in records {
        record.headers.validate()?;
    }
    if records.iter().any(|record| !record.headers.is_empty()) {
        return Err(BusError::Unsupported {
            operation: "publish_batch_with_headers".to_owned(),
            backend: backend.to_owned(),
        });
    }
    Ok(records.iter().map(|record| record.record.clone()).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    #[test]
    fn views_carry_the_headers_or_none() {
        let plain = BatchRecord::new("k", json!(1)).with_uid("u");
        let headers = Headers::try_from_pairs([("a", "1")]).unwrap();
        let with = plain.clone().with_headers(headers.clone());
        let items = BatchItem::all(std::slice::from_ref(&plain));
        assert_eq!(items[0].key, "k");
        assert_eq!(items[0].uid, Some("u"));
        assert!(items[0].headers.is_empty());
        let items = BatchItem::all(std::slice::from_ref(&with));
        assert_eq!(items[0].headers, &headers);
        assert_eq!(items[0].to_owned_record(), with);
        assert_eq!(BatchRecordWithHeaders::from(plain.clone()).record, plain);
    }

    #[test]
    fn a_backend_without_headers_refuses_them_and_checks_them_first() {
        let good = BatchRecord::new("k", json!(1))
            .with_headers(Headers::try_from_pairs([("a", "1")]).unwrap());
        let bad =
            BatchRecord::new("k", json!(1)).with_headers(Headers::from_stored([("bus-uid", "x")]));
        assert!(matches!(
            without_headers(std::slice::from_ref(&good), "x"),
            Err(BusError::Unsupported { .. })
        ));
        assert!(matches!(
            without_headers(&[good, bad], "x"),
            Err(BusError::InvalidArgument { .. })
        ));
        let plain = BatchRecord::new("k", json!(1));
        assert_eq!(
            without_headers(&[plain.clone().into()], "x").unwrap(),
            vec![plain]
        );
    }
}
