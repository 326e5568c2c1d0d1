//! Where broker-backed tests find their brokers: `BUS_NATS_URL` and
//! `BUS_KAFKA_BROKERS` (and `BUS_POSTGRES_URL`), else (with the `testcontainers` feature and a
//! Docker engine) a container started once per test process.

use crate::Unavailable;

fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|value| value.trim().to_owned())
        .filter(|value| !value.is_empty())
}

/// The NATS URL to test against, or why there is none.
pub fn nats_url() -> Result<String, Unavailable> {
    match env("BUS_NATS_URL") {
        Some(url) => Ok(url),
        None => from_container(
            containers::nats,
            "BUS_NATS_URL is not set (scripts/nats.sh start)",
        ),
    }
}

/// The Kafka bootstrap list to test against, or why there is none.
pub fn kafka_brokers() -> Result<String, Unavailable> {
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
pub fn postgres_url() -> Result<String, Unavailable> {
    env("BUS_POSTGRES_URL").ok_or_else(|| {
        Unavailable("BUS_POSTGRES_URL is not set (scripts/postgres.sh start; export BUS_POSTGRES_URL=postgres://bus:bus@127.0.0.1:5433/bus)".to_owned())
    })
}

#[cfg(feature = "testcontainers")]
fn from_container(
    start: fn() -> Result<String, String>,
    unset: &str,
) -> Result<String, Unavailable> {
    start().map_err(|why| Unavailable(format!("{unset}, and no container could be started: {why}")))
}

#[cfg(not(feature = "testcontainers"))]
fn from_container(
    _start: fn() -> Result<String, String>,
    unset: &str,
) -> Result<String, Unavailable> {
    Err(Unavailable(unset.to_owned()))
}

#[cfg(feature = "testcontainers")]
mod containers {
    use std::process::{ChildStdin, Command, Stdio};
    use std::sync::{Mutex, OnceLock};

    use testcontainers_modules::kafka::apache;
    use testcontainers_modules::nats::Nats;
    use testcontainers_modules::testcontainers::core::{ContainerPort, ContainerRequest};
    use testcontainers_modules::testcontainers::runners::SyncRunner;
    use testcontainers_modules::testcontainers::{Container, Image, ImageExt};

    /// A container kept for the whole test process, with its address and
    /// the pipe its reaper waits on, or why it could not start.
    type Started<I> = OnceLock<Result<(Mutex<Container<I>>, ChildStdin, String), String>>;

    /// The label on every container the suite starts (`docker ps -a --filter label=...`).
    pub(super) const LABEL: &str = "bus.conformance";

    /// `name:tag` from `BUS_<backend>_IMAGE`, else the official image.
    fn image(var: &str, default: &str) -> (String, String) {
        let wanted = super::env(var).unwrap_or_else(|| default.to_owned());
        // the tag is after the last ':' that follows the last '/' (registry:port/name:tag)
        let slash = wanted.rfind('/').map_or(0, |at| at + 1);
        match wanted[slash..].rfind(':') {
            Some(colon) => (
                wanted[..slash + colon].to_owned(),
                wanted[slash + colon + 1..].to_owned(),
            ),
            None => (wanted, "latest".to_owned()),
        }
    }

    /// Starts `request` and logs its id; statics are never dropped, so a
    /// reaper process (`docker rm -f -v ID` once its stdin closes, which
    /// happens when this test process exits, however it exits) removes it.
    fn start<I: Image>(
        what: &str,
        (name, tag): (String, String),
        request: ContainerRequest<I>,
        port: ContainerPort,
    ) -> Result<(Mutex<Container<I>>, ChildStdin, u16), String> {
        let node = request
            .with_name(name.as_str())
            .with_tag(tag.as_str())
            .with_label(LABEL, std::process::id().to_string())
            .start()
            .map_err(|error| error.to_string())?;
        let id = node.id().to_owned();
        let reaper = Command::new("sh")
            .args([
                "-c",
                "trap '' HUP INT TERM; cat >/dev/null; docker rm -f -v \"$1\" >/dev/null 2>&1 \
                 || echo \"bus-conformance: could not remove container $1\" >&2",
                "bus-conformance-reaper",
                &id,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn();
        let mut reaper = match reaper {
            Ok(reaper) => reaper,
            Err(error) => {
                // no reaper: remove the container now rather than leave it behind
                let _ = node.rm();
                return Err(format!("cannot start the reaper of {what} ({error})"));
            }
        };
        let pipe = reaper.stdin.take().ok_or("the reaper has no stdin")?;
        let port = node
            .get_host_port_ipv4(port)
            .map_err(|error| error.to_string())?;
        crate::loud(&format!(
            "bus-conformance: started {what} container {id} ({name}:{tag}) on host port {port}; removed when this test process exits"
        ));
        Ok((Mutex::new(node), pipe, port))
    }

    /// A NATS image (`BUS_NATS_IMAGE`, default the official `nats`) with
    /// JetStream, a `max_payload` that fits a 1 MiB record plus its headers
    /// and an fsync before each ack (the same settings as scripts/nats.sh).
    pub(super) fn nats() -> Result<String, String> {
        static NODE: Started<Nats> = OnceLock::new();
        let started = NODE.get_or_init(|| {
            let request = Nats::default()
                .with_copy_to(
                    "/etc/bus-nats.conf",
                    b"max_payload: 8MB\njetstream { sync_interval: always }\n".to_vec(),
                )
                .with_cmd(["-c", "/etc/bus-nats.conf", "-js"]);
            let (node, pipe, port) = start(
                "NATS",
                image("BUS_NATS_IMAGE", "nats:2.10.14"),
                request,
                ContainerPort::Tcp(4222),
            )?;
            Ok((node, pipe, format!("nats://127.0.0.1:{port}")))
        });
        started
            .as_ref()
            .map(|(_, _, url)| url.clone())
            .map_err(Clone::clone)
    }

    /// A single-node KRaft Kafka image (`BUS_KAFKA_IMAGE`, default the
    /// official `apache/kafka`) with the single-node settings of
    /// docker-compose.yml and scripts/kafka.sh.
    pub(super) fn kafka() -> Result<String, String> {
        static NODE: Started<apache::Kafka> = OnceLock::new();
        let started = NODE.get_or_init(|| {
            let mut request: ContainerRequest<apache::Kafka> =
                apache::Kafka::default().with_jvm_image().into();
            for (key, value) in [
                ("KAFKA_NODE_ID", "1"),
                ("KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS", "1"),
                ("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1"),
                ("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1"),
                ("KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS", "1"),
                (
                    "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
                    "1",
                ),
                ("KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR", "1"),
                ("KAFKA_DEFAULT_REPLICATION_FACTOR", "1"),
                ("KAFKA_MIN_INSYNC_REPLICAS", "1"),
                ("KAFKA_NUM_PARTITIONS", "1"),
                ("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0"),
                ("KAFKA_LOG_RETENTION_CHECK_INTERVAL_MS", "1000"),
                ("KAFKA_LOG_INITIAL_TASK_DELAY_MS", "1000"),
                ("KAFKA_HEAP_OPTS", "-Xms256m -Xmx512m"),
            ] {
                request = request.with_env_var(key, value);
            }
            let (node, pipe, port) = start(
                "Kafka",
                image("BUS_KAFKA_IMAGE", "apache/kafka:4.4.0"),
                request,
                apache::KAFKA_PORT,
            )?;
            Ok((node, pipe, format!("127.0.0.1:{port}")))
        });
        started
            .as_ref()
            .map(|(_, _, url)| url.clone())
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
