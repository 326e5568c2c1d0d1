//! What a bus handle and its subscriptions' feeds share: the connector
//! thread, the state its tasks use, and the reads both go through.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use bus_core::{
    BusError, PartitionOffsets, StoredRecord, backend::ConnectorExecutor, backend::check_partition,
    backend::validate_topic,
};

use crate::shared::{Shared, Topic};
use crate::{fetch, topics};

/// What a bus handle and its subscriptions' feeds share: the connector
/// thread and the state its tasks use.
pub(crate) struct Core {
    /// Started by the first synchronous call: a bus made by
    /// `PostgresBus::connect_async` and used only through the async
    /// surface runs on its caller's runtime and never starts it.
    pub(crate) executor: OnceLock<ConnectorExecutor>,
    pub(crate) shared: Arc<Shared>,
}

impl Drop for Core {
    fn drop(&mut self) {
        self.shared.listener.close_all();
    }
}

impl Core {
    /// Runs `operation` on the connector runtime, bounded by the timeout.
    pub(crate) fn run<T, Fut>(
        &self,
        what: &str,
        operation: impl FnOnce(Arc<Shared>) -> Fut + Send + 'static,
    ) -> Result<T, BusError>
    where
        Fut: Future<Output = Result<T, BusError>> + Send + 'static,
        T: Send + 'static,
    {
        let shared = Arc::clone(&self.shared);
        self.executor()?
            .run_bounded(what, self.shared.options.timeout, move || operation(shared))?
    }

    /// The connector runtime, started on first use.
    pub(crate) fn executor(&self) -> Result<&ConnectorExecutor, BusError> {
        if let Some(executor) = self.executor.get() {
            return Ok(executor);
        }
        let executor =
            ConnectorExecutor::with_timeout("bus-postgres", self.shared.options.timeout)?;
        // Another thread may have started one meanwhile: keep theirs.
        let _ = self.executor.set(executor);
        self.executor
            .get()
            .ok_or_else(|| BusError::backend("postgres", "connector runtime not started"))
    }

    /// Whether the connector runtime (a thread) has been started.
    pub(crate) fn connector_started(&self) -> bool {
        self.executor.get().is_some()
    }

    /// The topic from the cache, else from the database. Unknown topics
    /// create nothing (contract C2).
    pub(crate) fn topic(&self, name: &str) -> Result<Arc<Topic>, BusError> {
        validate_topic(name)?;
        if let Some(topic) = self.shared.cached(name) {
            return Ok(topic);
        }
        let owned = name.to_owned();
        self.run("topic lookup", move |shared| async move {
            topics::topic(&shared, &owned).await
        })
    }

    pub(crate) fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<StoredRecord>, BusError> {
        let topic = self.topic(topic)?;
        check_partition(&topic.spec.name, partition, topic.spec.partitions)?;
        if max == 0 {
            return Ok(Vec::new());
        }
        self.run("fetch", move |shared| async move {
            fetch::fetch(&shared, &topic, partition, offset, max).await
        })
    }

    pub(crate) fn offsets(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<PartitionOffsets, BusError> {
        let topic = self.topic(topic)?;
        check_partition(&topic.spec.name, partition, topic.spec.partitions)?;
        self.run("offsets", move |shared| async move {
            fetch::offsets(&shared, &topic, partition).await
        })
    }
}
