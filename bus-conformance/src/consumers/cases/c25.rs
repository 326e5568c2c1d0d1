//! C25 through durable consumers: a delivery carries its record's headers,
//! after a restart too, and a dead letter keeps them.

use bus_core::consumer::ConsumeOptions;
use bus_core::{Headers, StartAt};
use serde_json::json;

use super::{ConsumerCtx, open, take};
use crate::loud;

pub fn c25_deliveries_and_dead_letters_carry_headers(ctx: &mut ConsumerCtx) {
    if !ctx.bus().capabilities().headers {
        loud(&format!(
            "NOT APPLICABLE c25_deliveries_and_dead_letters_carry_headers: {} stores no headers",
            ctx.bus().capabilities().backend
        ));
        return;
    }
    let topic = ctx.simple_topic("headers", 1);
    let dlq = ctx.simple_topic("headers-dlq", 1);
    let headers = Headers::try_from_pairs([("traceparent", "00-aa-bb-01"), ("x", "1")]).unwrap();
    ctx.bus()
        .publish_with_headers(&topic, "k", &json!({"n": 0}), None, &headers)
        .unwrap();
    ctx.bus().publish(&topic, "k", &json!({"n": 1})).unwrap();
    let options = || ConsumeOptions::default().dead_letter(dlq.clone());
    let mut consumer = open(ctx.bus(), &topic, "h", StartAt::Beginning, options());
    let got = take(&mut consumer, 2);
    assert_eq!(got[0].headers, headers);
    assert!(got[1].headers.is_empty(), "{:?}", got[1]);
    // Not acked: delivered again after a restart, with its headers.
    drop(consumer);
    ctx.reopen();
    let mut again = open(ctx.bus(), &topic, "h", StartAt::Beginning, options());
    let redelivered = take(&mut again, 2);
    assert_eq!(redelivered[0].event.offset, 0);
    assert_eq!(redelivered[0].headers, headers);
    again.nack(&redelivered[0], "poison").unwrap();
    again.ack(&redelivered[1]).unwrap();
    let letters = ctx.bus().fetch_with_headers(&dlq, 0, 0, 10).unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].headers, headers, "the dead letter keeps them");
}
