//! How a relay's statements reach the database: the one seam between the
//! relay's round (written once, as an `async fn`) and a connection,
//! blocking or diesel-async.

use std::future::{Future, Ready, ready};
use std::time::Duration;

use diesel::QueryResult;
use diesel::connection::{LoadConnection, TransactionManager, TransactionManagerStatus};

use crate::backend::{Bind, InboxBackend, OutboxRow};
#[cfg(feature = "async")]
use crate::execution::OpenTransactionGuard;

/// A relay's statements, on one connection.
pub(crate) trait RelayExec {
    /// The backend the outbox's statements are written for.
    type Backend: InboxBackend;

    /// Diesel's transaction manager status of the connection.
    fn status(&mut self) -> &mut TransactionManagerStatus;

    /// Begins, commits or rolls back a transaction through Diesel's
    /// transaction manager.
    fn transaction(
        &mut self,
        step: TransactionStep,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// The outbox rows `sql` (a fixed statement, prepared once per
    /// connection) returns with `binds`.
    fn load(
        &mut self,
        sql: &'static str,
        binds: &[Bind<'_>],
    ) -> impl Future<Output = QueryResult<Vec<OutboxRow>>> + Send;

    /// Runs `sql` (built for this round: its text is parsed each time) with
    /// `binds`: the rows it affected.
    fn execute(
        &mut self,
        sql: &str,
        binds: &[Bind<'_>],
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Runs `sql` (a fixed statement, prepared once per connection) with
    /// `binds`: the rows it affected.
    fn execute_cached(
        &mut self,
        sql: &'static str,
        binds: &[Bind<'_>],
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Waits `wait` before a statement is tried again: the thread sleeps on
    /// a blocking connection, the task on an async one.
    fn pause(&mut self, wait: Duration) -> impl Future<Output = ()> + Send;

    /// `work`'s output, or `None` when it has not finished within `limit`
    /// (it is then dropped). On a blocking connection `work` is a blocking
    /// publisher's answer, ready when called: it is never cut short.
    fn within<T: Send>(
        &mut self,
        limit: Duration,
        work: impl Future<Output = T> + Send,
    ) -> impl Future<Output = Option<T>> + Send;
}

/// A step of a relay's own short transaction.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TransactionStep {
    Begin,
    Commit,
    Rollback,
}

/// A blocking connection: each step runs when called.
pub(crate) struct Blocking<'c, C> {
    conn: &'c mut C,
}

impl<'c, C> Blocking<'c, C> {
    pub(crate) fn new(conn: &'c mut C) -> Self {
        Blocking { conn }
    }
}

// Each step returns `Ready`: a blocking round completes in one poll.
#[allow(refining_impl_trait)]
impl<C> RelayExec for Blocking<'_, C>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    type Backend = C::Backend;

    fn status(&mut self) -> &mut TransactionManagerStatus {
        C::TransactionManager::transaction_manager_status_mut(self.conn)
    }

    fn transaction(&mut self, step: TransactionStep) -> Ready<QueryResult<()>> {
        ready(match step {
            TransactionStep::Begin => C::TransactionManager::begin_transaction(self.conn),
            TransactionStep::Commit => C::TransactionManager::commit_transaction(self.conn),
            TransactionStep::Rollback => C::TransactionManager::rollback_transaction(self.conn),
        })
    }

    fn load(
        &mut self,
        sql: &'static str,
        binds: &[Bind<'_>],
    ) -> Ready<QueryResult<Vec<OutboxRow>>> {
        ready(C::Backend::load_outbox_rows(self.conn, sql, binds))
    }

    fn execute(&mut self, sql: &str, binds: &[Bind<'_>]) -> Ready<QueryResult<usize>> {
        ready(C::Backend::execute_bound(self.conn, sql, binds))
    }

    fn execute_cached(
        &mut self,
        sql: &'static str,
        binds: &[Bind<'_>],
    ) -> Ready<QueryResult<usize>> {
        ready(C::Backend::execute_cached(self.conn, sql, binds))
    }

    fn pause(&mut self, wait: Duration) -> Ready<()> {
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        ready(())
    }

    async fn within<T: Send>(
        &mut self,
        _limit: Duration,
        work: impl Future<Output = T> + Send,
    ) -> Option<T> {
        Some(work.await)
    }
}

/// A diesel-async connection, guarded so that a round's future dropped
/// inside one of its transactions marks the connection broken: pools then
/// discard it (which rolls the transaction back on the server), and the
/// next round on a connection held by hand fails with
/// `BrokenTransactionManager` instead of nesting inside the abandoned
/// transaction.
#[cfg(feature = "async")]
pub(crate) struct Async<'c, C: diesel_async::AsyncConnection> {
    guard: OpenTransactionGuard<'c, C>,
}

#[cfg(feature = "async")]
impl<'c, C: diesel_async::AsyncConnection> Async<'c, C> {
    pub(crate) fn new(conn: &'c mut C) -> Self {
        Async {
            guard: OpenTransactionGuard::new(conn),
        }
    }
}

#[cfg(feature = "async")]
impl<C> RelayExec for Async<'_, C>
where
    C: diesel_async::AsyncConnection,
    C::Backend: InboxBackend,
{
    type Backend = C::Backend;

    fn status(&mut self) -> &mut TransactionManagerStatus {
        use diesel_async::TransactionManager;
        C::TransactionManager::transaction_manager_status_mut(self.guard.conn())
    }

    fn transaction(
        &mut self,
        step: TransactionStep,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        use diesel_async::TransactionManager;
        async move {
            // Open from before BEGIN is sent until COMMIT or ROLLBACK has
            // completed; a failed BEGIN opened nothing.
            self.guard.set_open(true);
            let result = match step {
                TransactionStep::Begin => {
                    C::TransactionManager::begin_transaction(self.guard.conn()).await
                }
                TransactionStep::Commit => {
                    C::TransactionManager::commit_transaction(self.guard.conn()).await
                }
                TransactionStep::Rollback => {
                    C::TransactionManager::rollback_transaction(self.guard.conn()).await
                }
            };
            // A failed COMMIT still has its ROLLBACK to come.
            let open = match step {
                TransactionStep::Begin => result.is_ok(),
                TransactionStep::Commit | TransactionStep::Rollback => result.is_err(),
            };
            self.guard.set_open(open);
            result
        }
    }

    fn load(
        &mut self,
        sql: &'static str,
        binds: &[Bind<'_>],
    ) -> impl Future<Output = QueryResult<Vec<OutboxRow>>> + Send {
        let conn = self.guard.conn();
        async move { C::Backend::load_outbox_rows_async(conn, sql, binds).await }
    }

    fn execute_cached(
        &mut self,
        sql: &'static str,
        binds: &[Bind<'_>],
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        let conn = self.guard.conn();
        async move { C::Backend::execute_cached_async(conn, sql, binds).await }
    }

    fn execute(
        &mut self,
        sql: &str,
        binds: &[Bind<'_>],
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        let conn = self.guard.conn();
        async move { C::Backend::execute_bound_async(conn, sql, binds).await }
    }

    fn pause(&mut self, wait: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(wait)
    }

    async fn within<T: Send>(
        &mut self,
        limit: Duration,
        work: impl Future<Output = T> + Send,
    ) -> Option<T> {
        tokio::time::timeout(limit, work).await.ok()
    }
}
