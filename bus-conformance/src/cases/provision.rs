//! C1 provisioning and C2 no publishing into the void.

use bus_core::{BatchRecord, BusError, ColdSpec, Manifest, TopicSpec};
use serde_json::json;

use crate::util::{fetch_all, ok, publish_n};
use crate::{CaseResult, Ctx, assert_err};

/// C1: provisioning creates every listed topic with its partition count.
pub fn c01_provision_creates_topics(ctx: &mut Ctx) -> CaseResult {
    let (a, b) = (ctx.topic("a"), ctx.topic("b"));
    ctx.provision([TopicSpec::new(a.clone(), 1), TopicSpec::new(b.clone(), 5)]);
    let topics = ctx.bus().topics();
    assert!(topics.contains(&a) && topics.contains(&b), "{topics:?}");
    assert_eq!(ok("partitions", ctx.bus().partitions(&a)), 1);
    assert_eq!(ok("partitions", ctx.bus().partitions(&b)), 5);
    Ok(())
}

/// C1: provisioning twice is a no-op: records stay, offsets continue.
pub fn c01_provision_twice_is_noop(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 2);
    let first = publish_n(ctx.bus(), &topic, "k", 3);
    ctx.provision([TopicSpec::new(topic.clone(), 2)]);
    ctx.provision([TopicSpec::new(topic.clone(), 2)]);
    let next = publish_n(ctx.bus(), &topic, "k", 1);
    assert_eq!(next[0].offset, first[2].offset + 1);
    assert_eq!(fetch_all(ctx.bus(), &topic, first[0].partition, 0).len(), 4);
    Ok(())
}

/// C1: an existing topic with another partition count is a conflict naming
/// both values, and nothing changes.
pub fn c01_provision_conflict_names_both_values(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 2);
    let result = ctx
        .bus()
        .provision(&ctx.manifest([TopicSpec::new(topic.clone(), 3)]));
    assert_err!(
        result,
        BusError::Conflict { topic: ref t, ref property, ref existing, ref requested, .. }
            if *t == topic && property == "partitions" && existing == "2" && requested == "3"
    );
    assert_eq!(ok("partitions", ctx.bus().partitions(&topic)), 2);
    for (spec, property) in [
        (
            TopicSpec::new(topic.clone(), 2).with_retention_ms(5_000),
            "retention_ms",
        ),
        (
            TopicSpec::new(topic.clone(), 2).with_max_record_bytes(10),
            "max_record_bytes",
        ),
        (
            TopicSpec::new(topic.clone(), 2).with_dedup_window_ms(7),
            "dedup_window_ms",
        ),
    ] {
        assert_err!(
            ctx.bus().provision(&ctx.manifest([spec])),
            BusError::Conflict { property: ref p, .. } if p == property
        );
    }
    let fetched = ctx.bus().fetch(&topic, 2, 0, 1);
    assert_err!(
        fetched,
        BusError::UnknownPartition {
            partition: 2,
            partitions: 2,
            ..
        }
    );
    Ok(())
}

/// C1: a manifest that conflicts on one topic creates none of its others.
pub fn c01_conflicting_manifest_creates_nothing(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 1);
    let fresh = ctx.topic("fresh");
    let manifest = ctx.manifest([TopicSpec::new(fresh.clone(), 1), TopicSpec::new(topic, 4)]);
    assert_err!(ctx.bus().provision(&manifest), BusError::Conflict { .. });
    assert_err!(ctx.bus().partitions(&fresh), BusError::UnknownTopic(_));
    Ok(())
}

/// C1: bad manifests fail with an error naming the field, creating nothing.
pub fn c01_bad_manifests_name_the_field(ctx: &mut Ctx) -> CaseResult {
    let good = ctx.topic("good");
    let cases: Vec<(TopicSpec, &str)> = vec![
        (TopicSpec::new(ctx.topic("zero"), 0), "topics[1].partitions"),
        (
            TopicSpec::new(ctx.topic("many"), 1025),
            "topics[1].partitions",
        ),
        (TopicSpec::new("", 1), "topics[1].name"),
        (TopicSpec::new(".", 1), "topics[1].name"),
        (TopicSpec::new("..", 1), "topics[1].name"),
        (TopicSpec::new(ctx.topic("a/b"), 1), "topics[1].name"),
        (TopicSpec::new(ctx.topic("a b"), 1), "topics[1].name"),
        (TopicSpec::new(ctx.topic("a*"), 1), "topics[1].name"),
        (
            TopicSpec::new(ctx.topic(&"x".repeat(200)), 1),
            "topics[1].name",
        ),
        (TopicSpec::new(good.clone(), 1), "topics[1].name"),
        (
            TopicSpec::new(ctx.topic("big"), 1).with_max_record_bytes(0),
            "topics[1].max_record_bytes",
        ),
    ];
    for (spec, field) in cases {
        let manifest = ctx.manifest([TopicSpec::new(good.clone(), 1), spec.clone()]);
        let result = ctx.bus().provision(&manifest);
        assert_err!(result, BusError::InvalidArgument { field: ref f, .. } if f == field);
        assert_err!(ctx.bus().partitions(&good), BusError::UnknownTopic(_));
        if !spec.name.is_empty() {
            assert_err!(
                ctx.bus().partitions(&spec.name),
                BusError::UnknownTopic(_) | BusError::InvalidArgument { .. }
            );
        }
    }
    assert!(
        !ctx.bus()
            .topics()
            .iter()
            .any(|t| t.starts_with(&ctx.topic(""))),
        "a refused manifest left topics behind"
    );
    // The bounds themselves are legal: 1024 partitions, a 200-byte name.
    ok(
        "1024 partitions",
        Manifest::new([TopicSpec::new(ctx.topic("max"), 1024)]).validate(),
    );
    let longest = ctx.topic(&"x".repeat(200 - ctx.topic("").len()));
    assert_eq!(longest.len(), 200);
    ctx.provision([TopicSpec::new(longest.clone(), 1)]);
    ok(
        "publish to a 200-byte name",
        ctx.bus().publish(&longest, "k", &json!(1)),
    );
    assert_eq!(fetch_all(ctx.bus(), &longest, 0, 0).len(), 1);
    let too_long = Manifest::new([TopicSpec::new(format!("{longest}x"), 1)]);
    assert_err!(too_long.validate(), BusError::InvalidArgument { .. });
    let unknown = Manifest::parse("[[topics]]\nname = \"x\"\npartitions = 1\nsize = 3\n");
    assert_err!(unknown, BusError::InvalidArgument { .. });
    Ok(())
}

/// C1: legal but look-alike names are distinct topics (they map to files,
/// stream names and Kafka topics without colliding).
pub fn c01_look_alike_names_are_distinct(ctx: &mut Ctx) -> CaseResult {
    let names = ["x", "x.0", "x_0", "X", "x-0", "x..0"].map(|base| ctx.topic(base));
    ctx.provision(
        names
            .iter()
            .enumerate()
            .map(|(i, name)| TopicSpec::new(name.clone(), u32::try_from(i).unwrap_or(0) + 1)),
    );
    for (i, name) in names.iter().enumerate() {
        assert_eq!(ok("partitions", ctx.bus().partitions(name)) as usize, i + 1);
        ok(
            "publish",
            ctx.bus().publish(name, "k", &json!({ "topic": name })),
        );
    }
    for name in &names {
        let partitions = ok("partitions", ctx.bus().partitions(name));
        let all: Vec<_> = (0..partitions)
            .flat_map(|p| fetch_all(ctx.bus(), name, p, 0))
            .collect();
        assert_eq!(all.len(), 1, "{name} holds {all:?}");
        assert_eq!(all[0].value, json!({ "topic": name }));
    }
    Ok(())
}

/// C1: what one bus provisioned, a reopened bus sees and verifies.
pub fn c01_provisioned_topics_survive_reopen(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 3);
    ctx.reopen()?;
    assert!(ctx.bus().topics().contains(&topic));
    assert_eq!(ok("partitions", ctx.bus().partitions(&topic)), 3);
    ctx.provision([TopicSpec::new(topic.clone(), 3)]);
    let result = ctx
        .bus()
        .provision(&ctx.manifest([TopicSpec::new(topic.clone(), 4)]));
    assert_err!(result, BusError::Conflict { .. });
    Ok(())
}

/// C2: every operation on an unprovisioned topic is `UnknownTopic`, and
/// none of them creates it.
pub fn c02_unknown_topic_is_refused_and_not_created(ctx: &mut Ctx) -> CaseResult {
    let ghost = ctx.topic("ghost");
    let bus = ctx.bus();
    let value = json!({"x": 1});
    assert_err!(bus.publish(&ghost, "k", &value), BusError::UnknownTopic(ref t) if *t == ghost);
    assert_err!(
        bus.publish_idempotent(&ghost, "k", &value, "u-1"),
        BusError::UnknownTopic(_)
    );
    assert_err!(
        bus.publish_batch(&ghost, &[BatchRecord::new("k", value.clone())]),
        BusError::UnknownTopic(_)
    );
    assert_err!(bus.fetch(&ghost, 0, 0, 10), BusError::UnknownTopic(_));
    assert_err!(bus.partitions(&ghost), BusError::UnknownTopic(_));
    assert_err!(
        bus.find_event_by_uid(&ghost, "k", "u-1"),
        BusError::UnknownTopic(_)
    );
    assert!(!bus.topics().contains(&ghost));
    // Still unknown afterwards, also to a new bus: nothing was left behind.
    assert_err!(bus.publish(&ghost, "k", &value), BusError::UnknownTopic(_));
    if ctx.reopen().is_ok() {
        assert_err!(ctx.bus().partitions(&ghost), BusError::UnknownTopic(_));
        assert!(!ctx.bus().topics().contains(&ghost));
    }
    Ok(())
}

/// C1/C2: a topic name no manifest could provision (empty, `.`, `..`, a
/// character outside `[A-Za-z0-9._-]`, over 200 bytes) is
/// `InvalidArgument` on field `topic` for every operation, before any
/// lookup; nothing is created.
pub fn c02_invalid_topic_names_are_invalid_arguments(ctx: &mut Ctx) -> CaseResult {
    ctx.simple_topic("t", 1);
    let before = ctx.bus().topics();
    let long = "t".repeat(201);
    let value = json!({"x": 1});
    let batch = [BatchRecord::new("k", value.clone()).with_uid("u-2")];
    for name in ["", ".", "..", "a/b", "a b", "a*", "ü", long.as_str()] {
        let bus = ctx.bus();
        let results = [
            ("publish", bus.publish(name, "k", &value).err()),
            (
                "publish_idempotent",
                bus.publish_idempotent(name, "k", &value, "u-1").err(),
            ),
            ("publish_batch", bus.publish_batch(name, &batch).err()),
            ("empty publish_batch", bus.publish_batch(name, &[]).err()),
            ("fetch", bus.fetch(name, 0, 0, 10).err()),
            ("partitions", bus.partitions(name).err()),
            (
                "find_event_by_uid",
                bus.find_event_by_uid(name, "k", "u-1").err(),
            ),
            ("offsets", bus.offsets(name, 0).err()),
        ];
        for (operation, error) in results {
            assert!(
                matches!(&error, Some(BusError::InvalidArgument { field, .. }) if field == "topic"),
                "{operation} on topic {name:?}: expected InvalidArgument on field topic, got {error:?}"
            );
        }
    }
    assert_eq!(ctx.bus().topics(), before);
    if ctx.reopen().is_ok() {
        assert_eq!(ctx.bus().topics(), before);
    }
    Ok(())
}

/// C2: a partition outside `0..N` is its own error, not an empty read.
pub fn c02_unknown_partition_is_an_error(ctx: &mut Ctx) -> CaseResult {
    let topic = ctx.simple_topic("t", 3);
    publish_n(ctx.bus(), &topic, "k", 2);
    for partition in [3, 4, 1000, u32::MAX] {
        assert_err!(
            ctx.bus().fetch(&topic, partition, 0, 10),
            BusError::UnknownPartition { partition: p, partitions: 3, .. } if p == partition
        );
    }
    Ok(())
}

/// C24: a manifest that declares a cold tier is either kept (the topic's
/// spec says where and how long) or refused with an error naming the
/// topic's `cold` section, creating nothing; never silently ignored.
pub fn c24_a_declared_cold_tier_is_kept_or_refused(ctx: &mut Ctx) -> CaseResult {
    let (plain, cold) = (ctx.topic("plain"), ctx.topic("cold"));
    let declared = ColdSpec::new("memory:").with_retention_ms(86_400_000);
    let manifest = ctx.manifest([
        TopicSpec::new(plain.clone(), 1),
        TopicSpec::new(cold.clone(), 1).with_cold(declared.clone()),
    ]);
    match ctx.bus().provision(&manifest) {
        Ok(()) => {
            if let Some(spec) = ok("topic_spec", ctx.bus().topic_spec(&cold)) {
                assert_eq!(spec.cold, Some(declared), "kept, but not as declared");
            }
            ok("publish", ctx.bus().publish(&cold, "k", &json!(1)));
        }
        Err(BusError::InvalidArgument { field, .. }) => {
            assert!(
                field.starts_with("topics[1].cold"),
                "refused, naming {field:?} instead of topics[1].cold"
            );
            assert_err!(ctx.bus().partitions(&plain), BusError::UnknownTopic(_));
            assert_err!(ctx.bus().partitions(&cold), BusError::UnknownTopic(_));
        }
        Err(other) => panic!("a declared cold tier: expected Ok or InvalidArgument, got {other:?}"),
    }
    Ok(())
}
