//! Pruning on `diesel-async` connections (feature `async`): the same batch
//! statement, transactions and report as the blocking [`Prune::run`].

use std::future::Future;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use diesel::QueryResult;
use diesel_async::{AsyncConnection, TransactionManager};

use super::{
    BatchProgress, BatchRun, NextHandler, Prune, PruneBatchStatement, PruneError, PruneReport, Step,
};
use crate::backend::InboxBackend;
use crate::execution::{OpenTransactionGuard, RetryPolicy};

impl Prune {
    /// [`run`](Prune::run) on an async connection: each batch in a
    /// transaction of its own, at `READ COMMITTED`, until caught up.
    ///
    /// The [`pause`](Prune::pause) is not applied (sleeping needs your async
    /// runtime): to space batches out, cap the run with
    /// [`max_batches`](Prune::max_batches) and sleep between runs. Dropping
    /// the future mid-batch leaves that batch's transaction open, so the
    /// connection is then marked broken (pools discard it, which rolls the
    /// batch back); batches already committed stay committed.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), Box<dyn std::error::Error>> {
    /// use inbox_runtime::{Prune, RetentionPolicy};
    ///
    /// let prune = Prune::new(RetentionPolicy::parse("7d", "2d")?).max_batches(20);
    /// // e.g. in a tokio task: loop { prune.run_async(&mut conn).await; sleep(interval).await }
    /// let report = prune.run_async(conn).await?;
    /// println!("{report}");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run_async<C>(&self, conn: &mut C) -> Result<PruneReport, PruneError>
    where
        C: AsyncConnection,
        C::Backend: InboxBackend,
    {
        self.run_async_with_progress(conn, |_| ControlFlow::Continue(()))
            .await
    }

    /// [`run_with_progress`](Prune::run_with_progress) on an async
    /// connection; see [`run_async`](Prune::run_async).
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::ops::ControlFlow;
    /// use inbox_runtime::{Prune, RetentionPolicy};
    ///
    /// let prune = Prune::new(RetentionPolicy::parse("7d", "2d")?);
    /// prune
    ///     .run_async_with_progress(conn, |batch| {
    ///         println!("{batch}");
    ///         ControlFlow::Continue(())
    ///     })
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run_async_with_progress<C, F>(
        &self,
        conn: &mut C,
        progress: F,
    ) -> Result<PruneReport, PruneError>
    where
        C: AsyncConnection,
        C::Backend: InboxBackend,
        F: FnMut(&BatchProgress<'_>) -> ControlFlow<()>,
    {
        self.run_async_pausing(conn, progress, |_| {
            std::future::ready(ControlFlow::Continue(()))
        })
        .await
    }

    /// The async driver of a [`BatchRun`]: `pause` is awaited between
    /// batches, where it may end the run, and before retrying one (without
    /// a runtime to sleep on, [`run_async`](Prune::run_async) does not
    /// pause; the tokio task does).
    pub(crate) async fn run_async_pausing<C, F, P, W>(
        &self,
        conn: &mut C,
        mut progress: F,
        mut pause: P,
    ) -> Result<PruneReport, PruneError>
    where
        C: AsyncConnection,
        C::Backend: InboxBackend,
        F: FnMut(&BatchProgress<'_>) -> ControlFlow<()>,
        P: FnMut(Duration) -> W,
        W: Future<Output = ControlFlow<()>>,
    {
        let mut run = BatchRun::start(
            self,
            C::TransactionManager::transaction_manager_status_mut(conn),
        )?;
        while let Some(step) = run.next_step() {
            match step {
                Step::Batch(statement) => {
                    let batch_started = Instant::now();
                    let rows = run_batch(conn, &statement, &mut pause)
                        .await
                        .map_err(|error| run.fail(error))?;
                    if let Some(wait) = run.record(rows, batch_started, &mut progress) {
                        if pause(wait).await.is_break() {
                            run.stop();
                        }
                    }
                }
                Step::FindHandler(NextHandler { after }) => {
                    let handler =
                        <C::Backend as InboxBackend>::next_prune_handler_async(conn, after)
                            .await
                            .map_err(|error| run.fail(error))?;
                    run.found(handler);
                }
            }
        }
        Ok(run.finish())
    }
}

/// One batch in a transaction of its own, tried again after a lock
/// conflict ([`RetryPolicy::BATCH`]).
async fn run_batch<C, P, W>(
    conn: &mut C,
    statement: &PruneBatchStatement<'_>,
    pause: &mut P,
) -> QueryResult<u64>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    P: FnMut(Duration) -> W,
    W: Future<Output = ControlFlow<()>>,
{
    let mut tries = RetryPolicy::BATCH.tries();
    loop {
        match run_batch_once(conn, statement).await {
            Err(error) => match tries.again(&error) {
                // A stop request does not cut the retry short: the batch
                // ends one way or the other.
                Some(wait) => {
                    let _ = pause(wait).await;
                }
                None => return Err(error),
            },
            done => return done,
        }
    }
}

async fn run_batch_once<C>(conn: &mut C, statement: &PruneBatchStatement<'_>) -> QueryResult<u64>
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
