//! Keeps the pass-through's reserved list complete: every setting any
//! client of the bus sets is one a caller may not pass through, so that no
//! caller's setting is silently overridden (or overrides the bus's).

use crate::options::reserved;
use crate::{KafkaOptions, SaslMechanism, client, waker};

#[test]
fn every_setting_the_bus_makes_is_reserved() {
    // Options that turn every optional setting on.
    let options = KafkaOptions::new(["h:9093"])
        .ca_location("/ca.pem")
        .client_cert("/c.pem", "/k.pem")
        .sasl(SaslMechanism::ScramSha512, "u", "p");
    let configs = [
        (
            "plain producer",
            client::producer_config(&options, client::Delivery::Plain),
        ),
        (
            "UID producer",
            client::producer_config(&options, client::Delivery::Uid),
        ),
        ("reader", client::reader_config(&options)),
        ("admin", client::admin_config(&options)),
        ("subscription", waker::consumer_config(&options)),
    ];
    for (client, config) in &configs {
        for name in config.config_map().keys() {
            assert!(
                reserved(name).is_some(),
                "the {client} sets {name:?}, which a pass-through could override: add it to BUS_SETTINGS"
            );
        }
    }
}
