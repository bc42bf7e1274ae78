//! One transaction level on an executor (a handler's, a batch's, the short
//! transaction that records a failure): begun, committed or rolled back by
//! the one set of rules, blocking and async alike.

use diesel::QueryResult;

use super::executor::Executor;
use crate::error::InboxError;
use crate::error::Recovery;
use crate::recovery::recovery;
use crate::scope::{Scope, either, report_after_failed_rollback};

/// A level of a [`Scope`], begun and ended through an [`Executor`].
#[derive(Debug)]
pub(crate) struct Level {
    /// Where the level sits, and its SQL.
    pub(crate) scope: Scope,
}

impl Level {
    /// A handler's level on `exec`: the outermost transaction (bounded by
    /// the executor's idle limit) or a savepoint in the caller's. A broken
    /// connection is refused with `BrokenTransactionManager`.
    pub(crate) fn of_handler<X: Executor>(exec: &mut X) -> QueryResult<Level> {
        let idle_limit = exec.idle_limit();
        let scope = Scope::bounded::<X::Backend>(exec.status(), idle_limit)?;
        Ok(Level { scope })
    }

    /// The short transaction that records a failed attempt after the
    /// handler's level rolled back (never bounded: it sits idle for no one).
    pub(crate) fn short<X: Executor>(exec: &mut X) -> QueryResult<Level> {
        let scope = Scope::new::<X::Backend>(exec.status())?;
        Ok(Level { scope })
    }

    /// Whether this is the outermost transaction (no caller's around it).
    pub(crate) fn is_outermost(&self) -> bool {
        self.scope.is_outermost()
    }

    /// Sends `BEGIN` (or the savepoint). Marked open first, so a
    /// cancellation while it is in flight also marks the connection broken.
    pub(crate) async fn begin<X: Executor>(&self, exec: &mut X) -> Result<(), InboxError> {
        exec.set_open(true);
        if let Err(error) = exec.level_sql(&self.scope, &self.scope.begin_sql()).await {
            exec.set_open(false);
            return Err(error.into());
        }
        self.scope.entered(exec.status())?;
        Ok(())
    }

    /// Commits the level; on failure, rolls it back and says why it did not
    /// commit.
    pub(crate) async fn commit<X: Executor>(&self, exec: &mut X) -> Result<(), InboxError> {
        self.commit_with(exec, "").await
    }

    /// [`commit`](Self::commit), sending `statements` (each ending with
    /// `;`, see [`deferred`](super::deferred)) before the commit in the
    /// same round trip: one that fails fails the commit, and nothing
    /// commits.
    pub(crate) async fn commit_with<X: Executor>(
        &self,
        exec: &mut X,
        statements: &str,
    ) -> Result<(), InboxError> {
        if !self.scope.is_open(exec.status())? {
            return Err(self.ended_by_body(exec));
        }
        let commit_sql = self.scope.commit_sql();
        let sql = match statements {
            "" => commit_sql,
            statements => std::borrow::Cow::Owned(format!("{statements}{commit_sql}")),
        };
        let Err(commit_error) = exec.level_sql(&self.scope, &sql).await else {
            exec.set_open(false);
            return self.scope.left(exec.status()).map_err(Into::into);
        };
        if self.scope.is_outermost() && matches!(self.scope.is_open(exec.status()), Ok(false)) {
            // The failed COMMIT ended the transaction itself (PostgreSQL rolls
            // back a transaction whose COMMIT fails, and Diesel's blocking
            // connection saw it idle): nothing committed, nothing is left to
            // roll back, and the connection is sound.
            exec.set_open(false);
            return Err(self.scope.failed_commit(false, commit_error));
        }
        let mut aborted = false;
        // A statement sent before the commit reports its own failure (an
        // aborted transaction's included): the probe would take it for one
        // the body ignored.
        if statements.is_empty() && recovery(&commit_error) != Recovery::Reconnect {
            if let Some(probe) = self.scope.aborted_probe_sql() {
                aborted = exec.level_sql(&self.scope, probe).await.is_err();
            }
        }
        let failed = self.scope.failed_commit(aborted, commit_error);
        Err(match self.roll_back(exec).await {
            Ok(()) => failed,
            Err(rollback_error) => either(report_after_failed_rollback(failed, rollback_error)),
        })
    }

    /// Rolls back the level and whatever the body left open above it; a
    /// rollback that fails marks the connection broken.
    pub(crate) async fn roll_back<X: Executor>(&self, exec: &mut X) -> Result<(), InboxError> {
        if !self.scope.is_open(exec.status())? {
            return Err(self.ended_by_body(exec));
        }
        let rolled_back = exec
            .level_sql(&self.scope, &self.scope.rollback_sql())
            .await;
        exec.set_open(false);
        match rolled_back {
            Ok(()) => self.scope.left(exec.status()).map_err(Into::into),
            Err(error) => Err(self.scope.lose(exec.status(), error)),
        }
    }

    /// The body ended the handler's level itself: what it committed or
    /// rolled back cannot be told apart any more.
    fn ended_by_body<X: Executor>(&self, exec: &mut X) -> InboxError {
        exec.set_open(false);
        self.scope
            .lose(exec.status(), diesel::result::Error::NotInTransaction)
    }
}
