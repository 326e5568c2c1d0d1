//! The two publish methods every backend writes the same way: both go to
//! the backend's own `publish_one(topic, key, value, uid)`, in a span
//! naming the backend, after the UID is checked (and the same for the
//! async surface).

/// Expands, inside an `impl EventBus for X` block, to `publish` and
/// `publish_idempotent`, both calling the inherent method
/// `X::publish_one(&self, topic: &str, key: &str, value: &serde_json::Value,
/// uid: Option<&str>) -> Result<PublishAck, BusError>`. The argument is the
/// backend's name, as the spans' `backend` field.
#[macro_export]
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
            $crate::validate_uid(event_uid)?;
            self.publish_one(topic, key, value, Some(event_uid))
        }
    };
}

/// The async counterpart of [`publish_through_publish_one!`]: inside an
/// `impl AsyncEventBus for X` block, `publish` and `publish_idempotent`
/// over the inherent `async fn publish_one_async(&self, topic: &str, key:
/// &str, value: &serde_json::Value, uid: Option<&str>) -> Result<PublishAck,
/// BusError>`, the UID checked first.
#[cfg(feature = "async")]
#[macro_export]
macro_rules! async_publish_through_publish_one {
    () => {
        fn publish<'a>(
            &'a self,
            topic: &'a str,
            key: &'a str,
            value: &'a ::serde_json::Value,
        ) -> $crate::BoxFuture<'a, ::std::result::Result<$crate::PublishAck, $crate::BusError>> {
            ::std::boxed::Box::pin(self.publish_one_async(topic, key, value, None))
        }

        fn publish_idempotent<'a>(
            &'a self,
            topic: &'a str,
            key: &'a str,
            value: &'a ::serde_json::Value,
            event_uid: &'a str,
        ) -> $crate::BoxFuture<'a, ::std::result::Result<$crate::PublishAck, $crate::BusError>> {
            ::std::boxed::Box::pin(async move {
                $crate::validate_uid(event_uid)?;
                self.publish_one_async(topic, key, value, Some(event_uid))
                    .await
            })
        }
    };
}
