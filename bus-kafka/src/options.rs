//! Connection options: the bootstrap list, TLS, SASL and timeouts, from a
//! `kafka://` URL or the [`KafkaOptions`] builder.

use secrecy::{ExposeSecret, SecretString};
use std::time::Duration;

use bus_core::BusError;
use bus_core::backend::executor::DEFAULT_TIMEOUT;
use rdkafka::ClientConfig;

/// The producers' default `linger.ms` (see [`KafkaOptions::linger`]): 0.
/// On a quiet machine (`bench_kafka_point`, two runs) a lone record was
/// acked 3.9–4.9× sooner than at 1 ms (2,574–2,777 against 572–663 rec/s)
/// and a batch of 10,000 went 1.1–1.3× faster: records handed over while a
/// request is in flight are batched anyway. (Runs on a machine loaded 10×
/// its cores had favoured 1 ms; docs/benchmarks.md.)
const DEFAULT_LINGER: Duration = Duration::ZERO;

/// Default name of the topic that records the manifest of every bus topic.
pub const DEFAULT_MANIFEST_TOPIC: &str = "__bus_manifest";

/// SASL mechanisms librdkafka implements without Cyrus SASL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SaslMechanism {
    /// `PLAIN` (only over TLS).
    Plain,
    /// `SCRAM-SHA-256`.
    ScramSha256,
    /// `SCRAM-SHA-512`.
    ScramSha512,
}

impl SaslMechanism {
    fn as_kafka(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
        }
    }

    fn parse(text: &str) -> Result<Self, BusError> {
        match text.to_ascii_uppercase().as_str() {
            "PLAIN" => Ok(Self::Plain),
            "SCRAM-SHA-256" => Ok(Self::ScramSha256),
            "SCRAM-SHA-512" => Ok(Self::ScramSha512),
            other => Err(BusError::invalid(
                "sasl_mechanism",
                format!("{other:?} is not supported; use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
            )),
        }
    }
}

/// How to reach a Kafka cluster. `Debug` never shows the password.
///
/// ```
/// let options = bus_kafka::KafkaOptions::new(["127.0.0.1:9092"])
///     .timeout(std::time::Duration::from_secs(3));
/// assert!(!format!("{options:?}").contains("secret"));
/// ```
#[derive(Clone)]
pub struct KafkaOptions {
    pub(crate) brokers: Vec<String>,
    pub(crate) timeout: Duration,
    pub(crate) tls: bool,
    pub(crate) ca_location: Option<String>,
    pub(crate) sasl: Option<(SaslMechanism, String, SecretString)>,
    /// A client certificate and its private key (PEM files), for brokers
    /// that require mutual TLS.
    pub(crate) client_cert: Option<(String, String)>,
    /// librdkafka settings passed through as given, applied after the bus's
    /// own (see [`KafkaOptions::rdkafka`]).
    pub(crate) rdkafka: Vec<(String, String)>,
    pub(crate) manifest_topic: String,
    /// `None`: three replicas when the cluster has three brokers, else one.
    pub(crate) manifest_replication: Option<u16>,
    /// Topics provisioned with `flush.messages=1`.
    pub(crate) flush_each_message: bool,
    /// The producers' `linger.ms`.
    pub(crate) linger: Duration,
}

impl std::fmt::Debug for KafkaOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaOptions")
            .field("brokers", &self.brokers)
            .field("timeout", &self.timeout)
            .field("tls", &self.tls)
            .field("ca_location", &self.ca_location)
            .field(
                "sasl",
                &self
                    .sasl
                    .as_ref()
                    .map(|(mechanism, user, _)| (mechanism, user, "<redacted>")),
            )
            .field("client_cert", &self.client_cert)
            .field(
                "rdkafka",
                &self
                    .rdkafka
                    .iter()
                    .map(|(name, value)| (name.as_str(), shown(name, value)))
                    .collect::<Vec<_>>(),
            )
            .field("manifest_topic", &self.manifest_topic)
            .field("flush_each_message", &self.flush_each_message)
            .field("linger", &self.linger)
            .finish()
    }
}

impl KafkaOptions {
    /// Options for the given bootstrap brokers (`host:port`), everything else default.
    pub fn new<S: Into<String>>(brokers: impl IntoIterator<Item = S>) -> Self {
        Self {
            brokers: brokers.into_iter().map(Into::into).collect(),
            timeout: DEFAULT_TIMEOUT,
            tls: false,
            ca_location: None,
            sasl: None,
            client_cert: None,
            rdkafka: Vec::new(),
            manifest_topic: DEFAULT_MANIFEST_TOPIC.to_owned(),
            manifest_replication: None,
            flush_each_message: false,
            linger: DEFAULT_LINGER,
        }
    }

    /// How long the producers wait for more records before sending a
    /// request (librdkafka's `linger.ms`, default 0). Records handed over
    /// while a request is in flight are batched whatever the setting; a
    /// linger only delays a lone record.
    #[must_use]
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// Bounds every network operation (default 10 s); librdkafka's own
    /// message, socket and request timeouts are set to it.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Connects over TLS.
    #[must_use]
    pub fn tls(mut self, yes: bool) -> Self {
        self.tls = yes;
        self
    }

    /// A CA bundle to verify the brokers with (PEM file); implies TLS.
    #[must_use]
    pub fn ca_location(mut self, path: impl Into<String>) -> Self {
        self.ca_location = Some(path.into());
        self.tls = true;
        self
    }

    /// SASL credentials (refused without TLS).
    #[must_use]
    pub fn sasl(
        mut self,
        mechanism: SaslMechanism,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.sasl = Some((
            mechanism,
            username.into(),
            SecretString::from(password.into()),
        ));
        self
    }

    /// A client certificate and its private key (PEM files) for brokers that
    /// require mutual TLS (`ssl.client.auth=required`); implies TLS.
    #[must_use]
    pub fn client_cert(mut self, cert: impl Into<String>, key: impl Into<String>) -> Self {
        self.client_cert = Some((cert.into(), key.into()));
        self.tls = true;
        self
    }

    /// Passes one librdkafka setting through to every client of the bus
    /// (`client.id`, `ssl.endpoint.identification.algorithm`,
    /// `ssl.key.password`, `socket.keepalive.enable`, ...). A setting the
    /// bus sets itself on any of its clients (acks, idempotence, offsets,
    /// timeouts, batching, fetch waits, the brokers, TLS and SASL its
    /// options set), or an alias of one, is refused by
    /// [`KafkaOptions::validate`], so no setting silently overrides
    /// another; a name librdkafka does not know is `InvalidArgument` at
    /// connect. Values of secret-looking names are redacted in `Debug` and
    /// errors.
    #[must_use]
    pub fn rdkafka(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.rdkafka.push((name.into(), value.into()));
        self
    }

    /// The topic that records the bus's manifest (default `__bus_manifest`);
    /// buses sharing it share one set of topics.
    #[must_use]
    pub fn manifest_topic(mut self, name: impl Into<String>) -> Self {
        self.manifest_topic = name.into();
        self
    }

    /// Replication factor of the manifest topic when it is created
    /// (default: 3 on a cluster of three or more brokers, else 1, so the
    /// loss of one broker does not take the topic list with it).
    #[must_use]
    pub fn manifest_replication(mut self, factor: u16) -> Self {
        self.manifest_replication = Some(factor.max(1));
        self
    }

    /// Makes an ack mean `Disk` on one broker: the bus's topics (its
    /// records, its manifest topic and its consumers' cursor topic) are
    /// created with `flush.messages=1`, so the broker fsyncs each append
    /// before it answers, and `capabilities()` reports
    /// [`AckDurability::Disk`](bus_core::AckDurability::Disk). An existing
    /// topic without that setting is refused with
    /// [`BusError::Conflict`] (by `provision`, or at connect for the manifest
    /// topic) naming the command that sets it; the bus never alters a topic
    /// it did not create. The cost is an fsync per produce request: see the
    /// README's durability table for the measured rates (URL:
    /// `flush_each_message=true`). A broker whose `log.flush.interval.messages`
    /// is 1 gives the same without the option, and `capabilities()` says so.
    #[must_use]
    pub fn flush_each_message(mut self, yes: bool) -> Self {
        self.flush_each_message = yes;
        self
    }

    /// Parses `kafka://h1:9092,h2:9092?timeout_ms=3000&tls=true&ca=/ca.pem&sasl_mechanism=SCRAM-SHA-256&username=u&password=p&manifest_topic=t`;
    /// `cert=/client.pem&key=/client.key` for mutual TLS, and
    /// `rdkafka.<name>=<value>` passes a librdkafka setting through (see
    /// [`KafkaOptions::rdkafka`]).
    /// `kafka+tls://` or `kafkas://` turn TLS on; `user:password@` before the
    /// hosts is the same as the username and password parameters; with a
    /// username and no `sasl_mechanism`, SCRAM-SHA-512 is used. SASL without
    /// TLS is refused by [`KafkaOptions::validate`].
    ///
    /// Split by hand rather than by the `url` crate: a list of hosts
    /// (`h1:PORT,h2:PORT`) is not an authority `url` accepts (it reads
    /// `PORT,h2:PORT` as the port). Each part and query value is
    /// percent-decoded by `bus_core::backend::percent_decode` (the
    /// `percent-encoding` crate).
    pub fn from_url(url: &str) -> Result<Self, BusError> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| BusError::invalid("url", "expected kafka://host:port[,host:port]"))?;
        let tls = match scheme {
            "kafka" => false,
            "kafkas" | "kafka+tls" | "kafka+ssl" => true,
            other => {
                return Err(BusError::invalid(
                    "url",
                    format!("scheme {other:?} is not kafka://, kafkas:// or kafka+tls://"),
                ));
            }
        };
        let (authority, query) = rest.split_once('?').unwrap_or((rest, ""));
        let authority = authority.trim_end_matches('/');
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let brokers: Vec<String> = hosts
            .split(',')
            .filter(|host| !host.is_empty())
            .map(|host| {
                if host.contains(':') {
                    host.to_owned()
                } else {
                    format!("{host}:9092")
                }
            })
            .collect();
        let mut options = Self::new(brokers).tls(tls);
        let mut mechanism = None;
        let (mut cert, mut key) = (None, None);
        let (mut user, mut password) = match userinfo {
            Some(info) => {
                let (user, password) = info.split_once(':').unwrap_or((info, ""));
                (
                    Some(decode("username", user)?),
                    Some(decode("password", password)?),
                )
            }
            None => (None, None),
        };
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = decode(name, value)?;
            match name {
                "timeout_ms" => {
                    let ms: u64 = value.parse().map_err(|_| {
                        BusError::invalid("timeout_ms", "expected milliseconds, e.g. 10000")
                    })?;
                    options.timeout = Duration::from_millis(ms);
                }
                "tls" => options.tls = parse_bool("tls", &value)?,
                "ca" | "ca_location" => {
                    options.ca_location = Some(value);
                    options.tls = true;
                }
                "sasl_mechanism" => mechanism = Some(SaslMechanism::parse(&value)?),
                "username" | "user" => user = Some(value),
                "password" => password = Some(value),
                "manifest_topic" => options.manifest_topic = value,
                "flush_each_message" => {
                    options.flush_each_message = parse_bool("flush_each_message", &value)?;
                }
                "cert" => cert = Some(value),
                "key" => key = Some(value),
                other => match other.strip_prefix("rdkafka.") {
                    Some(setting) if !setting.is_empty() => {
                        options.rdkafka.push((setting.to_owned(), value));
                    }
                    _ => {
                        return Err(BusError::invalid(
                            "url",
                            format!(
                                "unknown parameter {other:?}; known: timeout_ms, tls, ca, cert, key, sasl_mechanism, username, password, manifest_topic, flush_each_message, rdkafka.<librdkafka setting>"
                            ),
                        ));
                    }
                },
            }
        }
        match (cert, key) {
            (Some(cert), Some(key)) => options = options.client_cert(cert, key),
            (None, None) => {}
            _ => {
                return Err(BusError::invalid(
                    "cert",
                    "mutual TLS needs both cert= (client certificate) and key= (its private key)",
                ));
            }
        }
        if let Some(user) = user {
            let mechanism = mechanism.unwrap_or(SaslMechanism::ScramSha512);
            options.sasl = Some((mechanism, user, password.unwrap_or_default().into()));
        } else if mechanism.is_some() {
            return Err(BusError::invalid(
                "sasl_mechanism",
                "given without a username; add username= and password=",
            ));
        }
        Ok(options)
    }

    /// Checks the options (a bootstrap list, SASL only over TLS, a sane timeout).
    pub fn validate(&self) -> Result<(), BusError> {
        if self.brokers.is_empty() {
            return Err(BusError::invalid(
                "brokers",
                "empty; give at least one host:port",
            ));
        }
        if self.sasl.is_some() && !self.tls {
            return Err(BusError::invalid(
                "sasl",
                "SASL credentials would travel in the clear; enable TLS (kafkas:// or tls=true)",
            ));
        }
        if self.timeout < Duration::from_millis(100) {
            return Err(BusError::invalid("timeout", "use at least 100 ms"));
        }
        for (name, _) in &self.rdkafka {
            if let Some(reason) = reserved(name) {
                return Err(BusError::invalid(format!("rdkafka.{name}"), reason));
            }
        }
        bus_core::validate_topic_name(&self.manifest_topic)
            .map_err(|reason| BusError::invalid("manifest_topic", reason))
    }

    /// The operation timeout in milliseconds, as librdkafka wants it.
    pub(crate) fn timeout_ms(&self) -> String {
        self.timeout.as_millis().to_string()
    }

    /// The configuration every client of the bus shares.
    pub(crate) fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", self.brokers.join(","))
            .set("socket.timeout.ms", self.timeout_ms())
            .set("socket.connection.setup.timeout.ms", self.timeout_ms())
            .set("reconnect.backoff.ms", "50")
            .set("reconnect.backoff.max.ms", "500")
            .set("log_level", "3");
        let protocol = match (self.tls, self.sasl.is_some()) {
            (false, _) => "plaintext",
            (true, false) => "ssl",
            (true, true) => "sasl_ssl",
        };
        config.set("security.protocol", protocol);
        if let Some(ca) = &self.ca_location {
            config.set("ssl.ca.location", ca);
        }
        if let Some((cert, key)) = &self.client_cert {
            config
                .set("ssl.certificate.location", cert)
                .set("ssl.key.location", key);
        }
        if let Some((mechanism, user, password)) = &self.sasl {
            config
                .set("sasl.mechanisms", mechanism.as_kafka())
                .set("sasl.username", user)
                .set("sasl.password", password.expose_secret());
        }
        for (name, value) in &self.rdkafka {
            config.set(name, value);
        }
        config
    }

    /// `text` with the password and secret pass-through values replaced,
    /// for error messages.
    pub(crate) fn redact(&self, text: String) -> String {
        let mut text = match &self.sasl {
            Some((_, _, password)) if !password.expose_secret().is_empty() => {
                text.replace(password.expose_secret(), "<redacted>")
            }
            _ => text,
        };
        for (name, value) in &self.rdkafka {
            if is_secret(name) && !value.is_empty() {
                text = text.replace(value.as_str(), "<redacted>");
            }
        }
        text
    }
}

/// librdkafka settings a pass-through may not name: every one the bus sets
/// on one of its clients (a test in `client.rs` checks the list against
/// the clients' configurations), their aliases, and the others its acks,
/// dedup and ordering rest on. With none of them passed through, which
/// value wins never depends on the order settings are applied in.
const BUS_SETTINGS: &[&str] = &[
    // The options' own (brokers, timeouts, TLS, SASL).
    "bootstrap.servers",
    "metadata.broker.list",
    "socket.timeout.ms",
    "socket.connection.setup.timeout.ms",
    "reconnect.backoff.ms",
    "reconnect.backoff.max.ms",
    "log_level",
    "security.protocol",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "sasl.mechanisms",
    "sasl.mechanism",
    "sasl.username",
    "sasl.password",
    // The producer: acks, idempotence, bounded waits, batching.
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "request.timeout.ms",
    "linger.ms",
    "queue.buffering.max.ms",
    "batch.size",
    "message.max.bytes",
    "max.in.flight.requests.per.connection",
    "max.in.flight",
    "retries",
    "message.send.max.retries",
    "enable.gapless.guarantee",
    "transactional.id",
    "transaction.timeout.ms",
    "partitioner",
    "partitioner_cb",
    // The readers and subscriptions: positioned, no commits, prompt ends.
    "group.id",
    "enable.auto.commit",
    "auto.commit.enable",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "allow.auto.create.topics",
    "enable.partition.eof",
    "isolation.level",
    "fetch.min.bytes",
    "fetch.wait.max.ms",
    "fetch.error.backoff.ms",
    "fetch.queue.backoff.ms",
    "queued.min.messages",
    "queued.max.messages.kbytes",
    "session.timeout.ms",
    "log.connection.close",
];

/// Why a librdkafka setting may not be passed through, when it may not.
pub(crate) fn reserved(name: &str) -> Option<&'static str> {
    BUS_SETTINGS.contains(&name).then_some(
        "the bus sets this itself (its acks, dedup, offsets, bounded waits or TLS/SASL options depend on it); use the bus's own options",
    )
}

/// Whether a pass-through setting holds a secret (shown as `<redacted>`).
fn is_secret(name: &str) -> bool {
    bus_core::backend::is_secret_setting(name)
}

/// A pass-through value as `Debug` shows it.
fn shown<'a>(name: &str, value: &'a str) -> &'a str {
    if is_secret(name) { "<redacted>" } else { value }
}

fn parse_bool(field: &str, value: &str) -> Result<bool, BusError> {
    match value {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(BusError::invalid(field, "expected true or false")),
    }
}

/// Percent-decoding of URL components.
/// A percent-encoded URL part, decoded; malformed is an argument error
/// naming `field`, never a different value.
fn decode(field: &str, text: &str) -> Result<String, BusError> {
    bus_core::backend::percent_decode(text).ok_or_else(|| {
        BusError::invalid(
            field,
            "malformed percent-encoding (a % must start %XX of valid UTF-8)",
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn url_with_hosts_and_params() {
        let options =
            KafkaOptions::from_url("kafka://h1:9092,h2?timeout_ms=3000&manifest_topic=m").unwrap();
        assert_eq!(options.brokers, vec!["h1:9092", "h2:9092"]);
        assert_eq!(options.timeout, Duration::from_secs(3));
        assert_eq!(options.manifest_topic, "m");
        assert!(!options.flush_each_message);
        options.validate().unwrap();
        let flushed = KafkaOptions::from_url("kafka://h?flush_each_message=true").unwrap();
        assert!(flushed.flush_each_message);
        assert!(matches!(
            KafkaOptions::from_url("kafka://h?flush_each_message=maybe"),
            Err(BusError::InvalidArgument { .. })
        ));
    }

    #[test]
    fn sasl_needs_tls_and_password_never_shows() {
        let plain =
            KafkaOptions::from_url("kafka://u:s3cr%3At@h:9092?sasl_mechanism=PLAIN").unwrap();
        let error = plain.validate().unwrap_err();
        assert!(matches!(error, BusError::InvalidArgument { .. }));
        assert!(!format!("{error} {error:?} {plain:?}").contains("s3cr"));
        let tls = KafkaOptions::from_url(
            "kafkas://h:9093?sasl_mechanism=SCRAM-SHA-256&username=u&password=s3cr",
        )
        .unwrap();
        tls.validate().unwrap();
        assert!(!format!("{tls:?}").contains("s3cr"));
        assert_eq!(tls.redact("bad s3cr".to_owned()), "bad <redacted>");
    }

    #[test]
    fn bad_urls_are_invalid_arguments() {
        for url in [
            "nats://h",
            "kafka://h?nope=1",
            "kafka://h?timeout_ms=x",
            "kafka://u:pw%zz@h",
            "kafka://h?manifest_topic=%E2%82",
            "h:9092",
        ] {
            assert!(
                matches!(
                    KafkaOptions::from_url(url),
                    Err(BusError::InvalidArgument { .. })
                ),
                "{url}"
            );
        }
        assert!(
            KafkaOptions::from_url("kafka://")
                .unwrap()
                .validate()
                .is_err()
        );
    }

    #[test]
    fn client_certificate_and_pass_through_by_url() {
        let options = KafkaOptions::from_url(
            "kafka://h:9093?cert=/c.pem&key=/k.pem&rdkafka.client.id=audit&rdkafka.ssl.key.password=kp%21",
        )
        .unwrap();
        options.validate().unwrap();
        assert!(options.tls, "a client certificate implies TLS");
        let config = options.client_config();
        assert_eq!(config.get("security.protocol"), Some("ssl"));
        assert_eq!(config.get("ssl.certificate.location"), Some("/c.pem"));
        assert_eq!(config.get("ssl.key.location"), Some("/k.pem"));
        assert_eq!(config.get("client.id"), Some("audit"));
        assert_eq!(config.get("ssl.key.password"), Some("kp!"));
        let shown = format!("{options:?}");
        assert!(shown.contains("audit") && !shown.contains("kp!"), "{shown}");
        assert_eq!(options.redact("bad kp!".to_owned()), "bad <redacted>");
    }

    #[test]
    fn half_a_client_certificate_is_refused() {
        for url in ["kafka://h?cert=/c.pem", "kafka://h?key=/k.pem"] {
            assert!(
                matches!(
                    KafkaOptions::from_url(url),
                    Err(BusError::InvalidArgument { ref field, .. }) if field == "cert"
                ),
                "{url}"
            );
        }
    }

    #[test]
    fn settings_the_contract_rests_on_cannot_be_passed_through() {
        for name in [
            "acks",
            "enable.idempotence",
            "enable.auto.commit",
            "isolation.level",
            "bootstrap.servers",
            "sasl.password",
        ] {
            let by_builder = KafkaOptions::new(["h:9092"]).rdkafka(name, "x").validate();
            assert!(
                matches!(&by_builder, Err(BusError::InvalidArgument { field, .. }) if *field == format!("rdkafka.{name}")),
                "{name}: {by_builder:?}"
            );
            let by_url = KafkaOptions::from_url(&format!("kafka://h?rdkafka.{name}=x"))
                .unwrap()
                .validate();
            assert!(by_url.is_err(), "{name} by URL");
        }
        assert!(
            matches!(
                KafkaOptions::from_url("kafka://h?rdkafka.=1"),
                Err(BusError::InvalidArgument { .. })
            ),
            "an empty setting name"
        );
    }
}
