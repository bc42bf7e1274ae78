//! Pruning on `diesel-async` connections (feature `async`): the same batch
//! statement, transactions and report as the blocking [`Prune::run`].

use std::ops::ControlFlow;
use std::time::Instant;

use diesel::result::DatabaseErrorKind;
use diesel::QueryResult;
use diesel_async::{AsyncConnection, TransactionManager};

use super::{run_progress, BatchProgress, Prune, PruneError, PruneReport, Step, BATCH_RETRIES};
use crate::backend::InboxBackend;
use crate::error::InboxError;
use crate::prune::PruneBatchStatement;

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
        mut progress: F,
    ) -> Result<PruneReport, PruneError>
    where
        C: AsyncConnection,
        C::Backend: InboxBackend,
        F: FnMut(&BatchProgress<'_>) -> ControlFlow<()>,
    {
        let started = Instant::now();
        let mut report = PruneReport::default();
        let fail = |report: &PruneReport, error: InboxError| {
            PruneError::new(
                PruneReport {
                    elapsed: started.elapsed(),
                    ..report.clone()
                },
                error,
            )
        };
        match C::TransactionManager::transaction_manager_status_mut(conn).transaction_depth() {
            Ok(None) => {}
            Ok(Some(_)) => {
                return Err(fail(
                    &report,
                    diesel::result::Error::AlreadyInTransaction.into(),
                ))
            }
            Err(error) => return Err(fail(&report, error.into())),
        }
        let statements = self.statements();
        'passes: for statement in &statements {
            loop {
                if self.max_batches.is_some_and(|max| report.batches >= max) {
                    break 'passes;
                }
                let batch_started = Instant::now();
                let rows = run_batch(conn, statement)
                    .await
                    .map_err(|error| fail(&report, error.into()))?;
                match run_progress(
                    &mut report,
                    statement,
                    rows,
                    batch_started,
                    started,
                    &mut progress,
                ) {
                    Step::Next => {}
                    Step::PassDone => break,
                    Step::Stop => break 'passes,
                }
            }
        }
        report.caught_up = report.passes_caught_up == statements.len() as u64;
        report.elapsed = started.elapsed();
        Ok(report)
    }
}

/// One batch in a transaction of its own, retried after a serialization
/// failure or deadlock.
async fn run_batch<C>(conn: &mut C, statement: &PruneBatchStatement<'_>) -> QueryResult<u64>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let mut attempt = 0;
    loop {
        match run_batch_once(conn, statement).await {
            Err(diesel::result::Error::DatabaseError(
                DatabaseErrorKind::SerializationFailure,
                _,
            )) if attempt < BATCH_RETRIES => {
                attempt += 1;
            }
            other => return other,
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
    let mut batch = OpenBatch { conn, open: true };
    if let Err(error) = C::TransactionManager::begin_transaction(batch.conn).await {
        batch.open = false;
        return Err(error);
    }
    let result = async {
        let after = <C::Backend as InboxBackend>::PRUNE_AFTER_BEGIN_SQL;
        if !after.is_empty() {
            batch.conn.batch_execute(after).await?;
        }
        diesel_async::RunQueryDsl::execute(*statement, batch.conn).await
    }
    .await;
    let ended = match result {
        Ok(_) => C::TransactionManager::commit_transaction(batch.conn).await,
        Err(_) => C::TransactionManager::rollback_transaction(batch.conn).await,
    };
    batch.open = false;
    let rows = result?;
    ended?;
    Ok(rows as u64)
}

/// Marks the connection broken if a batch's future is dropped while its
/// transaction is open (diesel-async does not roll back on drop).
struct OpenBatch<'c, C: AsyncConnection> {
    conn: &'c mut C,
    open: bool,
}

impl<C: AsyncConnection> Drop for OpenBatch<'_, C> {
    fn drop(&mut self) {
        if self.open {
            C::TransactionManager::transaction_manager_status_mut(self.conn).set_in_error();
        }
    }
}
