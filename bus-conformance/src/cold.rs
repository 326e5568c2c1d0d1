//! The suite's read cases with a cold tier under them (C24): every bus a
//! case opens is a [`ColdBus`] keeping about [`HOT_RECORDS`] records per
//! partition hot, so fetch, subscribe, offsets and find read from the
//! tier below that. The tier is the S3 server of the tests when
//! `BUS_S3_ENDPOINT` (and `BUS_S3_BUCKET`) are set, local files otherwise.
//! Used through [`cold_read_suite!`](crate::cold_read_suite) (feature `cold`).

use std::sync::Arc;

use bus_cold::{ColdBus, ColdBusOptions, ColdLocation, ColdTier};
use bus_core::{BusError, EventBus};

use crate::{Harness, Namespace, Unavailable, namespace_id};

/// Records kept hot per partition: a partition holds 2 to 4 hot records,
/// everything older is read from the tier.
pub const HOT_RECORDS: u64 = 2;

/// `harness` with a cold tier under each of its buses.
#[derive(Debug)]
pub struct Cold<H> {
    harness: H,
}

impl<H> Cold<H> {
    /// Wraps `harness`.
    pub fn new(harness: H) -> Self {
        Self { harness }
    }
}

/// Where the cold tier of one namespace lives: the S3 server of the tests
/// (a prefix of its own) or a temporary directory.
fn location(dir: &std::path::Path) -> String {
    match (
        std::env::var("BUS_S3_ENDPOINT"),
        std::env::var("BUS_S3_BUCKET"),
    ) {
        (Ok(endpoint), Ok(bucket)) if !endpoint.is_empty() && !bucket.is_empty() => format!(
            "s3://{bucket}/cold-suite-{}?endpoint={endpoint}",
            namespace_id(12)
        ),
        _ => format!("file://{}", dir.display()),
    }
}

impl<H: Harness> Harness for Cold<H> {
    fn backend(&self) -> &'static str {
        self.harness.backend()
    }

    fn namespace(&self) -> Result<Box<dyn Namespace>, Unavailable> {
        let inner = self.harness.namespace()?;
        let (tier, dir) = open_tier()?;
        Ok(Box::new(ColdNamespace {
            inner,
            tier,
            _dir: dir,
        }))
    }
}

/// A tier of one namespace's own (see [`location`]), checked to answer,
/// with the temporary directory it may live in.
pub(crate) fn open_tier() -> Result<(Arc<ColdTier>, tempfile::TempDir), Unavailable> {
    let dir = tempfile::tempdir().map_err(|e| Unavailable(format!("temp dir: {e}")))?;
    let location = location(dir.path());
    let tier = ColdLocation::parse(&location)
        .and_then(|parsed| ColdTier::open(&parsed))
        .and_then(|tier| tier.check().map(|()| tier))
        .map_err(|e| Unavailable(format!("cold tier {location}: {e}")))?;
    Ok((Arc::new(tier), dir))
}

struct ColdNamespace {
    inner: Box<dyn Namespace>,
    tier: Arc<ColdTier>,
    _dir: tempfile::TempDir,
}

impl Namespace for ColdNamespace {
    fn open(&mut self) -> Result<Box<dyn EventBus>, BusError> {
        let bus = self.inner.open()?;
        Ok(Box::new(ColdBus::new(
            bus,
            Arc::clone(&self.tier),
            ColdBusOptions::default().hot_records(HOT_RECORDS),
        )))
    }

    fn can_reopen(&self) -> bool {
        self.inner.can_reopen()
    }
}

/// Expands to one `#[test]` per read case of the suite, run against
/// `$harness` with a cold tier under it (see [`Cold`]).
#[macro_export]
macro_rules! cold_read_suite {
    ($harness:expr) => {
        $crate::__for_each_cold_read_case!([$crate::__cold_case_test], $harness);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __cold_case_test {
    ($harness:expr, $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                $crate::run(
                    &$crate::cold::Cold::new($harness),
                    stringify!($name),
                    $crate::cases::$name,
                );
            }
        )*
    };
}

/// The read cases: those that publish and then read back through fetch,
/// subscribe, offsets or find (a subset of [`crate::cases::ALL`]).
pub const READ_CASES: &[&str] = &crate::__for_each_cold_read_case!([crate::__case_name_list]);

#[doc(hidden)]
#[macro_export]
macro_rules! __for_each_cold_read_case {
    ([$($callback:tt)*] $(, $prefix:expr)?) => {
        $($callback)*! { $($prefix,)?
            c04_offsets_start_at_zero_and_grow_by_one,
            c04_ack_offset_is_the_stored_offset,
            c04_offsets_continue_after_reopen,
            c05_fetch_ranges_and_limits,
            c05_fetch_at_end_returns_promptly,
            c05_values_round_trip_exactly,
            c05_paged_replay_is_complete,
            c05_batch_publish_acks_in_order,
            c06_retry_returns_original_ack,
            c06_metadata_uid_dedups_plain_publish,
            c07_find_by_uid,
            c08_concurrent_fetch_sees_gap_free_prefix,
            c08_acked_records_read_back_at_once,
            c14_signed_records_verify,
            c17_key_subscriber_sees_only_its_key,
            c17_topic_subscriber_sees_every_partition_in_order,
            c17_history_then_live_has_no_gap_or_duplicate,
            c17_start_positions,
            c17_positions_are_where_delivery_continues,
            c17_topic_subscription_resumes_from_positions,
            c25_headers_round_trip_through_fetch_and_subscribe,
            c25_records_without_headers_are_unchanged
        }
    };
}
