//! C16 one process per embedded directory.

use bus_core::BusError;
use serde_json::json;

use crate::util::{fetch_all, ok};
use crate::{CaseResult, Ctx, assert_err};

/// C16: a second open of the same storage while the first is alive is
/// refused; after the first closes, it opens.
pub fn c16_second_open_is_refused(ctx: &mut Ctx) -> CaseResult {
    ctx.require(ctx.caps().exclusive_open, "the backend allows shared opens")?;
    let topic = ctx.simple_topic("t", 1);
    ok("publish", ctx.bus().publish(&topic, "k", &json!(1)));
    assert_err!(ctx.open_second(), BusError::Locked { .. });
    ctx.reopen()?;
    assert_eq!(fetch_all(ctx.bus(), &topic, 0, 0).len(), 1);
    assert_err!(ctx.open_second(), BusError::Locked { .. });
    Ok(())
}
