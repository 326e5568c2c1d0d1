//! What an embedded bus, its flusher and its subscriptions' feeds share:
//! the open topics, the options and the record-signing key.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use bus_core::auth::RecordAuth;
use bus_core::backend::sync::{read, write};
use bus_core::{BusError, backend::validate_topic};

use crate::options::Options;
use crate::partition::Partition;
use crate::topics::{self, Topic};
use crate::watch::Watches;

/// What the bus, its flusher and its subscriptions' feeds share.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) root: PathBuf,
    pub(crate) topics_dir: PathBuf,
    pub(crate) options: Options,
    pub(crate) topics: RwLock<BTreeMap<String, Arc<Topic>>>,
    pub(crate) auth: RwLock<Option<RecordAuth>>,
    /// A read-only open's watcher of the writer's appends, shared by its
    /// subscriptions; `None` for the writer, which rings its own bells.
    pub(crate) watches: Option<Watches>,
    /// Held (flock) for the bus's lifetime; the OS drops it with the
    /// process. A read-only open takes none.
    pub(crate) _lock: Option<File>,
}

impl Inner {
    /// The topic `name`; a read-only open looks for topics provisioned
    /// since it last looked.
    pub(crate) fn topic(&self, name: &str) -> Result<Arc<Topic>, BusError> {
        validate_topic(name)?;
        if let Some(topic) = read(&self.topics).get(name) {
            return Ok(Arc::clone(topic));
        }
        if self.options.read_only {
            self.discover()?;
        }
        read(&self.topics)
            .get(name)
            .cloned()
            .ok_or_else(|| BusError::UnknownTopic(name.to_owned()))
    }

    /// A partition to read: in a read-only open, brought up to what the
    /// writer has acked first.
    pub(crate) fn readable(&self, topic: &str, partition: u32) -> Result<Arc<Partition>, BusError> {
        let topic = self.topic(topic)?;
        let partition = Arc::clone(topic.partition(partition)?);
        if self.options.read_only {
            partition.refresh()?;
        }
        Ok(partition)
    }

    /// Opens the topics provisioned since the last look (read-only opens;
    /// a directory without topics yet has none).
    pub(crate) fn discover(&self) -> Result<(), BusError> {
        let specs = match topics::list(&self.topics_dir) {
            Ok(specs) => specs,
            Err(BusError::Io(error)) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        for spec in specs {
            let known = read(&self.topics).get(&spec.name).cloned();
            if let Some(known) = known {
                // The writer may have changed the topic's compression (the
                // only property that can change): follow it, so the spec
                // this bus reports and provisions against is the stored one.
                if known.spec != spec {
                    let followed = Arc::new(known.with_spec(spec.clone()));
                    write(&self.topics).insert(spec.name, followed);
                }
                continue;
            }
            let name = spec.name.clone();
            let opened = Arc::new(topics::open(&self.topics_dir, spec, &self.options)?);
            write(&self.topics).entry(name).or_insert(opened);
        }
        Ok(())
    }

    /// Refuses `operation` on a read-only open.
    pub(crate) fn writable(&self, operation: &str) -> Result<(), BusError> {
        if self.options.read_only {
            return Err(BusError::ReadOnly {
                operation: operation.to_owned(),
                path: self.root.clone(),
            });
        }
        Ok(())
    }

    pub(crate) fn auth(&self) -> Option<RecordAuth> {
        read(&self.auth).clone()
    }

    pub(crate) fn flush_all(&self) {
        let topics: Vec<Arc<Topic>> = read(&self.topics).values().cloned().collect();
        for topic in topics {
            for partition in &topic.partitions {
                // A failure poisons the partition, which its next publish reports.
                let _ = partition.flush();
            }
        }
    }
}
