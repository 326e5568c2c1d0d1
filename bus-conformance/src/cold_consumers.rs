//! The durable-consumer cases (C20–C23, C25) with a cold tier under every
//! bus (C24): each bus a case opens is a [`ColdBus`] keeping about
//! [`HOT_RECORDS`] records per partition hot, so
//! a consumer reads what it has not acknowledged from the tier, its cursors
//! in the wrapped bus's store. Used through
//! [`cold_consumer_suite!`](crate::cold_consumer_suite) (feature `cold`).

use std::sync::Arc;

use bus_cold::{ColdBus, ColdBusOptions, ColdTier};
use bus_core::BusError;

use crate::Unavailable;
use crate::cold::{HOT_RECORDS, open_tier};
use crate::consumers::{ConsumerBus, ConsumerHarness, ConsumerNamespace};

/// `harness` with a cold tier under each of its buses.
#[derive(Debug)]
pub struct ColdConsumers<H> {
    harness: H,
}

impl<H> ColdConsumers<H> {
    /// Wraps `harness`.
    pub fn new(harness: H) -> Self {
        Self { harness }
    }
}

impl<H: ConsumerHarness> ConsumerHarness for ColdConsumers<H> {
    fn backend(&self) -> &'static str {
        self.harness.backend()
    }

    fn namespace(&self) -> Result<Box<dyn ConsumerNamespace>, Unavailable> {
        let inner = self.harness.namespace()?;
        let (tier, dir) = open_tier()?;
        Ok(Box::new(ColdConsumerNamespace {
            inner,
            tier,
            _dir: dir,
        }))
    }
}

struct ColdConsumerNamespace {
    inner: Box<dyn ConsumerNamespace>,
    tier: Arc<ColdTier>,
    _dir: tempfile::TempDir,
}

impl ConsumerNamespace for ColdConsumerNamespace {
    fn open(&mut self) -> Result<Box<dyn ConsumerBus>, BusError> {
        let bus = self.inner.open()?;
        Ok(Box::new(ColdBus::new(
            bus,
            Arc::clone(&self.tier),
            ColdBusOptions::default().hot_records(HOT_RECORDS),
        )))
    }
}

/// Expands to one `#[test]` per durable-consumer case, run against
/// `$harness` (a [`ConsumerHarness`]) with a cold tier under it (see
/// [`ColdConsumers`]).
#[macro_export]
macro_rules! cold_consumer_suite {
    ($harness:expr) => {
        $crate::consumer_suite!($crate::cold_consumers::ColdConsumers::new($harness));
    };
}
