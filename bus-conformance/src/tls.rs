//! Throwaway certificates for the TLS tests of the broker backends: a CA of
//! the test's own, a server certificate for 127.0.0.1 and a client
//! certificate, all made with the `openssl` command.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// PEM files in one directory.
#[derive(Debug, Clone)]
pub struct Certificates {
    /// The CA certificate clients and servers trust.
    pub ca: PathBuf,
    /// The server's certificate (subjectAltName IP:127.0.0.1).
    pub server_cert: PathBuf,
    /// The server's private key (PKCS#8).
    pub server_key: PathBuf,
    /// The server's key followed by its certificate (a PEM keystore).
    pub server_bundle: PathBuf,
    /// A client certificate for mutual TLS.
    pub client_cert: PathBuf,
    /// The client's private key.
    pub client_key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("openssl {}: {e}", args[0]));
    assert!(status.success(), "openssl {args:?} failed");
}

/// A key and a certificate signed by the CA in `dir`, named `name`.
fn signed(dir: &Path, name: &str, subject: &str, extensions: &str) {
    let (key, csr, cert, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", &key, "-out", &csr,
        ],
    );
    std::fs::write(dir.join(&ext), extensions).unwrap_or_else(|e| panic!("{ext}: {e}"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &cert,
        ],
    );
}

impl Certificates {
    /// Makes a CA, a server and a client certificate in `dir`.
    pub fn generate(dir: &Path) -> Self {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=bus test CA",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
            ],
        );
        signed(
            dir,
            "server",
            "/CN=127.0.0.1",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        signed(
            dir,
            "client",
            "/CN=bus test client",
            "extendedKeyUsage=clientAuth\n",
        );
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        std::fs::write(
            dir.join("server.pem"),
            read("server.key") + &read("server.crt"),
        )
        .unwrap_or_else(|e| panic!("server.pem: {e}"));
        Self {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            server_bundle: dir.join("server.pem"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
        }
    }
}
