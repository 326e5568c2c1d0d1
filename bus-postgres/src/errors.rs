//! The one place client and pool failures become [`BusError`]s.

use bus_core::BusError;
use deadpool_postgres::PoolError;

pub(crate) const BACKEND: &str = "postgres";

/// A client error: a lost or refused connection is `Unavailable` (the caller
/// may retry once the server is back); an error the server reported is a
/// backend error naming `what`. Neither carries the password: the client
/// never puts it in its errors.
pub(crate) fn pg(what: &str, error: &tokio_postgres::Error) -> BusError {
    match error.as_db_error() {
        Some(db) if !is_shutdown(db.code()) => {
            let message = format!("{what}: {} ({})", db.message(), db.code().code());
            BusError::backend_caused("postgres", message, db.clone())
        }
        Some(db) => BusError::unavailable_caused(BACKEND, format!("{what}: {error}"), db.clone()),
        None => match io_cause(error) {
            Some(io) => BusError::unavailable_caused(BACKEND, format!("{what}: {error}"), io),
            None => BusError::unavailable(BACKEND, format!("{what}: {error}")),
        },
    }
}

/// The OS error under a client error (a refused or reset connection), as
/// an owned copy of its kind and text: the client's error cannot be cloned.
fn io_cause(error: &tokio_postgres::Error) -> Option<std::io::Error> {
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause {
        if let Some(io) = inner.downcast_ref::<std::io::Error>() {
            return Some(std::io::Error::new(io.kind(), io.to_string()));
        }
        cause = inner.source();
    }
    None
}

/// Server states that mean "not now" rather than "not this way".
fn is_shutdown(code: &tokio_postgres::error::SqlState) -> bool {
    use tokio_postgres::error::SqlState;
    [
        SqlState::ADMIN_SHUTDOWN,
        SqlState::CRASH_SHUTDOWN,
        SqlState::CANNOT_CONNECT_NOW,
        SqlState::TOO_MANY_CONNECTIONS,
        SqlState::T_R_SERIALIZATION_FAILURE,
        SqlState::T_R_DEADLOCK_DETECTED,
    ]
    .contains(code)
}

/// A pool error: every kind means no connection could be had in time.
pub(crate) fn pool(error: PoolError) -> BusError {
    match error {
        PoolError::Backend(error) => pg("connect", &error),
        other => {
            let reason = format!("no database connection: {other}");
            BusError::unavailable_caused(BACKEND, reason, other)
        }
    }
}
