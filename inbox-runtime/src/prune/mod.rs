//! Pruning: forgetting ids older than the retention window, without getting
//! in the way of live handlers.
//!
//! An inbox grows by one row per message (1,000 msg/s kept for 7 days is
//! ~600M rows), so old ids must be removed, and the way they are removed
//! matters as much as when:
//!
//! - **The database clock decides.** A row is expired when its `received_at`
//!   (written by the database) is older than the window by the database's
//!   `now()`; application servers' clocks never enter into it.
//! - **Bounded batches, each its own short transaction.** One unbounded
//!   `DELETE` locks millions of rows for minutes and bloats the WAL/undo; a
//!   batch of a few thousand rows commits in milliseconds.
//! - **Never wait on a live handler.** On PostgreSQL and MySQL/MariaDB the
//!   batch picks its rows with `FOR UPDATE SKIP LOCKED`, walking an index
//!   oldest first and stopping at the batch size, so it reads and locks no
//!   more rows than it deletes (on InnoDB, a batch that reaches the end of
//!   its scope also holds the index entry that ends it, the scope's next
//!   row, until it commits): rows another transaction holds are left for
//!   the next run, so several pruners (one per node) and live handlers never
//!   block each other. A row claimed by a transaction that is still open is
//!   invisible or locked, so it is never removed.
//! - **Each scope walks its own index.** Every handler at once: the
//!   `received_at` index. One handler (a window of its own, or
//!   [`RetentionPolicy::only`]): `(handler, received_at)`, which holds that
//!   handler's rows only. Everybody but the handlers with windows of their
//!   own: the handlers one by one, each found by one index probe and pruned
//!   through `(handler, received_at)`, so the excluded handlers' rows
//!   (however many are kept by their longer windows) are never read.
//! - **`READ COMMITTED`.** Each batch runs at that isolation level whatever
//!   the session's default, which on InnoDB also means no gap locks that
//!   could block inserts of new claims.
//!
//! # Tuning
//!
//! The batch size and the pause between batches trade pruning speed for the
//! latency of live handlers; `benches/prune.rs` measures both (the figures,
//! with the machine, date and command, are in `BENCHMARKS.md` at the root of
//! the repository).
//!
//! - Flat out (the default: batches of [`DEFAULT_BATCH_SIZE`], no pause),
//!   pruning competes with live handlers for the processors and raises their
//!   tail latency while it runs, whatever the batch size: right for catching
//!   up on a backlog, from cron or off-peak.
//! - Paced (small batches with a pause, e.g. 500 rows and 100 ms, about
//!   5,000 rows/s: five times the insert rate of a 1,000 msg/s service), it
//!   leaves the handlers' latency unchanged: the setting for a background
//!   pruner next to live traffic.
//! - Dropping generations (the `partitioned` layout) avoids the cost almost
//!   entirely.
//!
//! A pruner only has to keep up with the insert rate (1,000 msg/s is 1,000
//! rows/s), so a latency-sensitive service can prune in small batches with a
//! pause, and leave catching up on a backlog to the default, from cron.
//!
//! Ways to run it:
//! - [`Prune::run`] on a connection, e.g. from cron via the `prune` example
//!   (`cargo run --example prune -- --older-than 7d`);
//! - `BackgroundPruner`: pruning on an interval over a pool, every run
//!   reported to a callback, failures retried (with a backoff when the
//!   interval is short), stopped by its handle: `spawn` (feature `r2d2`) on
//!   a thread of its own, `spawn_task` (feature `tokio`) as a tokio task over
//!   a diesel-async deadpool or bb8 pool;
//! - `Prune::run_async` (feature `async`) on a diesel-async connection, for
//!   a task of your own;
//! - on PostgreSQL at scale, the `partitioned` layout, which drops whole
//!   generations of ids instead of deleting rows.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use diesel::prelude::*;
//! use inbox_runtime::{Prune, RetentionPolicy};
//!
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! inbox_runtime::setup(&mut conn)?;
//! diesel::sql_query(
//!     "INSERT INTO inbox_messages (handler, message_id, received_at) VALUES \
//!      ('h', 'old', '2000-01-01 00:00:00.000'), ('h', 'new', strftime('%Y-%m-%d %H:%M:%f', 'now'))",
//! )
//! .execute(&mut conn)?;
//!
//! let policy = RetentionPolicy::parse("7d", "2d")?;
//! let report = Prune::new(policy).batch_size(1000).run(&mut conn)?;
//! assert_eq!(report.rows_deleted, 1);
//! assert!(report.caught_up);
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ops::ControlFlow;
use std::time::Duration;

use diesel::connection::LoadConnection;

use crate::backend::InboxBackend;
use crate::error::InboxError;
use crate::key::HandlerName;
use crate::retention::RetentionPolicy;

mod driver;
#[cfg(feature = "partitioned")]
pub mod partitioned;
mod report;
mod run_state;
#[cfg(any(feature = "r2d2", feature = "tokio"))]
mod scheduler;
#[cfg(feature = "tokio")]
mod task;
#[cfg(feature = "r2d2")]
mod thread;

#[doc(hidden)]
pub use crate::backend::PruneBatchStatement;
pub use crate::backend::{PruneScope, PrunedTable};
pub use report::{BatchProgress, PruneError, PruneReport};
#[cfg(any(feature = "r2d2", feature = "tokio"))]
pub use scheduler::{BackgroundPruner, MAX_RETRY_BACKOFF, PrunerRun, PrunerRunError};
#[cfg(feature = "r2d2")]
pub use scheduler::{PruneJob, StopSignal};

/// The default number of rows a batch deletes.
///
/// Large enough that the per-batch overhead (a transaction, an index descent)
/// is small, small enough that a batch commits in milliseconds.
///
/// ```
/// assert_eq!(inbox_runtime::prune::DEFAULT_BATCH_SIZE, 5_000);
/// ```
pub const DEFAULT_BATCH_SIZE: u32 = 5_000;

/// The largest batch accepted. Bigger batches hold more row locks for longer
/// and defeat the purpose of batching.
///
/// ```
/// assert_eq!(inbox_runtime::prune::MAX_BATCH_SIZE, 100_000);
/// ```
pub const MAX_BATCH_SIZE: u32 = 100_000;

/// A pruning job: a [`RetentionPolicy`] plus how to apply it (batch size,
/// pause between batches, a cap on batches per run).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use std::time::Duration;
/// use diesel::prelude::*;
/// use inbox_runtime::{Prune, RetentionPolicy};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let prune = Prune::new(RetentionPolicy::parse("7d", "1d")?)
///     .batch_size(2_000)
///     .pause(Duration::from_millis(5))
///     .max_batches(100);
/// let report = prune.run(&mut conn)?;
/// assert_eq!(report.rows_deleted, 0);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Prune {
    policy: RetentionPolicy,
    /// Handlers with their own window, excluded from the default pass.
    except: Vec<HandlerName>,
    batch_size: u32,
    max_batches: Option<u64>,
    pause: Duration,
    /// The tables pruned, in order.
    tables: &'static [PrunedTable],
    /// Whether a run reports the scopes in the inbox that no registered
    /// handler declares.
    warn_unregistered: bool,
}

/// Every table: the claims first, the outbox's sent messages last.
const ALL_TABLES: &[PrunedTable] = &[
    PrunedTable::Claims,
    PrunedTable::Failures,
    PrunedTable::Outbox,
];

impl Prune {
    /// Pruning by `policy`, [`DEFAULT_BATCH_SIZE`] rows at a time, no pause,
    /// until caught up.
    ///
    /// ```
    /// # use inbox_runtime::{Prune, RetentionPolicy};
    /// let prune = Prune::new(RetentionPolicy::parse("7d", "1d")?);
    /// assert_eq!(prune.policy().keep().as_secs(), 7 * 86_400);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn new(policy: RetentionPolicy) -> Self {
        let except = policy
            .handler_windows()
            .iter()
            .map(|(h, _)| h.clone())
            .collect();
        Prune {
            policy,
            except,
            batch_size: DEFAULT_BATCH_SIZE,
            max_batches: None,
            pause: Duration::ZERO,
            tables: ALL_TABLES,
            warn_unregistered: true,
        }
    }

    /// Whether a run looks for scopes in the inbox that no handler of the
    /// program declares (on by default): handlers renamed or removed, whose
    /// old ids are kept until their window passes, or forgotten ones. After
    /// its batches, a run walks the distinct scopes of `inbox_messages` (one
    /// index probe each) and compares them with the
    /// [`registry`](crate::registry) (the `#[idempotent]` handlers linked
    /// into the program, and the scopes given to
    /// [`registry::register_scope`](crate::registry::register_scope)); the
    /// ones it does not know are in [`PruneReport::unregistered_scopes`] and
    /// reported once per run as a warning (the `inbox.unregistered_scopes`
    /// event with feature `tracing`, and through `log` with feature `log`).
    ///
    /// A program that registered no scope at all (a pruner of its own,
    /// without the handlers linked in) is not checked, nor is a run stopped
    /// early. Turn it off for a pruner that serves several programs.
    ///
    /// ```
    /// # use inbox_runtime::{Prune, RetentionPolicy};
    /// let prune = Prune::new(RetentionPolicy::parse("7d", "1d")?).warn_unregistered(false);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn warn_unregistered(mut self, warn: bool) -> Self {
        self.warn_unregistered = warn;
        self
    }

    /// Prunes `inbox_failures` and the outbox only (the generation layout
    /// drops claims by partition and prunes the other tables with batches).
    #[cfg(feature = "partitioned")]
    pub(crate) fn failures_only(mut self) -> Self {
        self.tables = &[PrunedTable::Failures, PrunedTable::Outbox];
        self
    }

    /// Rows per batch, between 1 and [`MAX_BATCH_SIZE`]; anything else is
    /// refused by [`check`](Self::check), and so by every run, as
    /// [`InboxError::InvalidBatchSize`].
    ///
    /// ```
    /// # use inbox_runtime::{Prune, RetentionPolicy};
    /// let prune = Prune::new(RetentionPolicy::parse("7d", "1d")?);
    /// assert!(prune.clone().batch_size(500).check().is_ok());
    /// assert!(prune.batch_size(0).check().is_err());
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn batch_size(mut self, rows: u32) -> Self {
        self.batch_size = rows;
        self
    }

    /// Checks the settings: the batch size, and the policy's windows (see
    /// [`RetentionPolicy::check`]). Every run checks them first; call it to
    /// refuse a bad configuration when it is read.
    ///
    /// ```
    /// use inbox_runtime::{InboxError, Prune, RetentionPolicy};
    ///
    /// let prune = Prune::new(RetentionPolicy::parse("7d", "1d")?).batch_size(100_001);
    /// assert!(matches!(prune.check(), Err(InboxError::InvalidBatchSize { requested: 100_001, .. })));
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn check(&self) -> Result<(), InboxError> {
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return Err(InboxError::InvalidBatchSize {
                requested: self.batch_size,
                max: MAX_BATCH_SIZE,
            });
        }
        self.policy.check()
    }

    /// Sleeps this long between batches, leaving the database to live
    /// traffic; zero (the default) runs batches back to back.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use inbox_runtime::{Prune, RetentionPolicy};
    /// let prune = Prune::new(RetentionPolicy::parse("7d", "1d")?).pause(Duration::from_millis(20));
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// Stops a run after this many batches (the report then says it is not
    /// caught up); `0` removes the cap.
    ///
    /// ```
    /// # use inbox_runtime::{Prune, RetentionPolicy};
    /// let prune = Prune::new(RetentionPolicy::parse("7d", "1d")?).max_batches(20);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn max_batches(mut self, batches: u64) -> Self {
        self.max_batches = (batches > 0).then_some(batches);
        self
    }

    /// The policy applied.
    ///
    /// ```
    /// # use inbox_runtime::{Prune, RetentionPolicy};
    /// let policy = RetentionPolicy::parse("7d", "1d")?;
    /// assert_eq!(Prune::new(policy.clone()).policy(), &policy);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn policy(&self) -> &RetentionPolicy {
        &self.policy
    }

    /// The batch statements of a run, one per pass, in order: first each
    /// handler with a window of its own, then everyone else (or only the
    /// handler the policy is restricted to), over the claims
    /// (`inbox_messages`, by `received_at`); then the same passes over
    /// failed attempts and dead messages (`inbox_failures`, by
    /// `last_failed_at`).
    ///
    /// [`run`](Self::run) and [`run_async`](Self::run_async) execute each in
    /// transactions of its own until it affects fewer rows than its
    /// [`limit`](PruneBatchStatement::limit), except the last pass of a
    /// policy with per-handler windows ([`PruneScope::AllExcept`]): that one
    /// they run handler by handler, finding each handler with one index probe
    /// and skipping the excluded ones, with this statement's window and limit
    /// for a [`PruneScope::Handler`] scope. Executed as it is, an `AllExcept`
    /// statement walks the `received_at` index across all handlers and reads
    /// (on MySQL, locks) the excluded handlers' rows it passes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use inbox_runtime::{HandlerName, Prune, RetentionPolicy, prune::PruneScope};
    ///
    /// let audit = HandlerName::new("audit")?;
    /// let policy = RetentionPolicy::parse("7d", "1d")?
    ///     .with_handler(audit.clone(), Duration::from_secs(30 * 86_400));
    /// let prune = Prune::new(policy);
    /// let statements = prune.statements();
    /// assert_eq!(statements[0].scope(), PruneScope::Handler(&audit));
    /// assert_eq!(statements[1].scope(), PruneScope::AllExcept(&[audit.clone()]));
    /// assert_eq!(statements.len(), 5, "the same passes over inbox_failures, one over the outbox");
    /// assert_eq!(statements[4].table(), inbox_runtime::prune::PrunedTable::Outbox);
    /// assert_eq!(statements[4].scope(), PruneScope::All);
    ///
    /// let only = Prune::new(prune.policy().clone().only(audit.clone()));
    /// assert_eq!(only.statements().len(), 2, "one handler's: no outbox pass");
    /// assert_eq!(only.statements()[0].keep().as_secs(), 30 * 86_400);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    #[doc(hidden)]
    pub fn statements(&self) -> Vec<PruneBatchStatement<'_>> {
        let mut passes: Vec<(PruneScope<'_>, Duration)> = Vec::new();
        if let Some(handler) = self.policy.only_handler() {
            passes.push((PruneScope::Handler(handler), self.policy.keep_for(handler)));
        } else {
            passes.extend(
                self.policy
                    .handler_windows()
                    .iter()
                    .map(|(handler, keep)| (PruneScope::Handler(handler), *keep)),
            );
            let scope = if self.except.is_empty() {
                PruneScope::All
            } else {
                PruneScope::AllExcept(&self.except)
            };
            passes.push((scope, self.policy.keep()));
        }
        // The outbox has no handlers: one pass over its sent messages, by
        // the default window, unless the run is one handler's.
        let outbox =
            (self.policy.only_handler().is_none()).then(|| (PruneScope::All, self.policy.keep()));
        self.tables
            .iter()
            .flat_map(|&table| {
                let passes = match table {
                    PrunedTable::Outbox => outbox.as_slice(),
                    PrunedTable::Claims | PrunedTable::Failures => passes.as_slice(),
                };
                passes.iter().map(move |(scope, keep)| {
                    PruneBatchStatement::new(table, *scope, *keep, self.batch_size)
                })
            })
            .collect()
    }

    /// Deletes every expired row, batch by batch, and reports what it did.
    ///
    /// `conn` is any Diesel connection of a supported backend, pooled ones
    /// included (`LoadConnection`: the pass over every handler but those with
    /// windows of their own reads the handlers' names). It must not be inside
    /// a transaction: each batch commits on its own (refused with
    /// `AlreadyInTransaction` otherwise). A failure stops the run; the
    /// [`PruneError`] still reports the batches that committed.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use diesel::prelude::*;
    /// use inbox_runtime::{Prune, RetentionPolicy};
    ///
    /// let mut conn = SqliteConnection::establish(":memory:")?;
    /// inbox_runtime::setup(&mut conn)?;
    /// let report = Prune::new(RetentionPolicy::parse("1d", "1d")?).run(&mut conn)?;
    /// // One batch over the claims, one over the failure records, one over
    /// // the outbox's sent messages.
    /// assert_eq!((report.rows_deleted, report.batches), (0, 3));
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run<C>(&self, conn: &mut C) -> Result<PruneReport, PruneError>
    where
        C: LoadConnection,
        C::Backend: InboxBackend,
    {
        self.run_with_progress(conn, |_| ControlFlow::Continue(()))
    }

    /// Like [`run`](Self::run), calling `progress` after every committed
    /// batch; returning `ControlFlow::Break(())` stops the run there.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use std::ops::ControlFlow;
    /// use diesel::prelude::*;
    /// use inbox_runtime::{Prune, RetentionPolicy};
    ///
    /// let mut conn = SqliteConnection::establish(":memory:")?;
    /// inbox_runtime::setup(&mut conn)?;
    /// let prune = Prune::new(RetentionPolicy::parse("1d", "1d")?);
    /// let report = prune.run_with_progress(&mut conn, |batch| {
    ///     println!("{batch}");
    ///     ControlFlow::Continue(())
    /// })?;
    /// assert!(report.caught_up);
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_with_progress<C, F>(
        &self,
        conn: &mut C,
        progress: F,
    ) -> Result<PruneReport, PruneError>
    where
        C: LoadConnection,
        C::Backend: InboxBackend,
        F: FnMut(&BatchProgress<'_>) -> ControlFlow<()>,
    {
        let pause = |wait| {
            std::thread::sleep(wait);
            ControlFlow::Continue(())
        };
        crate::execution::block_ready(driver::drive(
            self,
            &mut driver::Blocking { conn, pause },
            progress,
        ))
    }

    /// [`run`](Prune::run) on an async connection (feature `async`): each
    /// batch in a transaction of its own, at `READ COMMITTED`, until caught
    /// up.
    ///
    /// The [`pause`](Prune::pause) between batches is a tokio sleep (the
    /// runtime diesel-async's drivers run on; it needs tokio's timer).
    /// Dropping the future mid-batch leaves that batch's transaction open,
    /// so the connection is then marked broken (pools discard it, which
    /// rolls the batch back); batches already committed stay committed.
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
    #[cfg(feature = "async")]
    pub async fn run_async<C>(&self, conn: &mut C) -> Result<PruneReport, PruneError>
    where
        C: diesel_async::AsyncConnection,
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
    #[cfg(feature = "async")]
    pub async fn run_async_with_progress<C, F>(
        &self,
        conn: &mut C,
        progress: F,
    ) -> Result<PruneReport, PruneError>
    where
        C: diesel_async::AsyncConnection,
        C::Backend: InboxBackend,
        F: FnMut(&BatchProgress<'_>) -> ControlFlow<()>,
    {
        let pause = |wait| async move {
            tokio::time::sleep(wait).await;
            ControlFlow::Continue(())
        };
        driver::drive(self, &mut driver::Async { conn, pause }, progress).await
    }
}
