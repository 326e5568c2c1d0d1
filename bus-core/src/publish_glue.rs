//! The trait methods backends would otherwise write alike: the two publish
//! methods, which go to the backend's own `publish_one(topic, key, value,
//! uid)` in a span naming the backend after the UID is checked (and their
//! async counterparts), and the async reads of backends that can only read
//! through blocking calls.

/// Expands, inside an `impl EventBus for X` block, to `publish` and
/// `publish_idempotent`, both calling the inherent method
/// `X::publish_one(&self, topic: &str, key: &str, value: &serde_json::Value,
/// uid: Option<&str>) -> Result<PublishAck, BusError>`. The argument is the
/// backend's name, as the spans' `backend` field.
#[macro_export]
#[doc(hidden)]
macro_rules! publish_through_publish_one {
    ($backend:tt) => {
        #[::tracing::instrument(name = "bus.publish", skip_all, fields(backend = $backend, topic = %topic))]
        fn publish(
            &self,
            topic: &str,
            key: &str,
            value: &::serde_json::Value,
        ) -> ::std::result::Result<$crate::PublishAck, $crate::BusError> {
            self.publish_one(topic, key, value, None)
        }

        #[::tracing::instrument(name = "bus.publish_idempotent", skip_all, fields(backend = $backend, topic = %topic, uid = %event_uid))]
        fn publish_idempotent(
            &self,
            topic: &str,
            key: &str,
            value: &::serde_json::Value,
            event_uid: &str,
        ) -> ::std::result::Result<$crate::PublishAck, $crate::BusError> {
            $crate::backend::validate_uid(event_uid)?;
            self.publish_one(topic, key, value, Some(event_uid))
        }
    };
}

/// The async counterpart of [`publish_through_publish_one!`]: inside an
/// `impl AsyncEventBus for X` block, `publish` and `publish_idempotent`
/// over the inherent `async fn publish_one_async(&self, topic: &str, key:
/// &str, value: &serde_json::Value, uid: Option<&str>) -> Result<PublishAck,
/// BusError>`, the UID checked first, each future in the span the sync
/// surface opens (the argument is the backend's name).
#[cfg(feature = "async")]
#[macro_export]
#[doc(hidden)]
macro_rules! async_publish_through_publish_one {
    ($backend:tt) => {
        fn publish<'a>(
            &'a self,
            topic: &'a str,
            key: &'a str,
            value: &'a ::serde_json::Value,
        ) -> $crate::BoxFuture<'a, ::std::result::Result<$crate::PublishAck, $crate::BusError>> {
            let span = ::tracing::info_span!("bus.publish", backend = $backend, topic = %topic);
            ::std::boxed::Box::pin(::tracing::Instrument::instrument(
                self.publish_one_async(topic, key, value, None),
                span,
            ))
        }

        fn publish_idempotent<'a>(
            &'a self,
            topic: &'a str,
            key: &'a str,
            value: &'a ::serde_json::Value,
            event_uid: &'a str,
        ) -> $crate::BoxFuture<'a, ::std::result::Result<$crate::PublishAck, $crate::BusError>> {
            let span = ::tracing::info_span!(
                "bus.publish_idempotent",
                backend = $backend,
                topic = %topic,
                uid = %event_uid
            );
            ::std::boxed::Box::pin(::tracing::Instrument::instrument(
                async move {
                    $crate::backend::validate_uid(event_uid)?;
                    self.publish_one_async(topic, key, value, Some(event_uid))
                        .await
                },
                span,
            ))
        }
    };
}

/// The span an async-surface operation's future runs in: the one the
/// sync surface's `#[tracing::instrument]` opens for the same operation,
/// e.g. `bus_core::backend::async_span!("bus.fetch", "nats", topic, partition =
/// partition)`.
#[cfg(feature = "async")]
#[macro_export]
#[doc(hidden)]
macro_rules! async_span {
    ($name:literal, $backend:literal) => {
        ::tracing::info_span!($name, backend = $backend)
    };
    ($name:literal, $backend:literal, $topic:expr $(, $field:ident = $value:expr)*) => {
        ::tracing::info_span!($name, backend = $backend, topic = %$topic $(, $field = $value)*)
    };
}

/// Inside an `impl AsyncEventBus for X` block whose backend answers reads
/// only through blocking calls (the embedded log's files, librdkafka's
/// consumer): `fetch`, `find_event_by_uid` and `offsets` as the
/// [`EventBus`](crate::EventBus) calls on an owned handle of the bus, run
/// by the inherent `async fn $blocking<T, F>(&self, what: &'static str,
/// work: F) -> Result<T, BusError>` where `F: FnOnce(X) -> Result<T,
/// BusError> + Send + 'static` (the caller's runtime's blocking pool, never
/// a worker thread).
#[cfg(feature = "async")]
#[macro_export]
#[doc(hidden)]
macro_rules! async_reads_through_blocking {
    ($blocking:ident) => {
        fn fetch<'a>(
            &'a self,
            topic: &'a str,
            partition: u32,
            offset: u64,
            max: usize,
        ) -> $crate::BoxFuture<'a, ::std::result::Result<::std::vec::Vec<$crate::StoredEvent>, $crate::BusError>> {
            let topic = topic.to_owned();
            ::std::boxed::Box::pin(self.$blocking("fetch", move |bus| {
                $crate::EventBus::fetch(&bus, &topic, partition, offset, max)
            }))
        }

        fn find_event_by_uid<'a>(
            &'a self,
            topic: &'a str,
            key: &'a str,
            event_uid: &'a str,
        ) -> $crate::BoxFuture<'a, ::std::result::Result<::std::option::Option<$crate::PublishAck>, $crate::BusError>> {
            let (topic, key, uid) = (topic.to_owned(), key.to_owned(), event_uid.to_owned());
            ::std::boxed::Box::pin(self.$blocking("find_event_by_uid", move |bus| {
                $crate::EventBus::find_event_by_uid(&bus, &topic, &key, &uid)
            }))
        }

        fn offsets<'a>(
            &'a self,
            topic: &'a str,
            partition: u32,
        ) -> $crate::BoxFuture<'a, ::std::result::Result<$crate::PartitionOffsets, $crate::BusError>> {
            let topic = topic.to_owned();
            ::std::boxed::Box::pin(self.$blocking("offsets", move |bus| {
                $crate::EventBus::offsets(&bus, &topic, partition)
            }))
        }
    };
}

/// Inside an `impl AsyncEventBus for X` block: `topics`, `topic_spec` and
/// `maintenance` as the [`EventBus`](crate::EventBus) calls on an owned
/// handle of the bus, run by the inherent `async fn $blocking` of
/// [`async_reads_through_blocking!`] (the caller's runtime's blocking pool:
/// rare administrative calls that the sync surface already answers).
#[cfg(feature = "async")]
#[macro_export]
#[doc(hidden)]
macro_rules! async_admin_through_blocking {
    ($blocking:ident) => {
        fn topics<'a>(
            &'a self,
        ) -> $crate::BoxFuture<
            'a,
            ::std::result::Result<::std::vec::Vec<::std::string::String>, $crate::BusError>,
        > {
            ::std::boxed::Box::pin(self.$blocking("topics", move |bus| {
                ::std::result::Result::Ok($crate::EventBus::topics(&bus))
            }))
        }

        fn topic_spec<'a>(
            &'a self,
            topic: &'a str,
        ) -> $crate::BoxFuture<
            'a,
            ::std::result::Result<::std::option::Option<$crate::TopicSpec>, $crate::BusError>,
        > {
            let topic = topic.to_owned();
            ::std::boxed::Box::pin(self.$blocking("topic_spec", move |bus| {
                $crate::EventBus::topic_spec(&bus, &topic)
            }))
        }

        fn maintenance<'a>(
            &'a self,
            now_ms: u64,
        ) -> $crate::BoxFuture<'a, ::std::result::Result<u64, $crate::BusError>> {
            ::std::boxed::Box::pin(self.$blocking("maintenance", move |bus| {
                $crate::EventBus::maintenance(&bus, now_ms)
            }))
        }
    };
}
