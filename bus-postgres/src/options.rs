//! How to reach the database: `postgres://USER:PASSWORD@HOST:PORT/DB`, plus
//! the bus's own query options (`schema`, `timeout_ms`, `pool_size`).

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use bus_core::BusError;
use bus_core::backend::executor::DEFAULT_TIMEOUT;

use crate::tls::TlsFiles;

/// Schema the bus keeps its tables in unless the URL names another.
pub const DEFAULT_SCHEMA: &str = "bus";

/// Connections in the pool unless the URL says otherwise.
pub const DEFAULT_POOL_SIZE: usize = 8;

/// Connection settings of a [`PostgresBus`](crate::PostgresBus).
///
/// `Debug` shows the user, hosts, database and schema, never the password.
#[derive(Clone)]
pub struct PostgresOptions {
    /// The client's connection settings (password included).
    pub config: tokio_postgres::Config,
    /// Schema holding the bus's tables (`[A-Za-z_][A-Za-z0-9_]{0,62}`).
    pub schema: String,
    /// Bound of every database operation.
    pub timeout: Duration,
    /// Pooled connections (one more is opened for live subscriptions).
    pub pool_size: usize,
    /// TLS to the server, when the URL asks for it.
    pub tls: Option<TlsFiles>,
}

impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .map(|host| match host {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                #[cfg(unix)]
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        f.debug_struct("PostgresOptions")
            .field("user", &self.config.get_user())
            .field(
                "password",
                &self.config.get_password().map(|_| "<redacted>"),
            )
            .field("hosts", &hosts)
            .field("ports", &self.config.get_ports())
            .field("dbname", &self.config.get_dbname())
            .field("schema", &self.schema)
            .field("timeout", &self.timeout)
            .field("pool_size", &self.pool_size)
            .field("tls", &self.tls)
            .finish()
    }
}

impl PostgresOptions {
    /// Parses `postgres://USER:PASSWORD@HOST:PORT/DB[?schema=S&timeout_ms=N&pool_size=N&...]`.
    /// TLS: `sslmode=require` (or `verify-ca`, `verify-full`: the certificate and the host name
    /// are always verified) with `sslrootcert=CA.pem`, and `sslcert=` / `sslkey=` for a client
    /// certificate. Other query options (`connect_timeout`, ...) go to the client; errors never
    /// repeat the URL (it may hold a password).
    pub fn from_url(url: &str) -> Result<Self, BusError> {
        let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
        if !crate::SCHEMES.contains(&scheme) {
            return Err(BusError::invalid(
                "url",
                "expected postgres://USER:PASSWORD@HOST:PORT/DB (or postgresql://)",
            ));
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut schema = DEFAULT_SCHEMA.to_owned();
        let mut timeout = DEFAULT_TIMEOUT;
        let mut pool_size = DEFAULT_POOL_SIZE;
        let mut passed = Vec::new();
        let (mut tls_wanted, mut ca, mut cert, mut key) = (None, None, None, None);
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "schema" => schema = value.to_owned(),
                "timeout_ms" => {
                    let ms = value
                        .parse::<u64>()
                        .ok()
                        .filter(|ms| *ms > 0)
                        .ok_or_else(|| {
                            BusError::invalid(
                                "timeout_ms",
                                "must be a positive number of milliseconds",
                            )
                        })?;
                    timeout = Duration::from_millis(ms);
                }
                "pool_size" => {
                    pool_size = value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=256).contains(n))
                        .ok_or_else(|| BusError::invalid("pool_size", "must be 1..=256"))?;
                }
                "sslmode" => match value {
                    "disable" | "prefer" => tls_wanted = Some(false),
                    "require" | "verify-ca" | "verify-full" => tls_wanted = Some(true),
                    other => {
                        return Err(BusError::invalid(
                            "sslmode",
                            format!("{other:?}: use disable, require, verify-ca or verify-full"),
                        ));
                    }
                },
                "sslrootcert" => ca = Some(PathBuf::from(value)),
                "sslcert" => cert = Some(PathBuf::from(value)),
                "sslkey" => key = Some(PathBuf::from(value)),
                _ => passed.push(pair),
            }
        }
        let client_url = if passed.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", passed.join("&"))
        };
        let mut config = tokio_postgres::Config::from_str(&client_url).map_err(|error| {
            BusError::invalid(
                "url",
                format!(
                    "not a postgres://USER:PASSWORD@HOST:PORT/DB URL ({})",
                    redact(&error.to_string(), base)
                ),
            )
        })?;
        if config.get_hosts().is_empty() {
            return Err(BusError::invalid("url", "names no host"));
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(timeout);
        }
        config.application_name("bus-postgres");
        let tls = match (tls_wanted.unwrap_or(ca.is_some()), ca) {
            (false, _) => None,
            (true, Some(ca)) => {
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
                Some(TlsFiles { ca, cert, key })
            }
            (true, None) => {
                return Err(BusError::invalid(
                    "sslrootcert",
                    "TLS needs sslrootcert=PATH: the CA (PEM) that signed the server's certificate",
                ));
            }
        };
        let options = Self {
            config,
            schema,
            timeout,
            pool_size,
            tls,
        };
        options.check()?;
        Ok(options)
    }

    /// Sets the schema.
    #[must_use]
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Sets the operation timeout (also the connect timeout).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.config.connect_timeout(timeout);
        self
    }

    pub(crate) fn check(&self) -> Result<(), BusError> {
        let schema = &self.schema;
        let first_ok = schema
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !first_ok
            || schema.len() > 63
            || !schema
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(BusError::invalid(
                "schema",
                format!("{schema:?} must match [A-Za-z_][A-Za-z0-9_]{{0,62}}"),
            ));
        }
        Ok(())
    }
}

/// `text` with the password part of `url` (if any) blanked out.
fn redact(text: &str, url: &str) -> String {
    let password = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, password)| password)
        .filter(|password| !password.is_empty());
    match password {
        Some(password) => text.replace(password, "<redacted>"),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_url_and_bus_options_and_hides_the_password() {
        let options = PostgresOptions::from_url(
            "postgres://bus:s3cret-pw@127.0.0.1:5433/busdb?schema=t_1&timeout_ms=1500&pool_size=3",
        )
        .unwrap();
        assert_eq!(options.schema, "t_1");
        assert_eq!(options.timeout, Duration::from_millis(1500));
        assert_eq!(options.pool_size, 3);
        assert_eq!(options.config.get_dbname(), Some("busdb"));
        assert_eq!(options.config.get_ports(), &[5433]);
        let shown = format!("{options:?}");
        assert!(!shown.contains("s3cret-pw"), "{shown}");
    }

    #[test]
    fn bad_urls_are_argument_errors_without_the_password() {
        for url in [
            "postgres://bus:s3cret-pw@127.0.0.1:5433/db?schema=a-b",
            "postgres://bus:s3cret-pw@127.0.0.1:5433/db?timeout_ms=0",
            "postgres://bus:s3cret-pw@127.0.0.1:5433/db?nosuch=1",
            "postgres://bus:s3cret-pw@127.0.0.1:notaport/db",
            "postgres://bus:s3cret-pw@127.0.0.1:5433/db?sslmode=require",
            "postgres://bus:s3cret-pw@127.0.0.1:5433/db?sslmode=allow",
        ] {
            let error = PostgresOptions::from_url(url).unwrap_err();
            assert!(
                matches!(error, BusError::InvalidArgument { .. }),
                "{error:?}"
            );
            assert!(!error.to_string().contains("s3cret-pw"), "{error}");
            assert!(!format!("{error:?}").contains("s3cret-pw"), "{error:?}");
        }
    }
}
