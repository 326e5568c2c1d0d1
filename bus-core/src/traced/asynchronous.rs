//! The async surface of [`Traced`] (feature `async`): each future runs in
//! the span the sync surface opens for the same operation.

use tracing::Instrument as _;

use super::Traced;
use crate::subscription::{Selector, StartAt, SubscribeOptions, SubscriptionStream};
use crate::{
    AsyncEventBus, BatchRecord, BatchRecordWithHeaders, BoxFuture, BusError, Headers, Manifest,
    PartitionOffsets, PublishAck, StoredEvent, StoredRecord, TopicSpec,
};

impl<B: AsyncEventBus> Traced<B> {
    /// [`Traced::send`] for the async surface: the inner call's future.
    #[cfg(not(feature = "otel"))]
    fn send_async<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
        uid: Option<&'a str>,
        headers: Option<&'a Headers>,
    ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
        match (headers, uid) {
            (Some(headers), _) => self
                .inner
                .publish_with_headers(topic, key, value, uid, headers),
            (None, Some(uid)) => self.inner.publish_idempotent(topic, key, value, uid),
            (None, None) => self.inner.publish(topic, key, value),
        }
    }

    /// [`Traced::send`] for the async surface. The span starts (and the
    /// current context is read) when the call is made, not when the
    /// future is first polled.
    #[cfg(feature = "otel")]
    fn send_async<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
        uid: Option<&'a str>,
        headers: Option<&'a Headers>,
    ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
        let sending = crate::otel::Sending::start(
            self.system,
            topic,
            headers.unwrap_or(&crate::otel::NO_HEADERS),
            self.keeps_headers,
        );
        Box::pin(async move {
            let sending = sending?;
            let acked = match (sending.headers().or(headers), uid) {
                (Some(headers), _) => {
                    self.inner
                        .publish_with_headers(topic, key, value, uid, headers)
                        .await
                }
                (None, Some(uid)) => self.inner.publish_idempotent(topic, key, value, uid).await,
                (None, None) => self.inner.publish(topic, key, value).await,
            };
            sending.finish(uid, value, &acked);
            acked
        })
    }
}

/// Each future runs in the span the sync surface opens for the same
/// operation (entered on every poll, closed when the future is done or
/// dropped).
impl<B: AsyncEventBus> AsyncEventBus for Traced<B> {
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
        let span = op_span!(self, publish, topic);
        Box::pin(
            self.send_async(topic, key, value, None, None)
                .instrument(span),
        )
    }

    fn publish_idempotent<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
        event_uid: &'a str,
    ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
        let span = op_span!(self, publish_idempotent, topic, event_uid);
        Box::pin(
            self.send_async(topic, key, value, Some(event_uid), None)
                .instrument(span),
        )
    }

    fn publish_batch<'a>(
        &'a self,
        topic: &'a str,
        records: &'a [BatchRecord],
    ) -> BoxFuture<'a, Result<Vec<PublishAck>, BusError>> {
        let span = op_span!(self, publish_batch, topic, records.len());
        #[cfg(feature = "otel")]
        {
            let mut sending = crate::otel::Sending::batch(self.system, topic, records.len());
            let carried = sending.batch_records(topic, records, self.keeps_headers);
            Box::pin(
                async move {
                    let acks = match carried {
                        Some(carried) => {
                            self.inner.publish_batch_with_headers(topic, &carried).await
                        }
                        None => self.inner.publish_batch(topic, records).await,
                    };
                    sending.finish_batch(&acks);
                    acks
                }
                .instrument(span),
            )
        }
        #[cfg(not(feature = "otel"))]
        Box::pin(self.inner.publish_batch(topic, records).instrument(span))
    }

    fn publish_batch_with_headers<'a>(
        &'a self,
        topic: &'a str,
        records: &'a [BatchRecordWithHeaders],
    ) -> BoxFuture<'a, Result<Vec<PublishAck>, BusError>> {
        let span = op_span!(self, publish_batch, topic, records.len());
        #[cfg(feature = "otel")]
        {
            let mut sending = crate::otel::Sending::batch(self.system, topic, records.len());
            let carried = match sending.batch_headers(topic, records, self.keeps_headers) {
                Ok(carried) => carried,
                Err(error) => return Box::pin(std::future::ready(Err(error))),
            };
            Box::pin(
                async move {
                    let acks = self
                        .inner
                        .publish_batch_with_headers(topic, carried.as_deref().unwrap_or(records))
                        .await;
                    sending.finish_batch(&acks);
                    acks
                }
                .instrument(span),
            )
        }
        #[cfg(not(feature = "otel"))]
        Box::pin(
            self.inner
                .publish_batch_with_headers(topic, records)
                .instrument(span),
        )
    }

    fn fetch<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredEvent>, BusError>> {
        let span = op_span!(self, fetch, topic, partition, offset, max);
        #[cfg(feature = "otel")]
        let receiving = crate::otel::Receiving::start(self.system, topic, partition);
        let fetch = self.inner.fetch(topic, partition, offset, max);
        #[cfg(feature = "otel")]
        let fetch = received(fetch, move |fetched| receiving.finish_events(fetched));
        Box::pin(fetch.instrument(span))
    }

    fn find_event_by_uid<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        event_uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<PublishAck>, BusError>> {
        let span = op_span!(self, find_event_by_uid, topic, event_uid);
        Box::pin(
            self.inner
                .find_event_by_uid(topic, key, event_uid)
                .instrument(span),
        )
    }

    fn publish_with_headers<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
        event_uid: Option<&'a str>,
        headers: &'a Headers,
    ) -> BoxFuture<'a, Result<PublishAck, BusError>> {
        let span = op_span!(self, publish, topic);
        Box::pin(
            self.send_async(topic, key, value, event_uid, Some(headers))
                .instrument(span),
        )
    }

    fn fetch_with_headers<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredRecord>, BusError>> {
        let span = op_span!(self, fetch, topic, partition, offset, max);
        #[cfg(feature = "otel")]
        let receiving = crate::otel::Receiving::start(self.system, topic, partition);
        let fetch = self.inner.fetch_with_headers(topic, partition, offset, max);
        #[cfg(feature = "otel")]
        let fetch = received(fetch, move |fetched| receiving.finish_records(fetched));
        Box::pin(fetch.instrument(span))
    }

    fn offsets<'a>(
        &'a self,
        topic: &'a str,
        partition: u32,
    ) -> BoxFuture<'a, Result<PartitionOffsets, BusError>> {
        let span = op_span!(self, offsets, topic, partition);
        Box::pin(self.inner.offsets(topic, partition).instrument(span))
    }

    fn partitions<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<u32, BusError>> {
        self.inner.partitions(topic)
    }

    fn provision<'a>(&'a self, manifest: &'a Manifest) -> BoxFuture<'a, Result<(), BusError>> {
        let span = op_span!(self, provision);
        Box::pin(self.inner.provision(manifest).instrument(span))
    }

    fn topics<'a>(&'a self) -> BoxFuture<'a, Result<Vec<String>, BusError>> {
        self.inner.topics()
    }

    fn topic_spec<'a>(
        &'a self,
        topic: &'a str,
    ) -> BoxFuture<'a, Result<Option<TopicSpec>, BusError>> {
        let span = op_span!(self, topic_spec, topic);
        Box::pin(self.inner.topic_spec(topic).instrument(span))
    }

    fn maintenance<'a>(&'a self, now_ms: u64) -> BoxFuture<'a, Result<u64, BusError>> {
        let span = op_span!(self, maintenance);
        Box::pin(self.inner.maintenance(now_ms).instrument(span))
    }

    fn subscribe<'a>(
        &'a self,
        topic: &'a str,
        selector: Selector,
        start: StartAt,
        options: SubscribeOptions,
    ) -> BoxFuture<'a, Result<SubscriptionStream, BusError>> {
        let span = op_span!(self, subscribe, topic);
        #[cfg(feature = "otel")]
        {
            let subscribe = self.inner.subscribe(topic, selector, start, options);
            let system = self.system;
            Box::pin(
                async move {
                    let mut stream = subscribe.await?;
                    stream.trace_deliveries(system);
                    Ok(stream)
                }
                .instrument(span),
            )
        }
        #[cfg(not(feature = "otel"))]
        Box::pin(
            self.inner
                .subscribe(topic, selector, start, options)
                .instrument(span),
        )
    }
}

/// `fetch` with its `receive` span ended by `finish` on the result
/// (feature `otel`): the one shape of `fetch` and `fetch_with_headers`.
#[cfg(feature = "otel")]
fn received<'a, T: Send + 'a>(
    fetch: BoxFuture<'a, Result<Vec<T>, BusError>>,
    finish: impl FnOnce(&Result<Vec<T>, BusError>) + Send + 'a,
) -> BoxFuture<'a, Result<Vec<T>, BusError>> {
    Box::pin(async move {
        let fetched = fetch.await;
        finish(&fetched);
        fetched
    })
}
