//! State shared by the bus handle and the tasks on its connector runtime.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use bus_core::auth::RecordAuth;
use bus_core::{BusError, TopicSpec, backend::fnv1a64};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::listener::Listener;
use crate::options::PostgresOptions;
use crate::queue::Queue;
use crate::sql::Sql;

/// A provisioned topic as the database describes it.
#[derive(Debug)]
pub(crate) struct Topic {
    pub(crate) id: i32,
    pub(crate) spec: TopicSpec,
    /// The `LISTEN`/`NOTIFY` channel of the topic.
    pub(crate) channel: String,
}

impl Topic {
    pub(crate) fn new(schema: &str, id: i32, spec: TopicSpec) -> Self {
        // Channel names are identifiers of at most 63 bytes and topic names
        // reach 200: a hash names the channel. A collision only wakes a
        // subscription that then reads nothing new.
        let channel = format!(
            "bus_{:016x}",
            fnv1a64(format!("{schema}\0{}", spec.name).as_bytes())
        );
        Self { id, spec, channel }
    }
}

pub(crate) struct Shared {
    pub(crate) options: PostgresOptions,
    pub(crate) pool: Pool,
    /// The TLS connector, when the URL asked for TLS (the listener uses it too).
    pub(crate) tls: Option<MakeRustlsConnect>,
    pub(crate) sql: Sql,
    topics: RwLock<HashMap<String, Arc<Topic>>>,
    auth: RwLock<Option<RecordAuth>>,
    queues: Mutex<HashMap<(i32, u32), Arc<Queue>>>,
    pub(crate) listener: Listener,
}

impl Shared {
    pub(crate) fn new(options: PostgresOptions) -> Result<Self, BusError> {
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let tls = options
            .tls
            .as_ref()
            .map(crate::tls::connector)
            .transpose()?;
        let manager = match &tls {
            Some(tls) => Manager::from_config(options.config.clone(), tls.clone(), manager_config),
            None => Manager::from_config(options.config.clone(), NoTls, manager_config),
        };
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.timeout))
            .create_timeout(Some(options.timeout))
            .recycle_timeout(Some(options.timeout))
            .build()
            .map_err(|error| {
                BusError::backend_caused("postgres", format!("connection pool: {error}"), error)
            })?;
        Ok(Self {
            tls,
            sql: Sql::new(&options.schema),
            options,
            pool,
            topics: RwLock::default(),
            auth: RwLock::default(),
            queues: Mutex::default(),
            listener: Listener::default(),
        })
    }

    pub(crate) fn cached(&self, name: &str) -> Option<Arc<Topic>> {
        self.topics
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    pub(crate) fn remember(&self, id: i32, spec: TopicSpec) -> Arc<Topic> {
        let topic = Arc::new(Topic::new(&self.options.schema, id, spec));
        self.topics
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(topic.spec.name.clone(), Arc::clone(&topic));
        topic
    }

    pub(crate) fn cached_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .topics
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    pub(crate) fn auth(&self) -> Option<RecordAuth> {
        self.auth
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set_auth(&self, auth: RecordAuth) {
        *self.auth.write().unwrap_or_else(PoisonError::into_inner) = Some(auth);
    }

    /// The group-commit queue of one partition.
    pub(crate) fn queue(&self, topic_id: i32, partition: u32) -> Arc<Queue> {
        Arc::clone(
            self.queues
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry((topic_id, partition))
                .or_default(),
        )
    }
}
