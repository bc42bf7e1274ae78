//! A connection that a failure left unusable for good, though it is still
//! open, is marked broken: Diesel's transaction manager is put in error, so
//! that its pool (r2d2, deadpool, bb8: each asks the transaction manager)
//! discards it, and a caller holding it by hand gets
//! `BrokenTransactionManager` ([`Recovery::Reconnect`](crate::Recovery::Reconnect))
//! at once instead of the same failure on every later statement. A pool's
//! own check (`SELECT 1`) cannot see such a connection.

use std::error::Error as StdError;

use diesel::connection::TransactionManagerStatus;

use crate::recovery::statements_lost;

/// Marks the connection whose transaction manager is `status` broken when
/// `error` says its prepared statements are not the server's (see
/// [`statements_lost`]).
pub(crate) fn leave_broken_if_unusable(
    status: &mut TransactionManagerStatus,
    error: &(dyn StdError + 'static),
) {
    if statements_lost(error) {
        status.set_in_error();
    }
}
