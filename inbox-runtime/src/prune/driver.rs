//! The one driver of a batched pruning run, for blocking and async
//! connections alike: the batch loop (passes, the walk over handlers,
//! retries after a lock conflict, pauses, progress) is written once, as an
//! `async fn` generic over how a step executes ([`Execute`]). A blocking
//! connection executes each step before its future is first polled, so
//! [`block_ready`](crate::execution::block_ready) runs the whole loop in one
//! poll, without a runtime.

use std::future::Future;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use diesel::connection::{
    Connection, LoadConnection, TransactionManager, TransactionManagerStatus,
};
use diesel::{QueryResult, RunQueryDsl};

use super::run_state::{RunState, Step};
use super::{BatchProgress, Prune, PruneError, PruneReport};
use crate::backend::{InboxBackend, NextHandler, PruneBatchStatement};
use crate::execution::{RetryPolicy, leave_broken_if_unusable};
use crate::observe;

/// How the steps of a run execute on one connection.
pub(crate) trait Execute {
    /// The connection's transaction status (a run refuses to start inside
    /// a transaction).
    fn status(&mut self) -> &mut TransactionManagerStatus;

    /// One try of `statement`, in a transaction of its own at `READ
    /// COMMITTED`: the rows it deleted.
    fn batch(
        &mut self,
        statement: &PruneBatchStatement<'_>,
    ) -> impl Future<Output = QueryResult<u64>>;

    /// The first handler after `after` (see `InboxBackend::next_prune_handler`).
    fn next_handler(&mut self, after: &str) -> impl Future<Output = QueryResult<Option<String>>>;

    /// Waits `wait` between batches (or before retrying one); `Break`: the
    /// run is asked to stop.
    fn pause(&mut self, wait: Duration) -> impl Future<Output = ControlFlow<()>>;
}

/// Runs `prune` to the end (caught up, capped, or stopped by `progress` or a
/// pause), reporting every committed batch to `progress`. A failure that
/// left the connection unusable marks it broken
/// ([`leave_broken_if_unusable`]).
pub(crate) async fn drive<X, F>(
    prune: &Prune,
    exec: &mut X,
    progress: F,
) -> Result<PruneReport, PruneError>
where
    X: Execute,
    F: FnMut(&BatchProgress<'_>) -> ControlFlow<()>,
{
    let run = drive_once(prune, exec, progress).await;
    if let Err(error) = &run {
        leave_broken_if_unusable(exec.status(), error);
    }
    run
}

/// [`drive`], without its check of the connection after a failure.
async fn drive_once<X, F>(
    prune: &Prune,
    exec: &mut X,
    mut progress: F,
) -> Result<PruneReport, PruneError>
where
    X: Execute,
    F: FnMut(&BatchProgress<'_>) -> ControlFlow<()>,
{
    prune.check()?;
    let mut run = RunState::start(prune, exec.status())?;
    while let Some(step) = run.next_step() {
        match step {
            Step::Batch(statement) => {
                let batch_started = Instant::now();
                let rows = batch_with_retries(exec, &statement)
                    .await
                    .map_err(|error| run.fail(error))?;
                observe::pruned(statement.table().name(), statement.single_handler(), rows);
                if let Some(wait) = run.record(rows, batch_started, &mut progress) {
                    if exec.pause(wait).await.is_break() {
                        run.stop();
                    }
                }
            }
            Step::FindHandler(NextHandler { after }) => {
                let handler = exec
                    .next_handler(after)
                    .await
                    .map_err(|error| run.fail(error))?;
                run.found(handler);
            }
        }
    }
    let unregistered = if prune.warn_unregistered && !run.stopped() {
        unregistered_scopes(exec)
            .await
            .map_err(|error| run.fail(error))?
    } else {
        Vec::new()
    };
    observe::unregistered_scopes(&unregistered);
    let mut report = run.finish();
    report.unregistered_scopes = unregistered;
    Ok(report)
}

/// The scopes of `inbox_messages` that the program did not register (see
/// [`Prune::warn_unregistered`]): one index probe per scope. None when the
/// program registered no scope at all.
async fn unregistered_scopes<X: Execute>(exec: &mut X) -> QueryResult<Vec<String>> {
    let known = crate::registry::known_scopes();
    let mut unknown = Vec::new();
    if known.is_empty() {
        return Ok(unknown);
    }
    let mut after = String::new();
    while let Some(scope) = exec.next_handler(&after).await? {
        if !known.contains(&scope) {
            unknown.push(scope.clone());
        }
        after = scope;
    }
    Ok(unknown)
}

/// One batch, tried again after a lock conflict ([`RetryPolicy::BATCH`]). A
/// stop request does not cut the retry short: the batch ends one way or the
/// other.
async fn batch_with_retries<X: Execute>(
    exec: &mut X,
    statement: &PruneBatchStatement<'_>,
) -> QueryResult<u64> {
    let mut tries = RetryPolicy::BATCH.tries();
    loop {
        match exec.batch(statement).await {
            Err(error) => match tries.again(&error) {
                Some(wait) => {
                    let _ = exec.pause(wait).await;
                }
                None => return Err(error),
            },
            done => return done,
        }
    }
}

/// A run on a blocking connection; `pause` sleeps (and may end the run).
pub(crate) struct Blocking<'c, C, P> {
    pub(crate) conn: &'c mut C,
    pub(crate) pause: P,
}

impl<C, P> Execute for Blocking<'_, C, P>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    P: FnMut(Duration) -> ControlFlow<()>,
{
    fn status(&mut self) -> &mut TransactionManagerStatus {
        C::TransactionManager::transaction_manager_status_mut(self.conn)
    }

    fn batch(
        &mut self,
        statement: &PruneBatchStatement<'_>,
    ) -> impl Future<Output = QueryResult<u64>> {
        std::future::ready(batch_once(self.conn, statement))
    }

    fn next_handler(&mut self, after: &str) -> impl Future<Output = QueryResult<Option<String>>> {
        std::future::ready(<C::Backend as InboxBackend>::next_prune_handler(
            self.conn, after,
        ))
    }

    fn pause(&mut self, wait: Duration) -> impl Future<Output = ControlFlow<()>> {
        std::future::ready((self.pause)(wait))
    }
}

/// Runs the backend's SQL around a batch's transaction, blocking.
fn batch_once<C>(conn: &mut C, statement: &PruneBatchStatement<'_>) -> QueryResult<u64>
where
    C: Connection,
    C::Backend: InboxBackend,
{
    let before = <C::Backend as InboxBackend>::PRUNE_BEFORE_BEGIN_SQL;
    if !before.is_empty() {
        conn.batch_execute(before)?;
    }
    let rows = conn.transaction(|conn| {
        let after = <C::Backend as InboxBackend>::PRUNE_AFTER_BEGIN_SQL;
        if !after.is_empty() {
            conn.batch_execute(after)?;
        }
        statement.execute(conn)
    })?;
    Ok(rows as u64)
}

#[cfg(feature = "async")]
pub(crate) use self::asynchronous::Async;

#[cfg(feature = "async")]
mod asynchronous {
    use std::future::Future;
    use std::ops::ControlFlow;
    use std::time::Duration;

    use diesel::QueryResult;
    use diesel::connection::TransactionManagerStatus;
    use diesel_async::{AsyncConnection, TransactionManager};

    use super::Execute;
    use crate::backend::{InboxBackend, PruneBatchStatement};
    use crate::execution::OpenTransactionGuard;

    /// A run on a diesel-async connection; `pause` awaits (and may end the
    /// run).
    pub(crate) struct Async<'c, C, P> {
        pub(crate) conn: &'c mut C,
        pub(crate) pause: P,
    }

    impl<C, P, W> Execute for Async<'_, C, P>
    where
        C: AsyncConnection,
        C::Backend: InboxBackend,
        P: FnMut(Duration) -> W,
        W: Future<Output = ControlFlow<()>>,
    {
        fn status(&mut self) -> &mut TransactionManagerStatus {
            C::TransactionManager::transaction_manager_status_mut(self.conn)
        }

        fn batch(
            &mut self,
            statement: &PruneBatchStatement<'_>,
        ) -> impl Future<Output = QueryResult<u64>> {
            batch_once(self.conn, statement)
        }

        async fn next_handler(&mut self, after: &str) -> QueryResult<Option<String>> {
            <C::Backend as InboxBackend>::next_prune_handler_async(self.conn, after).await
        }

        fn pause(&mut self, wait: Duration) -> impl Future<Output = ControlFlow<()>> {
            (self.pause)(wait)
        }
    }

    /// Runs the backend's SQL around a batch's transaction. Dropping the
    /// future mid-batch marks the connection broken (see
    /// [`OpenTransactionGuard`]).
    async fn batch_once<C>(conn: &mut C, statement: &PruneBatchStatement<'_>) -> QueryResult<u64>
    where
        C: AsyncConnection,
        C::Backend: InboxBackend,
    {
        let before = <C::Backend as InboxBackend>::PRUNE_BEFORE_BEGIN_SQL;
        if !before.is_empty() {
            conn.batch_execute(before).await?;
        }
        let mut batch = OpenTransactionGuard::new(conn);
        batch.set_open(true);
        if let Err(error) = C::TransactionManager::begin_transaction(batch.conn()).await {
            batch.set_open(false);
            return Err(error);
        }
        let result = async {
            let after = <C::Backend as InboxBackend>::PRUNE_AFTER_BEGIN_SQL;
            if !after.is_empty() {
                batch.conn().batch_execute(after).await?;
            }
            diesel_async::RunQueryDsl::execute(*statement, batch.conn()).await
        }
        .await;
        let ended = match result {
            Ok(_) => C::TransactionManager::commit_transaction(batch.conn()).await,
            Err(_) => C::TransactionManager::rollback_transaction(batch.conn()).await,
        };
        batch.set_open(false);
        let rows = result?;
        ended?;
        Ok(rows as u64)
    }
}
