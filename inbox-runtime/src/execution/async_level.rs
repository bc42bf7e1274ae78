//! One transaction level on a diesel-async connection (a handler's, a
//! batch's): begun, committed or rolled back by the rules the blocking
//! runner follows, with the drop guard that marks the connection broken
//! when a future is dropped while the level is open.

use diesel::QueryResult;
use diesel::connection::TransactionManagerStatus;
use diesel_async::{AsyncConnection, TransactionManager};

use crate::error::InboxError;
use crate::execution::OpenTransactionGuard;
use crate::recovery::{Recovery, recovery};
use crate::scope::{Scope, either, report_after_failed_rollback};

/// A level of `scope` on a guarded connection.
pub(crate) struct AsyncLevel<'c, C: AsyncConnection> {
    guard: OpenTransactionGuard<'c, C>,
    /// Where the level sits, and its SQL.
    pub(crate) scope: Scope,
}

impl<'c, C: AsyncConnection> AsyncLevel<'c, C> {
    /// A level of `scope` on `conn`, not begun yet.
    pub(crate) fn new(conn: &'c mut C, scope: Scope) -> Self {
        AsyncLevel {
            guard: OpenTransactionGuard::new(conn),
            scope,
        }
    }

    /// The connection.
    pub(crate) fn conn(&mut self) -> &mut C {
        self.guard.conn()
    }

    /// Sends `BEGIN` (or the savepoint). Marked open first, so a
    /// cancellation while it is in flight also marks the connection broken.
    pub(crate) async fn begin(&mut self) -> Result<(), InboxError> {
        self.guard.set_open(true);
        let begun = self
            .guard
            .conn()
            .batch_execute(&self.scope.begin_sql())
            .await;
        if let Err(error) = begun {
            self.guard.set_open(false);
            return Err(error.into());
        }
        self.scope.entered(status(self.guard.conn()))?;
        Ok(())
    }

    /// Commits the level; on failure, rolls it back and says why it did not
    /// commit (the blocking runner's rules).
    pub(crate) async fn commit(&mut self) -> Result<(), InboxError> {
        let committed = self.end_level(Scope::commit_sql).await?;
        let Err(commit_error) = committed else {
            self.guard.set_open(false);
            return self
                .scope
                .left(status(self.guard.conn()))
                .map_err(Into::into);
        };
        let mut aborted = false;
        if recovery(&commit_error) != Recovery::Reconnect {
            if let Some(probe) = self.scope.aborted_probe_sql() {
                aborted = self.guard.conn().batch_execute(probe).await.is_err();
            }
        }
        let failed = self.scope.failed_commit(aborted, commit_error);
        Err(match self.roll_back().await {
            Ok(()) => failed,
            Err(rollback_error) => either(report_after_failed_rollback(failed, rollback_error)),
        })
    }

    /// Rolls back the level and whatever the body left open above it; a
    /// rollback that fails marks the connection broken.
    pub(crate) async fn roll_back(&mut self) -> Result<(), InboxError> {
        let rolled_back = self.end_level(Scope::rollback_sql).await?;
        self.guard.set_open(false);
        match rolled_back {
            Ok(()) => self
                .scope
                .left(status(self.guard.conn()))
                .map_err(Into::into),
            Err(error) => Err(self.scope.lose(status(self.guard.conn()), error)),
        }
    }

    /// Runs the statement `sql` writes (the level's commit or rollback):
    /// its result, or `Err` if the body ended the level itself.
    async fn end_level(
        &mut self,
        sql: fn(&Scope) -> std::borrow::Cow<'_, str>,
    ) -> Result<QueryResult<()>, InboxError> {
        if !self.scope.is_open(status(self.guard.conn()))? {
            return Err(self.ended_by_body());
        }
        Ok(self.guard.conn().batch_execute(&sql(&self.scope)).await)
    }

    /// The body ended the handler's level itself.
    fn ended_by_body(&mut self) -> InboxError {
        self.guard.set_open(false);
        self.scope.lose(
            status(self.guard.conn()),
            diesel::result::Error::NotInTransaction,
        )
    }
}

/// The transaction manager's status of a diesel-async connection.
pub(crate) fn status<C: AsyncConnection>(conn: &mut C) -> &mut TransactionManagerStatus {
    C::TransactionManager::transaction_manager_status_mut(conn)
}
