//! How the `bus` command fails: one redacted line on stderr and an exit code
//! per class of failure.

use bus::BusError;

use super::redact::{one_line, redact};

/// The exit codes, as `--help` and the README list them.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  other backend failure (I/O, broker error)
  2  bad usage or bad input (arguments, JSON, a record too large or too deep)
  3  unknown topic or partition
  4  not found (find: no record with that UID; profile: no such profile)
  5  conflict (the backend holds a topic that differs from the manifest)
  6  unavailable or timed out (broker down, data directory locked, consumer owned by another instance)
  7  integrity (a record failed its checksum or authentication tag)";

/// A failure of one command.
#[derive(Debug)]
pub enum Failure {
    /// A bus operation failed.
    Bus(BusError),
    /// What was looked for is not there (exit 4).
    NotFound(String),
    /// Bad input the command found itself, with what it already did (exit 2).
    BadInput(String),
    /// A bus operation failed after part of the work was done: the error's
    /// class, and what was done before it.
    Stopped {
        /// The failure (boxed: it keeps `Failure` small).
        error: Box<BusError>,
        /// What had been done (e.g. which stdin lines were stored).
        done: String,
    },
}

impl From<BusError> for Failure {
    fn from(error: BusError) -> Self {
        Self::Bus(error)
    }
}

impl From<std::io::Error> for Failure {
    fn from(error: std::io::Error) -> Self {
        Self::Bus(BusError::Io(error))
    }
}

impl From<serde_json::Error> for Failure {
    fn from(error: serde_json::Error) -> Self {
        Self::Bus(BusError::Serde(error))
    }
}

/// The exit code of a bus error's class.
pub fn exit_code(error: &BusError) -> u8 {
    match error {
        BusError::InvalidArgument { .. }
        | BusError::FeatureDisabled { .. }
        | BusError::TooLarge { .. }
        | BusError::TooDeep { .. }
        | BusError::ReadOnly { .. }
        | BusError::Unsupported { .. } => 2,
        BusError::UnknownTopic(_) | BusError::UnknownPartition { .. } => 3,
        BusError::Conflict { .. } => 5,
        BusError::Timeout { .. }
        | BusError::Unavailable { .. }
        | BusError::Locked { .. }
        // Another instance owns the consumer, or took it over (C23): like
        // a locked directory, it goes once that instance is done.
        | BusError::ConsumerBusy { .. }
        | BusError::Fenced { .. } => 6,
        BusError::Integrity { .. } | BusError::Corrupt { .. } => 7,
        _ => 1,
    }
}

impl Failure {
    /// The process exit code.
    pub fn code(&self) -> u8 {
        match self {
            Self::Bus(error) => exit_code(error),
            Self::Stopped { error, .. } => exit_code(error),
            Self::NotFound(_) => 4,
            Self::BadInput(_) => 2,
        }
    }

    /// The one stderr line, secrets removed.
    pub fn line(&self) -> String {
        let text = match self {
            Self::Bus(error) => error.to_string(),
            Self::NotFound(text) | Self::BadInput(text) => text.clone(),
            Self::Stopped { error, done } => format!("{error}; stopped there: {done}"),
        };
        format!("bus: {}", one_line(&redact(&text)))
    }

    /// Whether this is a closed stdout (`bus tail | head`), which is success.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Self::Bus(BusError::Io(error)) if error.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// Prints a warning line on stderr, redacted.
pub fn warn(text: &str) {
    eprintln!("bus: {}", one_line(&redact(text)));
}
