//! `bus::open` picks backends by URL and names the feature a URL needs.

use bus::{BusError, Manifest, TopicSpec};

#[test]
fn memory_url_opens_and_provisions() {
    let manifest = Manifest::new([TopicSpec::new("t", 3)]);
    let bus = bus::open("memory://", &manifest).expect("memory bus");
    assert_eq!(bus.partitions("t").expect("provisioned"), 3);
    assert_eq!(bus.capabilities().backend, "memory");
}

#[test]
fn unknown_scheme_is_invalid_argument() {
    let result = bus::open("carrier-pigeon://roof", &Manifest::default());
    assert!(
        matches!(result, Err(BusError::InvalidArgument { ref field, .. }) if field == "url"),
        "{:?}",
        result.err()
    );
}

#[test]
fn bad_manifest_is_refused_before_connecting() {
    let manifest = Manifest::new([TopicSpec::new("t", 0)]);
    let result = bus::open("memory://", &manifest);
    assert!(matches!(result, Err(BusError::InvalidArgument { .. })));
}

#[cfg(not(feature = "nats"))]
#[test]
fn nats_url_without_the_feature_names_it() {
    let result = bus::open("nats://127.0.0.1:4222", &Manifest::default());
    assert!(
        matches!(result, Err(BusError::FeatureDisabled { ref feature, .. }) if feature == "nats"),
        "{:?}",
        result.err()
    );
}

#[cfg(not(feature = "kafka"))]
#[test]
fn kafka_url_without_the_feature_names_it() {
    let result = bus::open("kafka://127.0.0.1:9092", &Manifest::default());
    assert!(
        matches!(result, Err(BusError::FeatureDisabled { ref feature, .. }) if feature == "kafka"),
        "{:?}",
        result.err()
    );
}

#[cfg(not(feature = "postgres"))]
#[test]
fn postgres_url_without_the_feature_names_it() {
    let result = bus::open("postgres://bus:pw@127.0.0.1:5433/bus", &Manifest::default());
    assert!(
        matches!(result, Err(BusError::FeatureDisabled { ref feature, .. }) if feature == "postgres"),
        "{:?}",
        result.err()
    );
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_url_opens_a_postgres_bus() {
    let Ok(url) = bus_conformance::brokers::postgres_url() else {
        assert!(
            !bus_conformance::brokers_required(),
            "BUS_REQUIRE_BROKERS=1 but BUS_POSTGRES_URL is not set"
        );
        bus_conformance::loud(
            "SKIPPED postgres_url_opens_a_postgres_bus: BUS_POSTGRES_URL is not set",
        );
        return;
    };
    let bus = bus::connect(&url).unwrap_or_else(|e| panic!("connect: {e}"));
    assert_eq!(bus.capabilities().backend, "postgres");
}

#[cfg(not(feature = "embedded"))]
#[test]
fn file_url_without_the_feature_names_it() {
    let result = bus::open("/tmp/somewhere", &Manifest::default());
    assert!(
        matches!(result, Err(BusError::FeatureDisabled { ref feature, .. }) if feature == "embedded"),
        "{:?}",
        result.err()
    );
}

#[cfg(feature = "embedded")]
#[test]
fn file_url_with_read_only_follows_a_writer_and_refuses_writes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = Manifest::new([TopicSpec::new("t", 1)]);
    let writer = bus::open(&format!("file://{}", dir.path().display()), &manifest).expect("writer");
    // Beside the writer's lock; provisioning what exists writes nothing.
    let reader = bus::open(
        &format!("file://{}?read_only=true", dir.path().display()),
        &manifest,
    )
    .expect("reader");
    let ack = writer
        .publish("t", "k", &serde_json::json!({"n": 1}))
        .expect("publish");
    assert_eq!(
        reader.fetch("t", 0, 0, 10).expect("fetch")[0].offset,
        ack.offset
    );
    assert!(matches!(
        reader.publish("t", "k", &serde_json::json!({"n": 2})),
        Err(BusError::ReadOnly { ref operation, .. }) if operation == "publish"
    ));
    let bad = bus::connect(&format!("file://{}?readonly=yes", dir.path().display()));
    assert!(matches!(bad, Err(BusError::InvalidArgument { .. })));
}

/// Every URL form the README shows, with the backend it routes to. The
/// schemes come from the backend crates themselves (`SCHEMES`), so a scheme
/// a backend parses is never refused by the facade.
const README_URLS: &[(&str, &str)] = &[
    ("memory://", "memory"),
    ("file://./bus-data", "embedded"),
    ("./bus-data", "embedded"),
    ("file:///var/lib/bus?read_only=true", "embedded"),
    ("nats://127.0.0.1:4222", "nats"),
    ("nats://h1:4222,h2:4222", "nats"),
    (
        "tls://alice:PASSWORD@nats.example:4222?ca=/etc/bus/ca.pem&cert=/etc/bus/client.crt&key=/etc/bus/client.key",
        "nats",
    ),
    ("nats://TOKEN@nats.example:4222", "nats"),
    ("nats://nats.example:4222?creds=/path/user.creds", "nats"),
    ("kafka://127.0.0.1:9092", "kafka"),
    ("kafka://h1:9092,h2:9092", "kafka"),
    (
        "kafkas://bob:PASSWORD@kafka.example:9093?ca=/etc/bus/ca.pem&sasl_mechanism=SCRAM-SHA-256",
        "kafka",
    ),
    ("kafka+tls://kafka.example:9093", "kafka"),
    ("postgres://bus:bus@127.0.0.1:5433/bus", "postgres"),
    (
        "postgres://carol:PASSWORD@db.example:5432/bus?sslmode=verify-full&sslrootcert=/etc/bus/ca.pem",
        "postgres",
    ),
];

#[test]
fn every_readme_url_routes_to_its_backend() {
    for &(url, name) in README_URLS {
        let scheme = url.split_once("://").map_or("file", |(scheme, _)| scheme);
        let backend = bus::backends()
            .into_iter()
            .find(|backend| backend.schemes.contains(&scheme))
            .unwrap_or_else(|| panic!("no backend takes {url}"));
        assert_eq!(backend.name, name, "{url}");
        match bus::backend_of(url) {
            Ok(routed) => assert_eq!(routed.name, name, "{url}"),
            Err(BusError::FeatureDisabled { feature, .. }) => {
                assert!(!backend.enabled, "{url}");
                assert_eq!(feature, name, "{url} names its feature");
            }
            Err(error) => panic!("{url}: {error}"),
        }
    }
}

#[cfg(feature = "nats")]
#[test]
fn every_readme_nats_url_parses() {
    for &(url, name) in README_URLS {
        if name == "nats" {
            bus_nats::NatsOptions::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }
}

#[cfg(feature = "postgres")]
#[test]
fn every_readme_postgres_url_parses() {
    for &(url, name) in README_URLS {
        if name == "postgres" {
            bus_postgres::PostgresOptions::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }
}

#[cfg(feature = "kafka")]
#[test]
fn every_readme_kafka_url_parses() {
    for &(url, name) in README_URLS {
        if name == "kafka" {
            bus_kafka::KafkaOptions::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }
}

#[cfg(feature = "kafka")]
#[test]
fn kafkas_reaches_the_kafka_backend() {
    // Nothing listens on port 1: the error must come from Kafka, not from
    // the facade refusing the scheme.
    let result = bus::connect("kafkas://127.0.0.1:1?timeout_ms=500");
    assert!(
        !matches!(result, Err(BusError::InvalidArgument { ref field, .. }) if field == "url"),
        "kafkas:// refused by the facade: {:?}",
        result.err()
    );
}

/// A backend built by hand through the facade's re-exports alone: the
/// embedded bus with its options, and the in-memory bus that now lives in
/// bus-core (so the suite and every backend crate can use it too).
#[cfg(feature = "embedded")]
#[test]
#[allow(clippy::unwrap_used)]
fn backends_build_by_hand_through_the_facade() {
    let dir = tempfile::tempdir().unwrap();
    let options = bus::EmbeddedOptions::default().durability(bus::Durability::Sync);
    let embedded = bus::EmbeddedBus::open_with(dir.path(), options).unwrap();
    let memory = bus::memory::MemoryBus::new();
    let manifest = Manifest::new([TopicSpec::new("hand", 1)]);
    for bus in [&embedded as &dyn bus::EventBus, &memory] {
        bus.provision(&manifest).unwrap();
        let ack = bus.publish("hand", "k", &serde_json::json!(1)).unwrap();
        assert_eq!(bus.fetch("hand", 0, ack.offset, 1).unwrap()[0].value, 1);
    }
    // The crates themselves are reachable as modules too.
    assert_eq!(bus::embedded::SCHEMES, bus_embedded_schemes());
}

#[cfg(feature = "embedded")]
fn bus_embedded_schemes() -> &'static [&'static str] {
    bus::backends()
        .into_iter()
        .find(|b| b.name == "embedded")
        .expect("the embedded backend is listed")
        .schemes
}

/// What the operations `work` runs on this thread log at INFO, with a line
/// per closed span.
fn closed_spans(work: impl FnOnce()) -> String {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::util::SubscriberInitExt as _;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let out = Captured::default();
    let writer = out.clone();
    let guard = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .finish()
        .set_default();
    work();
    drop(guard);
    let bytes = out
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `bus::open` wraps every backend in `Traced`: a facade user sees the
/// span schema whichever backend the URL names.
#[test]
fn open_returns_a_bus_whose_operations_run_in_spans() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file_url = format!("file://{}", dir.path().display());
    let manifest = Manifest::new([TopicSpec::new("spans", 1)]);
    let mut urls = vec![("memory://", "memory")];
    // `scripts/test.sh` also runs this file without default features.
    if cfg!(feature = "embedded") {
        urls.push((file_url.as_str(), "embedded"));
    }
    for (url, backend) in urls {
        let bus = bus::open(url, &manifest).expect("bus");
        let value = serde_json::json!({"n": 1});
        // Once before the subscriber, so the callsites are registered (see
        // bus-core's tests/traced.rs).
        bus.publish("spans", "k", &value).expect("publish");
        let log = closed_spans(|| {
            let ack = bus.publish("spans", "k", &value).expect("publish");
            bus.fetch("spans", ack.partition, 0, 3).expect("fetch");
        });
        for span in [
            format!("bus.publish{{backend=\"{backend}\" topic=spans}}"),
            format!("bus.fetch{{backend=\"{backend}\" topic=spans partition=0 offset=0 max=3}}"),
        ] {
            assert!(
                log.lines()
                    .any(|line| line.contains(&span) && line.contains("close")),
                "no closed span {span} in:\n{log}"
            );
        }
    }
}

/// A manifest that declares a cold tier (C24) on a bus that cannot keep
/// one is refused, naming the section; nothing is provisioned.
#[cfg(not(feature = "cold"))]
#[test]
fn a_declared_cold_tier_without_the_feature_is_refused() {
    let manifest = Manifest::new([
        TopicSpec::new("t", 1).with_cold(bus::ColdSpec::new("file:///var/lib/bus-cold"))
    ]);
    match bus::open("memory://", &manifest) {
        Err(BusError::InvalidArgument { field, reason }) => {
            assert_eq!(field, "topics[0].cold");
            assert!(reason.contains("feature cold"), "{reason}");
        }
        other => panic!("expected InvalidArgument, got {:?}", other.err()),
    }
}

/// With feature `cold`, `open` keeps a declared tier on a backend that has
/// none of its own (a `ColdBus` on the declared location), one per bus.
#[cfg(feature = "cold")]
#[test]
fn a_declared_cold_tier_is_kept_by_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let here = format!("file://{}", dir.path().join("here").display());
    let there = format!("file://{}", dir.path().join("there").display());
    let manifest = Manifest::new([
        TopicSpec::new("t", 1).with_cold(bus::ColdSpec::new(&here).with_retention_ms(60_000))
    ]);
    let bus = bus::open("memory://", &manifest).expect("opened with a cold tier");
    let spec = bus.topic_spec("t").expect("spec").expect("topic");
    assert_eq!(spec.cold, manifest.topics[0].cold);
    bus.publish("t", "k", &serde_json::json!({"n": 1}))
        .expect("publish");
    // Maintenance archives through the head: the record is in the tier's files.
    bus.maintenance(bus::now_ms()).expect("maintenance");
    let tier =
        bus::ColdTier::open(&bus::ColdLocation::parse(&here).expect("location")).expect("tier");
    assert_eq!(tier.manifest("t", 0).expect("tier manifest").end(), 1);

    // Durable consumers of such a bus go through the tier too.
    let consumers = bus::open_consumers("memory://", &manifest).expect("open_consumers");
    consumers
        .publish("t", "k", &serde_json::json!({"n": 2}))
        .expect("publish");
    let mut consumer = consumers
        .consume(
            "t",
            "reader",
            bus::Selector::Topic,
            bus::StartAt::Beginning,
            bus::consumer::ConsumeOptions::default(),
        )
        .expect("consume");
    let delivery = consumer
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("recv")
        .expect("a delivery");
    assert_eq!(delivery.event.value, serde_json::json!({"n": 2}));

    let two = Manifest::new([
        TopicSpec::new("a", 1).with_cold(bus::ColdSpec::new(&here)),
        TopicSpec::new("b", 1).with_cold(bus::ColdSpec::new(&there)),
    ]);
    match bus::open("memory://", &two) {
        Err(BusError::InvalidArgument { field, .. }) => {
            assert_eq!(field, "topics[1].cold.location");
        }
        other => panic!("expected InvalidArgument, got {:?}", other.err()),
    }
}
