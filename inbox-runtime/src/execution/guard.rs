//! The one drop guard of the async paths: diesel-async cannot roll back
//! from a destructor, so a future dropped while its transaction is open
//! leaves that transaction on the connection. The guard marks the
//! connection's transaction manager broken then, so that nothing further
//! runs on it (a pool discards it, and the server rolls the transaction
//! back when the connection closes).

use diesel_async::{AsyncConnection, TransactionManager};

/// A connection borrowed for a transaction level (a handler's, a pruning
/// batch's) that a dropped future must not leave open unnoticed.
pub(crate) struct OpenTransactionGuard<'c, C: AsyncConnection> {
    conn: &'c mut C,
    /// Set from the moment the level's `BEGIN` is sent until its commit or
    /// rollback has completed.
    open: bool,
}

impl<'c, C: AsyncConnection> OpenTransactionGuard<'c, C> {
    /// Guards `conn`, no transaction level open yet.
    pub(crate) fn new(conn: &'c mut C) -> Self {
        OpenTransactionGuard { conn, open: false }
    }

    /// The guarded connection.
    pub(crate) fn conn(&mut self) -> &mut C {
        self.conn
    }

    /// Records that a level is being opened (set before its `BEGIN` is
    /// sent, so that a cancellation while it is in flight counts) or that it
    /// has ended (its commit or rollback completed, or its `BEGIN` failed).
    pub(crate) fn set_open(&mut self, open: bool) {
        self.open = open;
    }
}

impl<C: AsyncConnection> Drop for OpenTransactionGuard<'_, C> {
    fn drop(&mut self) {
        if self.open {
            C::TransactionManager::transaction_manager_status_mut(self.conn).set_in_error();
        }
    }
}
