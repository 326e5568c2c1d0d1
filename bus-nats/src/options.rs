//! Connection options: a builder, and parsing from a `nats://` URL.
//! Secrets (password, token) never appear in `Debug` output or errors.

use secrecy::{ExposeSecret, SecretString};
use std::path::PathBuf;
use std::time::Duration;

use bus_core::BusError;
use bus_core::backend::executor::DEFAULT_TIMEOUT;

use crate::naming::{decode_header_text, validate_prefix};

/// Stream-name prefix when none is configured.
pub const DEFAULT_PREFIX: &str = "bus";

/// How to reach the NATS servers and how long to wait for them.
///
/// ```
/// let options = bus_nats::NatsOptions::from_url(
///     "nats://alice:secret@h1:4222,h2:4222?prefix=prod&timeout_ms=2000",
/// )
/// .unwrap();
/// assert_eq!(options.servers, ["nats://h1:4222", "nats://h2:4222"]);
/// assert!(!format!("{options:?}").contains("secret"));
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct NatsOptions {
    /// Server URLs (`nats://host:port`, `tls://host:port`).
    pub servers: Vec<String>,
    /// Prefix of every stream name, so deployments can share a server.
    pub prefix: String,
    /// Bound on every operation (contract C10).
    pub timeout: Duration,
    /// Bound on establishing a connection.
    pub connect_timeout: Duration,
    /// User name, with the password set by [`NatsOptions::user_and_password`].
    pub user: Option<String>,
    pub(crate) password: Option<SecretString>,
    pub(crate) token: Option<SecretString>,
    /// A `.creds` file (JWT + NKey seed).
    pub credentials_file: Option<PathBuf>,
    /// Refuse plain-text connections.
    pub tls_required: bool,
    /// Extra root certificates (PEM) to trust.
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS.
    pub tls_client_cert: Option<(PathBuf, PathBuf)>,
    /// Connection name shown by the server's monitoring.
    pub name: String,
}

impl std::fmt::Debug for NatsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |set: bool| if set { Some("<redacted>") } else { None };
        f.debug_struct("NatsOptions")
            .field("servers", &self.servers)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("user", &self.user)
            .field("password", &redacted(self.password.is_some()))
            .field("token", &redacted(self.token.is_some()))
            .field("credentials_file", &self.credentials_file)
            .field("tls_required", &self.tls_required)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_client_cert", &self.tls_client_cert)
            .field("name", &self.name)
            .finish()
    }
}

impl Default for NatsOptions {
    fn default() -> Self {
        Self {
            servers: vec!["nats://127.0.0.1:4222".to_owned()],
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_TIMEOUT,
            user: None,
            password: None,
            token: None,
            credentials_file: None,
            tls_required: false,
            tls_ca_file: None,
            tls_client_cert: None,
            name: "bus-nats".to_owned(),
        }
    }
}

impl NatsOptions {
    /// Options for `servers` with everything else at its default.
    pub fn new(servers: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            servers: servers.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Parses `nats://[user:pass@|token@]h1:4222[,h2:4222][/][?query]`
    /// (`tls://` requires TLS). Query parameters: `prefix`, `timeout_ms`,
    /// `connect_timeout_ms`, `user`, `password`, `token`, `creds`, `tls`
    /// (`true`/`false`), `ca`, `cert` + `key`, `name`.
    ///
    /// Split by hand rather than by the `url` crate: a list of hosts
    /// (`h1:PORT,h2:PORT`) is not an authority `url` accepts (it reads
    /// `PORT,h2:PORT` as the port). Each part and query value is
    /// percent-decoded by `bus_core::backend::percent_decode` (the
    /// `percent-encoding` crate).
    pub fn from_url(url: &str) -> Result<Self, BusError> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| BusError::invalid("url", "expected nats://HOST:PORT[,HOST:PORT]"))?;
        if !crate::SCHEMES.contains(&scheme) {
            return Err(BusError::invalid(
                "url",
                format!("scheme {scheme:?} is not nats:// or tls://"),
            ));
        }
        let mut options = Self {
            tls_required: scheme == "tls",
            ..Self::default()
        };
        let (authority, query) = rest.split_once('?').unwrap_or((rest, ""));
        let authority = authority.trim_end_matches('/');
        let hosts = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => {
                let decode = |text: &str, what: &str| {
                    decode_header_text(text)
                        .ok_or_else(|| BusError::invalid("url", format!("malformed {what}")))
                };
                match userinfo.split_once(':') {
                    Some((user, password)) => {
                        options.user = Some(decode(user, "user")?);
                        options.password = Some(decode(password, "password")?.into());
                    }
                    None => options.token = Some(decode(userinfo, "token")?.into()),
                }
                hosts
            }
            None => authority,
        };
        options.servers = hosts
            .split(',')
            .filter(|host| !host.is_empty())
            .map(|host| format!("{scheme}://{host}"))
            .collect();
        if options.servers.is_empty() {
            return Err(BusError::invalid(
                "url",
                "names no server; use nats://HOST:PORT",
            ));
        }
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, raw) = pair.split_once('=').unwrap_or((pair, ""));
            let value = decode_header_text(raw)
                .ok_or_else(|| BusError::invalid(format!("url.{name}"), "malformed escape"))?;
            options.apply(name, value)?;
        }
        options.check()?;
        Ok(options)
    }

    fn apply(&mut self, name: &str, value: String) -> Result<(), BusError> {
        let millis = |value: &str| {
            value
                .parse::<u64>()
                .ok()
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis)
                .ok_or_else(|| {
                    BusError::invalid(format!("url.{name}"), "expected milliseconds > 0")
                })
        };
        match name {
            "prefix" => self.prefix = value,
            "timeout_ms" => self.timeout = millis(&value)?,
            "connect_timeout_ms" => self.connect_timeout = millis(&value)?,
            "user" => self.user = Some(value),
            "password" => self.password = Some(value.into()),
            "token" => self.token = Some(value.into()),
            "creds" => self.credentials_file = Some(value.into()),
            "tls" => self.tls_required = matches!(value.as_str(), "true" | "1" | "yes"),
            "ca" => self.tls_ca_file = Some(value.into()),
            "cert" => {
                let key = self.tls_client_cert.take().map(|(_, key)| key);
                self.tls_client_cert = Some((value.into(), key.unwrap_or_default()));
            }
            "key" => {
                let cert = self.tls_client_cert.take().map(|(cert, _)| cert);
                self.tls_client_cert = Some((cert.unwrap_or_default(), value.into()));
            }
            "name" => self.name = value,
            other => {
                return Err(BusError::invalid(
                    format!("url.{other}"),
                    "unknown parameter; use prefix, timeout_ms, connect_timeout_ms, user, password, token, creds, tls, ca, cert, key or name",
                ));
            }
        }
        Ok(())
    }

    /// Checks the options hang together.
    pub fn check(&self) -> Result<(), BusError> {
        validate_prefix(&self.prefix).map_err(|reason| BusError::invalid("prefix", reason))?;
        if self.servers.is_empty() {
            return Err(BusError::invalid(
                "servers",
                "empty; name at least one server",
            ));
        }
        if self.password.is_some() && self.user.is_none() {
            return Err(BusError::invalid("user", "a password needs a user"));
        }
        if let Some((cert, key)) = &self.tls_client_cert
            && (cert.as_os_str().is_empty() || key.as_os_str().is_empty())
        {
            return Err(BusError::invalid(
                "cert",
                "a client certificate needs both cert and key",
            ));
        }
        Ok(())
    }

    /// Sets the stream-name prefix.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the operation timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the connect timeout.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Authenticates with a user and password.
    #[must_use]
    pub fn user_and_password(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.user = Some(user.into());
        self.password = Some(SecretString::from(password.into()));
        self
    }

    /// Authenticates with a token.
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(SecretString::from(token.into()));
        self
    }

    /// Authenticates with a `.creds` file.
    #[must_use]
    pub fn credentials_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.credentials_file = Some(path.into());
        self
    }

    /// Requires TLS, optionally trusting the extra roots in `ca_file`.
    #[must_use]
    pub fn require_tls(mut self, ca_file: Option<PathBuf>) -> Self {
        self.tls_required = true;
        self.tls_ca_file = ca_file;
        self
    }

    /// Presents a client certificate (mutual TLS).
    #[must_use]
    pub fn client_certificate(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_client_cert = Some((cert.into(), key.into()));
        self
    }

    /// The async-nats options these describe. Reconnects never give up and
    /// back off to at most one second, so the bus recovers soon after the
    /// server returns (contract C10).
    pub(crate) async fn connect_options(&self) -> Result<async_nats::ConnectOptions, BusError> {
        ensure_crypto_provider();
        let mut options = async_nats::ConnectOptions::new()
            .name(&self.name)
            .connection_timeout(self.connect_timeout)
            .request_timeout(Some(self.timeout))
            .max_reconnects(None)
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis(100u64.saturating_mul(attempts as u64).min(1_000))
            })
            .event_callback(|event| async move { log_event(&event) });
        if let (Some(user), Some(password)) = (&self.user, &self.password) {
            options = options.user_and_password(user.clone(), password.expose_secret().to_owned());
        }
        if let Some(token) = &self.token {
            options = options.token(token.expose_secret().to_owned());
        }
        if let Some(path) = &self.credentials_file {
            options = options.credentials_file(path).await.map_err(|error| {
                BusError::invalid(
                    "credentials_file",
                    format!("cannot read {}: {}", path.display(), error.kind()),
                )
            })?;
        }
        if self.tls_required {
            options = options.require_tls(true);
        }
        if let Some(ca) = &self.tls_ca_file {
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.tls_client_cert {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        Ok(options)
    }
}

/// rustls chooses a process-wide crypto provider by itself only when exactly
/// one is compiled in, and async-nats builds its TLS configuration from that
/// default. A program that also links a client on aws-lc-rs (object_store's
/// S3 client, as `bus`'s cold tier does) has two, and the first TLS
/// handshake of async-nats panicked ("no process-level CryptoProvider
/// available"; the CI rehearsal of 471444f). When the program has chosen
/// none, install ring's, the provider async-nats is built with; a program
/// that chose one keeps it.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one first, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// What the connection reports, through `tracing`: losing and regaining
/// the server, and the server's complaints.
fn log_event(event: &async_nats::Event) {
    use async_nats::Event;
    match event {
        Event::Disconnected => tracing::warn!("nats: connection lost; reconnecting"),
        Event::Connected => tracing::info!("nats: connected"),
        Event::LameDuckMode => tracing::warn!("nats: the server entered lame duck mode"),
        Event::SlowConsumer(sid) => tracing::warn!(sid, "nats: slow consumer"),
        Event::ServerError(error) => tracing::warn!(%error, "nats: server error"),
        Event::ClientError(error) => tracing::warn!(%error, "nats: client error"),
        other => tracing::debug!(event = %other, "nats: connection event"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn url_forms() {
        let plain = NatsOptions::from_url("nats://127.0.0.1:4222").unwrap();
        assert_eq!(plain.servers, ["nats://127.0.0.1:4222"]);
        assert_eq!(plain.prefix, DEFAULT_PREFIX);
        let token =
            NatsOptions::from_url("tls://s3cr3t@h:1/?prefix=a-b&connect_timeout_ms=5").unwrap();
        assert!(token.tls_required);
        assert_eq!(token.prefix, "a-b");
        assert_eq!(token.connect_timeout, Duration::from_millis(5));
        assert!(!format!("{token:?}").contains("s3cr3t"));
        let query = NatsOptions::from_url("nats://h:1?token=t%40k&timeout_ms=250").unwrap();
        assert_eq!(
            query.token.as_ref().map(ExposeSecret::expose_secret),
            Some("t@k")
        );
        assert_eq!(query.timeout, Duration::from_millis(250));
    }

    #[test]
    fn bad_urls_name_the_field_without_secrets() {
        for url in [
            "http://h:1",
            "nats://",
            "nats://h:1?prefix=a.b",
            "nats://h:1?timeout_ms=0",
            "nats://h:1?bogus=1",
        ] {
            assert!(NatsOptions::from_url(url).is_err(), "{url}");
        }
        let error = NatsOptions::from_url("nats://u:hunter2@h:1?prefix=a_b").unwrap_err();
        assert!(!format!("{error} {error:?}").contains("hunter2"));
    }
}
