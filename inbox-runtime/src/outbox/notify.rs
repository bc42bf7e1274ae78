//! Commit notifications for relays that wake on commit (PostgreSQL): the
//! trigger that makes a transaction recording outgoing messages notify the
//! channel `inbox_outbox` when it commits.

use diesel::PgConnection;
use diesel::connection::SimpleConnection;

use crate::backend::postgres::{DISABLE_OUTBOX_NOTIFY_SQL, ENABLE_OUTBOX_NOTIFY_SQL};
use crate::error::InboxError;

/// Makes every transaction that records outgoing messages notify the
/// channel `inbox_outbox` when it commits (a statement trigger on
/// `inbox_outbox`; never on a rollback), which a relay with
/// [`wake_on_commit`](super::BackgroundRelay::wake_on_commit) listens on.
/// A relay's round that puts back messages the broker did not confirm
/// (PostgreSQL's relay deletes what it leases) records nothing new and
/// notifies nobody. Such a relay runs this itself when it connects; run it
/// yourself (once, like [`setup`](crate::setup)) when the relay's role may
/// not create triggers on the table. Running it again changes nothing and
/// takes no lock; on an outbox whose notifying function an earlier version
/// created (which notified on put-backs too), it replaces that function,
/// and the trigger stays.
///
/// Not part of the schema by default, because it has a price: PostgreSQL
/// serializes the commits of notifying transactions across the whole
/// cluster (a lock each holds while it commits), so with it, the handlers
/// that record messages commit one at a time. Without a listening relay,
/// leave it off ([`disable_commit_notifications`]).
///
/// ```no_run
/// # fn f(conn: &mut diesel::PgConnection) -> Result<(), inbox_runtime::InboxError> {
/// inbox_runtime::outbox::enable_commit_notifications(conn)?;
/// # Ok(())
/// # }
/// ```
pub fn enable_commit_notifications(conn: &mut PgConnection) -> Result<(), InboxError> {
    conn.batch_execute(ENABLE_OUTBOX_NOTIFY_SQL)?;
    Ok(())
}

/// Undoes [`enable_commit_notifications`]: commits no longer notify.
///
/// ```no_run
/// # fn f(conn: &mut diesel::PgConnection) -> Result<(), inbox_runtime::InboxError> {
/// inbox_runtime::outbox::disable_commit_notifications(conn)?;
/// # Ok(())
/// # }
/// ```
pub fn disable_commit_notifications(conn: &mut PgConnection) -> Result<(), InboxError> {
    conn.batch_execute(DISABLE_OUTBOX_NOTIFY_SQL)?;
    Ok(())
}
