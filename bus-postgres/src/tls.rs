//! TLS to the server (rustls), from libpq's URL options: `sslmode=require`
//! (or `verify-ca` / `verify-full`, the same here: the server's certificate
//! and name are always verified) with `sslrootcert=CA.pem`, and
//! `sslcert=` / `sslkey=` for a client certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bus_core::BusError;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The files of a TLS connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificates (PEM) the server's certificate must chain to.
    pub ca: PathBuf,
    /// Client certificate chain (PEM), for servers that ask for one.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub key: Option<PathBuf>,
}

fn unreadable(field: &str, path: &Path, error: impl std::fmt::Display) -> BusError {
    BusError::invalid(field, format!("cannot read {}: {error}", path.display()))
}

/// The connector for `files`.
pub(crate) fn connector(files: &TlsFiles) -> Result<MakeRustlsConnect, BusError> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(&files.ca)
        .map_err(|e| unreadable("sslrootcert", &files.ca, e))?;
    for cert in certs {
        let cert = cert.map_err(|e| unreadable("sslrootcert", &files.ca, e))?;
        roots
            .add(cert)
            .map_err(|e| unreadable("sslrootcert", &files.ca, e))?;
    }
    if roots.is_empty() {
        return Err(BusError::invalid(
            "sslrootcert",
            format!("{} holds no certificate", files.ca.display()),
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| BusError::backend_caused("postgres", format!("TLS setup: {e}"), e))?
        .with_root_certificates(roots);
    let config = match (&files.cert, &files.key) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .map_err(|e| unreadable("sslcert", cert, e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| unreadable("sslcert", cert, e))?;
            let key =
                PrivateKeyDer::from_pem_file(key).map_err(|e| unreadable("sslkey", key, e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| BusError::invalid("sslcert", format!("rejected: {e}")))?
        }
        _ => {
            return Err(BusError::invalid(
                "sslcert",
                "sslcert and sslkey go together: give both or neither",
            ));
        }
    };
    Ok(MakeRustlsConnect::new(config))
}
