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
        _ => BusError::unavailable(BACKEND, format!("{what}: {error}")),
    }
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
