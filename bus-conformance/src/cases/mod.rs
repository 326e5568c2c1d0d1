//! The cases, one or more per contract rule; names start with the rule.

mod auth;
mod batch_headers;
mod concurrency;
mod dedup;
mod exclusive;
mod headers;
mod input;
mod offsets;
mod provision;
mod resume;
mod retention;
mod subscribe;

pub use auth::*;
pub use batch_headers::*;
pub use concurrency::*;
pub use dedup::*;
pub use exclusive::*;
pub use headers::*;
pub use input::*;
pub use offsets::*;
pub use provision::*;
pub use resume::*;
pub use retention::*;
pub use subscribe::*;

/// Every case's name, in suite order.
pub const ALL: &[&str] = &crate::__for_each_case!([crate::__case_name_list]);

/// Calls `$callback!($($prefix)*, case, case, ...)` with every case name;
/// the single list the suite is generated from.
#[doc(hidden)]
#[macro_export]
macro_rules! __for_each_case {
    ([$($callback:tt)*] $(, $prefix:expr)?) => {
        $($callback)*! { $($prefix,)?
            c01_provision_creates_topics,
            c01_provision_twice_is_noop,
            c01_provision_conflict_names_both_values,
            c01_conflicting_manifest_creates_nothing,
            c01_bad_manifests_name_the_field,
            c01_look_alike_names_are_distinct,
            c01_provisioned_topics_survive_reopen,
            c24_a_declared_cold_tier_is_kept_or_refused,
            c02_unknown_topic_is_refused_and_not_created,
            c02_invalid_topic_names_are_invalid_arguments,
            c02_unknown_partition_is_an_error,
            c03_keys_land_on_partition_for,
            c04_offsets_start_at_zero_and_grow_by_one,
            c04_ack_offset_is_the_stored_offset,
            c04_offsets_continue_after_reopen,
            c04_offsets_report_the_retained_range,
            c05_fetch_ranges_and_limits,
            c05_fetch_at_end_returns_promptly,
            c05_values_round_trip_exactly,
            c05_values_at_the_depth_limit_round_trip,
            c05_too_deep_values_are_refused,
            c05_paged_replay_is_complete,
            c05_batch_publish_acks_in_order,
            c06_retry_returns_original_ack,
            c06_metadata_uid_dedups_plain_publish,
            c06_uid_mismatch_is_invalid_argument,
            c06_dedup_survives_reopen,
            c06_concurrent_retries_store_one,
            c06_batch_publish_dedups,
            c06_empty_metadata_uid_is_no_uid,
            c07_find_by_uid,
            c07_find_after_reopen,
            c07_replayed_record_does_not_answer_for_its_uid,
            c08_concurrent_publishers_get_distinct_offsets,
            c08_concurrent_fetch_sees_gap_free_prefix,
            c08_acked_records_read_back_at_once,
            c09_works_inside_tokio_runtimes,
            c09_sixty_four_threads_at_once,
            c11_maintenance_expires_and_keeps_offsets,
            c11_offsets_not_reused_after_expiry_and_reopen,
            c11_native_retention_expires,
            c12_oversized_value_is_refused,
            c12_default_limit_is_one_mib,
            c12_bad_batch_stores_nothing,
            c12_odd_keys,
            c12_odd_uids,
            c13_errors_name_the_subject_and_hide_secrets,
            c14_signed_records_verify,
            c14_forged_records_fail_with_integrity,
            c14_correct_tag_from_outside_is_accepted,
            c14_another_key_rejects_after_reopen,
            c14_tag_binds_the_partition,
            c14_forged_uid_does_not_capture_dedup,
            c14_replayed_record_does_not_take_the_originals_place,
            c16_second_open_is_refused,
            c17_key_subscriber_sees_only_its_key,
            c17_topic_subscriber_sees_every_partition_in_order,
            c17_history_then_live_has_no_gap_or_duplicate,
            c17_start_positions,
            c17_subscribe_errors,
            c17_drop_disturbs_no_other,
            c17_idle_wait_returns_in_time_and_wakes_on_publish,
            c17_positions_are_where_delivery_continues,
            c17_topic_subscription_resumes_from_positions,
            c17_start_past_the_head_is_an_error_naming_it,
            c17_start_time_in_the_future_delivers_only_later_records,
            c18_max_lag_zero_is_an_invalid_argument,
            c18_key_subscription_counts_lag_in_its_own_records,
            c17_subscription_ends_when_its_bus_is_dropped,
            c18_bounded_lag_reports_the_dropped_prefix_then_keeps_working,
            c18_subscriber_that_keeps_up_never_lags,
            c18_many_subscribers_lag_independently,
            c18_retention_overtaking_a_slow_subscriber_is_reported,
            c18_native_retention_under_a_subscription_is_accounted_exactly,
            c19_forged_record_is_an_error_item_then_goes_on,
            c25_headers_round_trip_through_fetch_and_subscribe,
            c25_bad_headers_are_refused_and_nothing_stored,
            c25_records_without_headers_are_unchanged,
            c25_forged_headers_fail_with_integrity,
            c25_batch_headers_round_trip,
            c25_batch_with_a_bad_header_stores_nothing
        }
    };
}
