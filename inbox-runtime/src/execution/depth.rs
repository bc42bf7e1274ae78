//! The one way the runtime reads whether a transaction is open on a
//! connection, and how deep: Diesel's transaction manager status, which the
//! blocking and the async connections share.

use std::num::NonZeroU32;

use diesel::QueryResult;
use diesel::connection::TransactionManagerStatus;

/// Diesel's transaction depth (0: no transaction); a broken transaction
/// manager is `BrokenTransactionManager`.
pub(crate) fn depth(status: &mut TransactionManagerStatus) -> QueryResult<u32> {
    Ok(status.transaction_depth()?.map_or(0, NonZeroU32::get))
}

/// Refuses to go on outside a transaction (`NotInTransaction`): a claim
/// committed on its own, apart from the effects, is what the inbox exists
/// to prevent.
pub(crate) fn require_transaction(status: &mut TransactionManagerStatus) -> QueryResult<()> {
    match depth(status)? {
        0 => Err(diesel::result::Error::NotInTransaction),
        _ => Ok(()),
    }
}

/// Refuses to go on inside a transaction (`AlreadyInTransaction`): each
/// pruning batch must commit on its own.
pub(crate) fn require_no_transaction(status: &mut TransactionManagerStatus) -> QueryResult<()> {
    match depth(status)? {
        0 => Ok(()),
        _ => Err(diesel::result::Error::AlreadyInTransaction),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use diesel::connection::TransactionDepthChange;

    #[test]
    fn depth_and_requirements_follow_the_status() {
        let mut status = TransactionManagerStatus::default();
        assert_eq!(depth(&mut status).unwrap(), 0);
        assert!(matches!(
            require_transaction(&mut status),
            Err(diesel::result::Error::NotInTransaction)
        ));
        assert!(require_no_transaction(&mut status).is_ok());
        let TransactionManagerStatus::Valid(valid) = &mut status else {
            unreachable!("a new status is valid")
        };
        valid
            .change_transaction_depth(TransactionDepthChange::IncreaseDepth)
            .unwrap();
        assert_eq!(depth(&mut status).unwrap(), 1);
        assert!(require_transaction(&mut status).is_ok());
        assert!(matches!(
            require_no_transaction(&mut status),
            Err(diesel::result::Error::AlreadyInTransaction)
        ));
        status.set_in_error();
        assert!(matches!(
            depth(&mut status),
            Err(diesel::result::Error::BrokenTransactionManager)
        ));
    }
}
