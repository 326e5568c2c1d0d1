//! C11 retention.

use std::time::Duration;

use bus_core::{TopicSpec, now_ms};
use serde_json::json;

use crate::util::{fetch_all, ok, poll_until, publish_n};
use crate::{CaseResult, Ctx};

const RETENTION_MS: u64 = 1_000;

/// C11: `maintenance(now)` expires records past retention, counts them, and
/// the offset sequence continues; records within retention stay.
pub fn c11_maintenance_expires_and_keeps_offsets(ctx: &mut Ctx) -> CaseResult {
    ctx.require(
        ctx.caps().maintenance_retention,
        "retention is not run by maintenance",
    )?;
    let (old, forever) = (ctx.topic("old"), ctx.topic("forever"));
    ctx.provision([
        TopicSpec::new(old.clone(), 1).with_retention_ms(RETENTION_MS),
        TopicSpec::new(forever.clone(), 1),
    ]);
    let uid_ack = ok(
        "publish",
        ctx.bus()
            .publish_idempotent(&old, "k", &json!("u"), "gone-uid"),
    );
    publish_n(ctx.bus(), &old, "k", 4);
    publish_n(ctx.bus(), &forever, "k", 2);
    let now = now_ms();
    assert_eq!(ok("maintenance now", ctx.bus().maintenance(now)), 0);
    assert_eq!(fetch_all(ctx.bus(), &old, 0, 0).len(), 5);
    let expired = ok("maintenance later", ctx.bus().maintenance(now + 60_000));
    assert_eq!(expired, 5);
    assert!(fetch_all(ctx.bus(), &old, 0, 0).is_empty());
    assert_eq!(
        fetch_all(ctx.bus(), &forever, 0, 0).len(),
        2,
        "no retention = kept"
    );
    assert_eq!(
        ok("find", ctx.bus().find_event_by_uid(&old, "k", "gone-uid")),
        None
    );
    let next = publish_n(ctx.bus(), &old, "k", 1);
    assert_eq!(next[0].offset, 5, "offsets continue after expiry");
    let retained = fetch_all(ctx.bus(), &old, 0, 0);
    assert_eq!(
        retained.iter().map(|e| e.offset).collect::<Vec<_>>(),
        vec![5]
    );
    assert_eq!(
        ok("maintenance again", ctx.bus().maintenance(now_ms())),
        0,
        "the new record is within retention"
    );
    assert_ne!(uid_ack.offset, 5);
    Ok(())
}

/// C11 + C4: after expiry and a reopen, offsets still continue (never reused).
pub fn c11_offsets_not_reused_after_expiry_and_reopen(ctx: &mut Ctx) -> CaseResult {
    ctx.require(
        ctx.caps().maintenance_retention,
        "retention is not run by maintenance",
    )?;
    let topic = ctx.topic("t");
    ctx.provision([TopicSpec::new(topic.clone(), 1).with_retention_ms(RETENTION_MS)]);
    publish_n(ctx.bus(), &topic, "k", 3);
    assert_eq!(
        ok("maintenance", ctx.bus().maintenance(now_ms() + 60_000)),
        3
    );
    ctx.reopen()?;
    let next = publish_n(ctx.bus(), &topic, "k", 1);
    assert_eq!(next[0].offset, 3);
    assert_eq!(fetch_all(ctx.bus(), &topic, 0, 0)[0].offset, 3);
    Ok(())
}

/// C11: a broker enforcing retention itself expires records, fetch from 0
/// starts at the first retained record and offsets continue.
pub fn c11_native_retention_expires(ctx: &mut Ctx) -> CaseResult {
    ctx.require(
        ctx.caps().native_retention,
        "the backend has no native retention",
    )?;
    let topic = ctx.topic("t");
    ctx.provision([TopicSpec::new(topic.clone(), 1).with_retention_ms(RETENTION_MS)]);
    publish_n(ctx.bus(), &topic, "k", 3);
    poll_until(
        "native retention to expire records",
        Duration::from_secs(60),
        || {
            let _ = ctx.bus().maintenance(now_ms());
            fetch_all(ctx.bus(), &topic, 0, 0).is_empty().then_some(())
        },
    );
    let next = publish_n(ctx.bus(), &topic, "k", 1);
    assert_eq!(next[0].offset, 3, "offsets continue after native expiry");
    assert_eq!(fetch_all(ctx.bus(), &topic, 0, 0)[0].offset, 3);
    Ok(())
}
