//! Where broker-backed tests find their brokers: `BUS_NATS_URL` and
//! `BUS_KAFKA_BROKERS` (and `BUS_POSTGRES_URL`), else (with the `testcontainers` feature and a
//! Docker engine) a container started once per test process.

fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|value| value.trim().to_owned())
        .filter(|value| !value.is_empty())
}

/// The NATS URL to test against, or why there is none.
pub fn nats_url() -> Result<String, String> {
    match env("BUS_NATS_URL") {
        Some(url) => Ok(url),
        None => from_container(
            containers::nats,
            "BUS_NATS_URL is not set (scripts/nats.sh start)",
        ),
    }
}

/// The Kafka bootstrap list to test against, or why there is none.
pub fn kafka_brokers() -> Result<String, String> {
    match env("BUS_KAFKA_BROKERS") {
        Some(brokers) => Ok(brokers),
        None => from_container(
            containers::kafka,
            "BUS_KAFKA_BROKERS is not set (scripts/kafka.sh start; export BUS_KAFKA_BROKERS=127.0.0.1:9092)",
        ),
    }
}

/// The PostgreSQL URL to test against, or why there is none (no container
/// fallback: scripts/postgres.sh starts one natively).
pub fn postgres_url() -> Result<String, String> {
    env("BUS_POSTGRES_URL").ok_or_else(|| {
        "BUS_POSTGRES_URL is not set (scripts/postgres.sh start; export BUS_POSTGRES_URL=postgres://bus:bus@127.0.0.1:5433/bus)".to_owned()
    })
}

#[cfg(feature = "testcontainers")]
fn from_container(start: fn() -> Result<String, String>, unset: &str) -> Result<String, String> {
    start().map_err(|why| format!("{unset}, and no container could be started: {why}"))
}

#[cfg(not(feature = "testcontainers"))]
fn from_container(_start: fn() -> Result<String, String>, unset: &str) -> Result<String, String> {
    Err(unset.to_owned())
}

#[cfg(feature = "testcontainers")]
mod containers {
    use std::sync::{Mutex, OnceLock};

    use testcontainers_modules::kafka::apache;
    use testcontainers_modules::nats::Nats;
    use testcontainers_modules::testcontainers::runners::SyncRunner;
    use testcontainers_modules::testcontainers::{Container, ImageExt};

    /// A container kept for the whole test process, with its address, or
    /// why it could not start.
    type Started<I> = OnceLock<Result<(Mutex<Container<I>>, String), String>>;

    /// The NATS image with JetStream, a `max_payload` that fits a 1 MiB
    /// record plus its headers and an fsync before each ack (the same
    /// settings as scripts/nats.sh).
    pub(super) fn nats() -> Result<String, String> {
        static NODE: Started<Nats> = OnceLock::new();
        let started = NODE.get_or_init(|| {
            let node = Nats::default()
                .with_copy_to(
                    "/etc/bus-nats.conf",
                    b"max_payload: 8MB\njetstream { sync_interval: always }\n".to_vec(),
                )
                .with_cmd(["-c", "/etc/bus-nats.conf", "-js"])
                .start()
                .map_err(|error| error.to_string())?;
            let port = node
                .get_host_port_ipv4(4222)
                .map_err(|error| error.to_string())?;
            Ok((Mutex::new(node), format!("nats://127.0.0.1:{port}")))
        });
        started
            .as_ref()
            .map(|(_, url)| url.clone())
            .map_err(Clone::clone)
    }

    /// The official Apache Kafka image, single-node KRaft.
    pub(super) fn kafka() -> Result<String, String> {
        static NODE: Started<apache::Kafka> = OnceLock::new();
        let started = NODE.get_or_init(|| {
            let node = apache::Kafka::default()
                .start()
                .map_err(|error| error.to_string())?;
            let port = node
                .get_host_port_ipv4(apache::KAFKA_PORT)
                .map_err(|error| error.to_string())?;
            Ok((Mutex::new(node), format!("127.0.0.1:{port}")))
        });
        started
            .as_ref()
            .map(|(_, url)| url.clone())
            .map_err(Clone::clone)
    }
}

#[cfg(not(feature = "testcontainers"))]
mod containers {
    pub(super) fn nats() -> Result<String, String> {
        Err("built without the testcontainers feature".to_owned())
    }

    pub(super) fn kafka() -> Result<String, String> {
        Err("built without the testcontainers feature".to_owned())
    }
}
