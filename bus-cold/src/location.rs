//! Where a cold tier lives, as a topic's manifest names it: a URL without
//! secrets (`s3://BUCKET/PREFIX?endpoint=…&region=…`, `file:///DIR`,
//! `memory:`). S3 credentials come from the environment
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`) or the builder, never from
//! the URL, and `Debug`/`Display` never show them (C24; the CLI's secret rules).

use std::path::PathBuf;
use std::sync::Arc;

use bus_core::{BusError, Manifest, TopicSpec};
use object_store::ObjectStore;
use object_store::path::Path as StorePath;
use secrecy::{ExposeSecret, SecretString};

/// S3 (or an S3-compatible server such as SeaweedFS).
#[derive(Clone)]
pub struct S3Location {
    /// `http(s)://host:port` of an S3-compatible server; AWS itself when absent.
    pub endpoint: Option<String>,
    /// The bucket (it must exist: the cold tier never creates one, C2's spirit).
    pub bucket: String,
    /// The region (`us-east-1` unless told).
    pub region: String,
    /// Access key id; with the secret, requests are signed, else anonymous.
    pub access_key_id: Option<String>,
    /// Secret access key: kept in a [`SecretString`], never printed.
    pub secret_access_key: Option<SecretString>,
}

impl std::fmt::Debug for S3Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Location")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field(
                "access_key_id",
                &self.access_key_id.as_ref().map(|_| "<set>"),
            )
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Where a cold tier keeps its objects, and under which prefix.
#[derive(Debug, Clone)]
pub enum ColdLocation {
    /// A process-local in-memory store (tests, benchmarks).
    Memory,
    /// A directory of local files: the embedded default, no server needed.
    Local {
        /// The directory (created if missing).
        root: PathBuf,
    },
    /// An S3 bucket.
    S3 {
        /// Bucket, endpoint and credentials.
        s3: S3Location,
        /// Key prefix inside the bucket (may be empty).
        prefix: String,
    },
}

/// Every topic of `manifest` that declares a cold tier (`[topics.cold]`),
/// with its index in the manifest and its location parsed; a location that
/// does not parse is `InvalidArgument` on `topics[i].cold.location`.
pub fn declared_locations(
    manifest: &Manifest,
) -> Result<Vec<(usize, &TopicSpec, ColdLocation)>, BusError> {
    let mut declared = Vec::new();
    for (index, spec) in manifest.topics.iter().enumerate() {
        let Some(cold) = &spec.cold else {
            continue;
        };
        let location = ColdLocation::parse(&cold.location).map_err(|error| match error {
            BusError::InvalidArgument { reason, .. } => {
                BusError::invalid(format!("topics[{index}].cold.location"), reason)
            }
            other => other,
        })?;
        declared.push((index, spec, location));
    }
    Ok(declared)
}

impl ColdLocation {
    /// Parses `memory:`, `file:///DIR` (or a plain absolute path) and
    /// `s3://BUCKET[/PREFIX][?endpoint=URL&region=R]`; S3 credentials are
    /// read from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`. A URL that
    /// carries credentials (`user:pass@`, `secret=`) is refused, so a
    /// manifest never holds one.
    pub fn parse(url: &str) -> Result<Self, BusError> {
        let bad = |reason: &str| BusError::invalid("cold.location", reason.to_owned());
        if url == "memory:" {
            return Ok(Self::Memory);
        }
        if let Some(dir) = url.strip_prefix("file://") {
            return Ok(Self::Local {
                root: PathBuf::from(dir),
            });
        }
        if url.starts_with('/') {
            return Ok(Self::Local {
                root: PathBuf::from(url),
            });
        }
        let Some(rest) = url.strip_prefix("s3://") else {
            // Only the scheme is shown: the rest may hold what should not be.
            let scheme = url
                .split_once(':')
                .map_or("no scheme", |(scheme, _)| scheme);
            return Err(bad(&format!(
                "{scheme:?} is not a cold tier scheme: use memory:, file:///DIR or s3://BUCKET/PREFIX?endpoint=URL"
            )));
        };
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if path.contains('@') || query.contains("secret") || query.contains("password") {
            return Err(bad(
                "credentials do not go in the location; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
            ));
        }
        let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
        if bucket.is_empty() {
            return Err(bad("s3:// needs a bucket name"));
        }
        let mut s3 = S3Location {
            endpoint: None,
            bucket: bucket.to_owned(),
            region: "us-east-1".to_owned(),
            access_key_id: std::env::var("AWS_ACCESS_KEY_ID")
                .ok()
                .filter(|k| !k.is_empty()),
            secret_access_key: std::env::var("AWS_SECRET_ACCESS_KEY")
                .ok()
                .filter(|k| !k.is_empty())
                .map(SecretString::from),
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("endpoint", value)) => s3.endpoint = Some(value.to_owned()),
                Some(("region", value)) => s3.region = value.to_owned(),
                _ => {
                    return Err(bad(&format!(
                        "unknown parameter {pair:?}; known: endpoint, region"
                    )));
                }
            }
        }
        Ok(Self::S3 {
            s3,
            prefix: prefix.trim_matches('/').to_owned(),
        })
    }

    /// The store and the prefix of this location.
    pub(crate) fn open(&self) -> Result<(Arc<dyn ObjectStore>, StorePath), BusError> {
        let failed = |what: &str, error: object_store::Error| {
            BusError::invalid(
                "cold.location",
                format!("{what}: {}", crate::store::describe(&error)),
            )
        };
        match self {
            Self::Memory => Ok((
                Arc::new(object_store::memory::InMemory::new()),
                StorePath::default(),
            )),
            Self::Local { root } => {
                std::fs::create_dir_all(root)?;
                let store = object_store::local::LocalFileSystem::new_with_prefix(root)
                    .map_err(|e| failed(&format!("directory {}", root.display()), e))?;
                Ok((Arc::new(store), StorePath::default()))
            }
            Self::S3 { s3, prefix } => {
                let mut builder = object_store::aws::AmazonS3Builder::new()
                    .with_bucket_name(&s3.bucket)
                    .with_region(&s3.region)
                    // Bounded waits (C10): the executor bounds each call,
                    // and the client gives up on a dead endpoint early.
                    .with_client_options(
                        object_store::ClientOptions::new()
                            .with_connect_timeout(std::time::Duration::from_secs(3))
                            .with_timeout(std::time::Duration::from_secs(30)),
                    )
                    .with_retry(object_store::RetryConfig {
                        max_retries: 3,
                        retry_timeout: std::time::Duration::from_secs(8),
                        ..Default::default()
                    });
                if let Some(endpoint) = &s3.endpoint {
                    builder = builder
                        .with_endpoint(endpoint)
                        .with_allow_http(endpoint.starts_with("http://"))
                        // path-style (http://host/bucket/key): what S3-compatible servers serve
                        .with_virtual_hosted_style_request(false);
                }
                match (&s3.access_key_id, &s3.secret_access_key) {
                    (Some(id), Some(secret)) => {
                        builder = builder
                            .with_access_key_id(id)
                            .with_secret_access_key(secret.expose_secret());
                    }
                    // No credentials: anonymous requests (a loopback SeaweedFS
                    // without identities), not a hunt for instance credentials.
                    _ => builder = builder.with_skip_signature(true),
                }
                let store = builder
                    .build()
                    .map_err(|e| failed(&format!("bucket {}", s3.bucket), e))?;
                Ok((Arc::new(store), StorePath::from(prefix.as_str())))
            }
        }
    }
}

impl std::fmt::Display for ColdLocation {
    /// The location as a manifest would name it: no credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Memory => f.write_str("memory:"),
            Self::Local { root } => write!(f, "file://{}", root.display()),
            Self::S3 { s3, prefix } => {
                write!(f, "s3://{}/{prefix}", s3.bucket)?;
                match &s3.endpoint {
                    Some(endpoint) => write!(f, "?endpoint={endpoint}&region={}", s3.region),
                    None => write!(f, "?region={}", s3.region),
                }
            }
        }
    }
}
