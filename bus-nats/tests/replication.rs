//! Issue 19 on one nats-server (`BUS_NATS_URL`): a replication factor above
//! 1 is `InvalidArgument` naming the field, and nothing of the manifest is
//! created (the three-node case is in cluster_faults.rs).

mod common;

use bus_core::{BusError, EventBus, Manifest, TopicSpec};

#[test]
fn replication_factor_above_one_server_is_refused() {
    let Some(bus) = common::shared_bus("replication", "rf") else {
        return;
    };
    if bus.capabilities().backend != "nats" {
        return;
    }
    let result = bus.provision(&Manifest::new([
        TopicSpec::new("good", 2),
        TopicSpec::new("big", 1).with_replication_factor(3),
    ]));
    let clustered = std::env::var("BUS_NATS_URL").is_ok_and(|url| url.contains(','));
    if clustered {
        // The suite's cluster run: three servers place three replicas.
        assert!(result.is_ok(), "{result:?}");
    } else {
        assert!(
            matches!(&result, Err(BusError::InvalidArgument { field, .. })
                if field == "topics[1].replication_factor"),
            "{result:?}"
        );
        assert!(bus.topics().is_empty(), "created {:?}", bus.topics());
    }
    common::cleanup(&bus);
}
