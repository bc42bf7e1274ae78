//! The handlers this binary registers. Some are never called: a handler is
//! registered all the same.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};

use diesel::connection::LoadConnection;
use inbox_runtime::{InboxBackend, Outcome, StoredOutcome, idempotent};
use inbox_tests::AppError;

/// Bodies run, by every handler of this file but the shared ones.
pub static RUNS: AtomicU32 = AtomicU32::new(0);

/// Bodies run by the handlers of `registry.shared` (refused: none).
pub static SHARED_RUNS: AtomicU32 = AtomicU32::new(0);

fn ran<C>(_conn: &mut C) -> Result<Outcome<()>, AppError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(Outcome::Processed(()))
}

/// The line of `listed`'s attribute.
pub const LISTED_LINE: u32 = line!() + 1;
#[idempotent(id = id, handler = "registry.listed", max_attempts = 5, fingerprint = id)]
pub fn listed<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    id: &str,
) -> Result<Outcome<()>, AppError> {
    ran(conn)
}

/// A handler with the default scope (`module_path!()::name`).
#[idempotent(id = id, max_attempts = unbounded)]
pub fn defaulted<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    id: &str,
) -> Result<Outcome<()>, AppError> {
    ran(conn)
}

/// A method.
pub struct Ledger;

impl Ledger {
    #[idempotent(id = id, handler = "registry.method", store_result)]
    pub fn post<C: LoadConnection<Backend: InboxBackend>>(
        &self,
        conn: &mut C,
        id: &str,
    ) -> Result<StoredOutcome<()>, AppError> {
        let _ = ran(conn)?;
        Ok(StoredOutcome::Processed(()))
    }
}

/// An async handler.
#[cfg(feature = "async")]
#[idempotent(id = id, handler = "registry.async")]
pub async fn asynchronous<C>(conn: &mut C, id: &str) -> Result<Outcome<()>, AppError>
where
    C: diesel_async::AsyncConnection<Backend: InboxBackend>,
{
    ran(conn)
}

/// Two handlers of one scope, neither saying `shared_scope`: deliveries to
/// both are refused.
#[idempotent(id = id, handler = "registry.shared")]
pub fn shared_first<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    id: &str,
) -> Result<Outcome<()>, AppError> {
    SHARED_RUNS.fetch_add(1, Ordering::SeqCst);
    ran(conn)
}

/// See [`shared_first`].
#[idempotent(id = id, handler = "registry.shared")]
pub fn shared_second<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    id: &str,
) -> Result<Outcome<()>, AppError> {
    SHARED_RUNS.fetch_add(1, Ordering::SeqCst);
    ran(conn)
}

/// Two versions of one handler, sharing their scope on purpose.
#[idempotent(id = id, handler = "registry.versions", shared_scope)]
pub fn version_one<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    id: &str,
) -> Result<Outcome<()>, AppError> {
    ran(conn)
}

/// See [`version_one`].
#[idempotent(id = id, handler = "registry.versions", shared_scope, max_attempts = 2)]
pub fn version_two<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    id: &str,
) -> Result<Outcome<()>, AppError> {
    ran(conn)
}
