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
//! latency of live handlers. `benches/prune.rs` (1,000,000 expired ids, 400
//! deliveries/s of live traffic, spans with and without pruning alternated in
//! the same run; PostgreSQL 15 on a 2-CPU VM; four runs, two of them while
//! the machine was also compiling, so the p99 ratios move between runs):
//!
//! | method | rows/s | handlers' p99, pruning / not pruning |
//! |---|---|---|
//! | batches of 5,000, no pause (the default) | 200,000–384,000 | 1.4–4.2× |
//! | batches of 5,000, 20 ms pause | 118,000–149,000 | 1.6–3.5× |
//! | batches of 1,000, 5 ms pause | 60,000–82,000 | 1.1–2.3× |
//! | batches of 500, 10 ms pause | 31,000 | 2.6× (one run) |
//! | batches of 500, 100 ms pause (paced, measured over 20 s) | 5,200–5,300 | 0.99–1.10× (two runs) |
//! | `partitioned`: drop a generation of 200,000 ids | 5–9 million (22–38 ms per generation) | 0.6–5× over the few deliveries during those milliseconds |
//!
//! On two CPUs, pruning flat out competes with the handlers for the
//! processors: their p99 rose from about 2 ms to 5–7 ms while rows were
//! deleted, whatever the batch size. Paced to about 5,000 rows/s (five times
//! the insert rate of a 1,000 msg/s service), it left the handlers' p99
//! unchanged: that is the setting for a background pruner next to live
//! traffic. Dropping generations avoids the cost almost entirely.
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
//! let report = Prune::new(policy).batch_size(1000)?.run(&mut conn)?;
//! assert_eq!(report.rows_deleted, 1);
//! assert!(report.caught_up);
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use diesel::connection::{
    Connection, LoadConnection, TransactionManager, TransactionManagerStatus,
};
use diesel::RunQueryDsl;

use crate::backend::InboxBackend;
use crate::duration::format_duration;
use crate::error::InboxError;
use crate::execution::{require_no_transaction, RetryPolicy};
use crate::key::HandlerName;
use crate::retention::{RetentionPolicy, RetentionProblem};

#[cfg(feature = "async")]
mod asynchronous;
#[cfg(any(feature = "r2d2", feature = "tokio"))]
mod background;
#[cfg(feature = "postgres")]
pub mod partitioned;
#[cfg(feature = "tokio")]
mod task;

use crate::backend::NextHandler;
pub use crate::backend::{PruneBatchStatement, PruneScope};
#[cfg(any(feature = "r2d2", feature = "tokio"))]
pub use background::{BackgroundPruner, PruneRun, PruneRunError, MAX_RETRY_BACKOFF};
#[cfg(feature = "r2d2")]
pub use background::{PruneJob, PrunerHandle};
#[cfg(feature = "tokio")]
pub use task::{AsyncPrunePool, PrunerTask};

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
///     .batch_size(2_000)?
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
}

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
        }
    }

    /// Rows per batch, between 1 and [`MAX_BATCH_SIZE`]; anything else is an
    /// [`InboxError::InvalidRetention`].
    ///
    /// ```
    /// # use inbox_runtime::{Prune, RetentionPolicy};
    /// let prune = Prune::new(RetentionPolicy::parse("7d", "1d")?);
    /// assert!(prune.clone().batch_size(500).is_ok());
    /// assert!(prune.batch_size(0).is_err());
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn batch_size(mut self, rows: u32) -> Result<Self, InboxError> {
        if rows == 0 || rows > MAX_BATCH_SIZE {
            return Err(InboxError::InvalidRetention {
                handler: None,
                problem: RetentionProblem::BatchSize {
                    requested: u64::from(rows),
                    max: u64::from(MAX_BATCH_SIZE),
                },
            });
        }
        self.batch_size = rows;
        Ok(self)
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
    /// handler the policy is restricted to).
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
    ///     .with_handler(audit.clone(), Duration::from_secs(30 * 86_400))?;
    /// let prune = Prune::new(policy);
    /// let statements = prune.statements();
    /// assert_eq!(statements[0].scope(), PruneScope::Handler(&audit));
    /// assert_eq!(statements[1].scope(), PruneScope::AllExcept(&[audit.clone()]));
    ///
    /// let only = Prune::new(prune.policy().clone().only(audit.clone()));
    /// assert_eq!(only.statements().len(), 1);
    /// assert_eq!(only.statements()[0].keep().as_secs(), 30 * 86_400);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn statements(&self) -> Vec<PruneBatchStatement<'_>> {
        if let Some(handler) = self.policy.only_handler() {
            let keep = self.policy.keep_for(handler);
            return vec![PruneBatchStatement::new(
                PruneScope::Handler(handler),
                keep,
                self.batch_size,
            )];
        }
        let mut statements: Vec<_> = self
            .policy
            .handler_windows()
            .iter()
            .map(|(handler, keep)| {
                PruneBatchStatement::new(PruneScope::Handler(handler), *keep, self.batch_size)
            })
            .collect();
        let scope = if self.except.is_empty() {
            PruneScope::All
        } else {
            PruneScope::AllExcept(&self.except)
        };
        statements.push(PruneBatchStatement::new(
            scope,
            self.policy.keep(),
            self.batch_size,
        ));
        statements
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
    /// assert_eq!((report.rows_deleted, report.batches), (0, 1));
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
        self.run_pausing(conn, progress, |pause| {
            std::thread::sleep(pause);
            ControlFlow::Continue(())
        })
    }

    /// The blocking driver of a [`BatchRun`]: `pause` sleeps between batches
    /// and may end the run instead (the background thread's pause wakes up
    /// for a stop request).
    pub(crate) fn run_pausing<C, F>(
        &self,
        conn: &mut C,
        mut progress: F,
        mut pause: impl FnMut(Duration) -> ControlFlow<()>,
    ) -> Result<PruneReport, PruneError>
    where
        C: LoadConnection,
        C::Backend: InboxBackend,
        F: FnMut(&BatchProgress<'_>) -> ControlFlow<()>,
    {
        let mut run = BatchRun::start(
            self,
            C::TransactionManager::transaction_manager_status_mut(conn),
        )?;
        while let Some(step) = run.next_step() {
            match step {
                Step::Batch(statement) => {
                    let batch_started = Instant::now();
                    let rows = run_batch(conn, &statement).map_err(|error| run.fail(error))?;
                    if let Some(wait) = run.record(rows, batch_started, &mut progress) {
                        if pause(wait).is_break() {
                            run.stop();
                        }
                    }
                }
                Step::FindHandler(NextHandler { after }) => {
                    let handler = <C::Backend as InboxBackend>::next_prune_handler(conn, after)
                        .map_err(|error| run.fail(error))?;
                    run.found(handler);
                }
            }
        }
        Ok(run.finish())
    }
}

/// A run's report so far and its clock, so that a failure can report what
/// committed before it.
pub(crate) struct Tally {
    started: Instant,
    pub(crate) report: PruneReport,
}

impl Tally {
    pub(crate) fn start() -> Self {
        Tally {
            started: Instant::now(),
            report: PruneReport::default(),
        }
    }

    /// The run failed: `error`, with what committed until now.
    pub(crate) fn fail(&self, error: impl Into<InboxError>) -> PruneError {
        PruneError::new(
            PruneReport {
                elapsed: self.started.elapsed(),
                ..self.report.clone()
            },
            error.into(),
        )
    }

    /// The run is over: its report.
    pub(crate) fn finish(self) -> PruneReport {
        PruneReport {
            elapsed: self.started.elapsed(),
            ..self.report
        }
    }
}

/// The bookkeeping of a batched run, written once for the blocking and the
/// async drivers, which only execute the steps it hands out (and sleep when
/// it says so): passes in order, the walk over handlers of an `AllExcept`
/// pass, the batch cap, progress callbacks, the report.
pub(crate) struct BatchRun<'p> {
    statements: Vec<PruneBatchStatement<'p>>,
    max_batches: Option<u64>,
    pause: Duration,
    /// The pass in progress, an index into `statements`.
    pass: usize,
    /// Where the pass in progress stands in its walk over handlers (an
    /// `AllExcept` pass only).
    walk: Walk,
    /// The progress callback (or the pause) asked to stop.
    stopped: bool,
    tally: Tally,
}

/// The walk over handlers of an `AllExcept` pass.
#[derive(Default)]
struct Walk {
    /// The last handler found (`""` before the first).
    after: String,
    /// The handler whose expired rows are being deleted; `None` between
    /// handlers, when the next one must be found.
    current: Option<HandlerName>,
}

/// What a driver does next for a [`BatchRun`].
pub(crate) enum Step<'r> {
    /// Execute this batch in a transaction of its own, then
    /// [`record`](BatchRun::record) what it deleted.
    Batch(PruneBatchStatement<'r>),
    /// Load the next handler with this query
    /// ([`InboxBackend::next_prune_handler`]), then report it with
    /// [`found`](BatchRun::found).
    FindHandler(NextHandler<'r>),
}

impl<'p> BatchRun<'p> {
    /// Starts a run of `prune` on a connection whose transaction status is
    /// `status`; refused inside a transaction, since each batch must commit
    /// on its own.
    pub(crate) fn start(
        prune: &'p Prune,
        status: &mut TransactionManagerStatus,
    ) -> Result<Self, PruneError> {
        let tally = Tally::start();
        if let Err(error) = require_no_transaction(status) {
            return Err(tally.fail(error));
        }
        Ok(BatchRun {
            statements: prune.statements(),
            max_batches: prune.max_batches,
            pause: prune.pause,
            pass: 0,
            walk: Walk::default(),
            stopped: false,
            tally,
        })
    }

    /// The next step, or `None` when the run is over.
    pub(crate) fn next_step(&self) -> Option<Step<'_>> {
        let capped = self
            .max_batches
            .is_some_and(|max| self.tally.report.batches >= max);
        if self.stopped || capped {
            return None;
        }
        let statement = self.statements.get(self.pass)?;
        Some(step(statement, &self.walk))
    }

    /// The next handler of the walk, found by the
    /// [`FindHandler`](Step::FindHandler) step: `None` ends the pass. An
    /// excluded handler is passed over (the next step finds the one after
    /// it), as is a name the inbox could not have stored as a handler.
    pub(crate) fn found(&mut self, handler: Option<String>) {
        let Some(name) = handler else {
            self.tally.report.passes_caught_up += 1;
            self.pass += 1;
            self.walk = Walk::default();
            return;
        };
        let excluded = match self.statements[self.pass].scope() {
            PruneScope::AllExcept(excluded) => excluded.iter().any(|h| h.as_str() == name),
            PruneScope::All | PruneScope::Handler(_) => false,
        };
        self.walk.current = if excluded {
            None
        } else {
            HandlerName::new(name.clone()).ok()
        };
        self.walk.after = name;
    }

    /// Records the batch [`next_step`](Self::next_step) handed out, which
    /// committed after deleting `rows`, and tells the progress callback.
    /// Returns the pause to take before the next batch, if any.
    pub(crate) fn record<F>(
        &mut self,
        rows: u64,
        batch_started: Instant,
        progress: &mut F,
    ) -> Option<Duration>
    where
        F: FnMut(&BatchProgress<'_>) -> ControlFlow<()>,
    {
        let Step::Batch(statement) = step(&self.statements[self.pass], &self.walk) else {
            unreachable!("record follows a batch");
        };
        let report = &mut self.tally.report;
        report.batches += 1;
        report.rows_deleted += rows;
        let flow = progress(&BatchProgress {
            scope: statement.scope(),
            keep: statement.keep(),
            batch: report.batches,
            rows,
            total_rows: report.rows_deleted,
            batch_elapsed: batch_started.elapsed(),
            elapsed: self.tally.started.elapsed(),
        });
        // A short batch: nothing expired is left in this scope.
        let scope_done = rows < statement.limit();
        if scope_done {
            if self.walk.current.is_some() {
                // The walk goes on with the next handler.
                self.walk.current = None;
            } else {
                report.passes_caught_up += 1;
                self.pass += 1;
            }
        }
        if flow.is_break() {
            self.stopped = true;
            None
        } else if scope_done || self.pause.is_zero() {
            None
        } else {
            Some(self.pause)
        }
    }

    /// Ends the run before the next batch (a stop request during a pause).
    pub(crate) fn stop(&mut self) {
        self.stopped = true;
    }

    /// A step failed: the run stops with `error`.
    pub(crate) fn fail(&self, error: impl Into<InboxError>) -> PruneError {
        self.tally.fail(error)
    }

    /// The run's report.
    pub(crate) fn finish(self) -> PruneReport {
        let passes = self.statements.len() as u64;
        let mut report = self.tally.finish();
        report.caught_up = report.passes_caught_up == passes;
        report
    }
}

/// The step of a pass: its statement, or in an `AllExcept` pass, the next
/// handler to find or the batch for the handler found.
fn step<'r>(statement: &PruneBatchStatement<'r>, walk: &'r Walk) -> Step<'r> {
    match statement.scope() {
        PruneScope::AllExcept(excluded) if !excluded.is_empty() => match &walk.current {
            Some(handler) => Step::Batch(statement.with_scope(PruneScope::Handler(handler))),
            None => Step::FindHandler(NextHandler { after: &walk.after }),
        },
        PruneScope::All | PruneScope::Handler(_) | PruneScope::AllExcept(_) => {
            Step::Batch(*statement)
        }
    }
}

/// One batch in a transaction of its own, tried again after a lock
/// conflict ([`RetryPolicy::BATCH`]).
fn run_batch<C>(conn: &mut C, statement: &PruneBatchStatement<'_>) -> diesel::QueryResult<u64>
where
    C: Connection,
    C::Backend: InboxBackend,
{
    let mut tries = RetryPolicy::BATCH.tries();
    loop {
        match run_batch_once(conn, statement) {
            Err(error) => match tries.again(&error) {
                Some(wait) => std::thread::sleep(wait),
                None => return Err(error),
            },
            done => return done,
        }
    }
}

fn run_batch_once<C>(conn: &mut C, statement: &PruneBatchStatement<'_>) -> diesel::QueryResult<u64>
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

/// What a pruning run did.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// # use diesel::prelude::*;
/// # use inbox_runtime::{Prune, RetentionPolicy};
/// # let mut conn = SqliteConnection::establish(":memory:")?;
/// # inbox_runtime::setup(&mut conn)?;
/// let report = Prune::new(RetentionPolicy::parse("7d", "1d")?).run(&mut conn)?;
/// println!("{report}"); // "deleted 0 rows in 1 batch in 0.2 ms (caught up)"
/// assert!(report.to_string().starts_with("deleted 0 rows in 1 batch"));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PruneReport {
    /// Rows deleted (for dropped partitions: the planner's row estimate).
    pub rows_deleted: u64,
    /// Batches committed.
    pub batches: u64,
    /// Wall-clock time of the run.
    pub elapsed: Duration,
    /// `true` when every pass ended with a short batch: no expired row was
    /// left, except rows other transactions held at that moment. `false`
    /// when a batch cap or a stop request ended the run early.
    pub caught_up: bool,
    /// Passes (scopes) that finished.
    pub passes_caught_up: u64,
    /// Whole partitions (generations) dropped by the `partitioned` layout.
    pub partitions_dropped: u64,
    /// Partitions (generations) started by the `partitioned` layout.
    pub partitions_created: u64,
}

impl PruneReport {
    /// Rows deleted per second of the run.
    ///
    /// ```
    /// let report = inbox_runtime::PruneReport::default();
    /// assert_eq!(report.rows_per_second(), 0.0);
    /// ```
    pub fn rows_per_second(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds > 0.0 {
            self.rows_deleted as f64 / seconds
        } else {
            0.0
        }
    }
}

impl fmt::Display for PruneReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "deleted {} row{} in {} batch{} in {}",
            self.rows_deleted,
            if self.rows_deleted == 1 { "" } else { "s" },
            self.batches,
            if self.batches == 1 { "" } else { "es" },
            Millis(self.elapsed),
        )?;
        if self.partitions_dropped > 0 || self.partitions_created > 0 {
            write!(
                f,
                ", {} partition{} dropped, {} created",
                self.partitions_dropped,
                if self.partitions_dropped == 1 {
                    ""
                } else {
                    "s"
                },
                self.partitions_created
            )?;
        }
        f.write_str(if self.caught_up {
            " (caught up)"
        } else {
            " (not caught up)"
        })
    }
}

/// Formats a duration as milliseconds with one decimal.
struct Millis(Duration);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1} ms", self.0.as_secs_f64() * 1e3)
    }
}

/// One committed batch, as passed to [`Prune::run_with_progress`].
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// # use std::ops::ControlFlow;
/// # use diesel::prelude::*;
/// # use inbox_runtime::{Prune, RetentionPolicy};
/// # let mut conn = SqliteConnection::establish(":memory:")?;
/// # inbox_runtime::setup(&mut conn)?;
/// Prune::new(RetentionPolicy::parse("7d", "1d")?).run_with_progress(&mut conn, |batch| {
///     assert_eq!(batch.batch, 1);
///     assert!(batch.to_string().starts_with("batch 1: deleted 0 rows (total 0)"));
///     ControlFlow::Continue(())
/// })?;
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct BatchProgress<'a> {
    /// The handlers the batch covered.
    pub scope: PruneScope<'a>,
    /// The window applied.
    pub keep: Duration,
    /// The batch's number in the run, from 1.
    pub batch: u64,
    /// Rows this batch deleted.
    pub rows: u64,
    /// Rows deleted so far in the run.
    pub total_rows: u64,
    /// How long this batch took.
    pub batch_elapsed: Duration,
    /// Time since the run started.
    pub elapsed: Duration,
}

impl fmt::Display for BatchProgress<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seconds = self.elapsed.as_secs_f64();
        let rate = if seconds > 0.0 {
            self.total_rows as f64 / seconds
        } else {
            0.0
        };
        write!(
            f,
            "batch {}: deleted {} rows (total {}) in {}, {:.0} rows/s overall [{}, older than {}]",
            self.batch,
            self.rows,
            self.total_rows,
            Millis(self.batch_elapsed),
            rate,
            self.scope,
            format_duration(self.keep)
        )
    }
}

/// A pruning run that failed part-way: the error, and what the batches that
/// committed before it did (their deletions stand).
///
/// ```
/// use inbox_runtime::{InboxError, PruneError};
///
/// let err = PruneError::from(InboxError::Database(diesel::result::Error::NotFound));
/// assert_eq!(err.report().rows_deleted, 0);
/// assert!(err.error().is_retryable());
/// let inbox: InboxError = err.into();
/// ```
#[derive(Debug)]
pub struct PruneError(Box<PruneErrorInner>);

#[derive(Debug)]
struct PruneErrorInner {
    report: PruneReport,
    error: InboxError,
}

impl PruneError {
    /// What committed before the failure.
    ///
    /// ```
    /// # use inbox_runtime::{InboxError, PruneError};
    /// let err = PruneError::from(InboxError::Database(diesel::result::Error::NotFound));
    /// assert_eq!(err.report().batches, 0);
    /// ```
    pub fn report(&self) -> &PruneReport {
        &self.0.report
    }

    /// The failure.
    ///
    /// ```
    /// # use inbox_runtime::{InboxError, PruneError};
    /// let err = PruneError::from(InboxError::Database(diesel::result::Error::NotFound));
    /// assert!(matches!(err.error(), InboxError::Database(_)));
    /// ```
    pub fn error(&self) -> &InboxError {
        &self.0.error
    }

    /// The failure, without the partial report.
    ///
    /// ```
    /// # use inbox_runtime::{InboxError, PruneError};
    /// let err = PruneError::from(InboxError::Database(diesel::result::Error::NotFound));
    /// assert!(matches!(err.into_error(), InboxError::Database(_)));
    /// ```
    pub fn into_error(self) -> InboxError {
        self.0.error
    }

    pub(crate) fn new(report: PruneReport, error: InboxError) -> Self {
        PruneError(Box::new(PruneErrorInner { report, error }))
    }
}

impl fmt::Display for PruneError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pruning stopped after deleting {} rows in {} batches: {}",
            self.0.report.rows_deleted, self.0.report.batches, self.0.error
        )?;
        if let InboxError::Database(error) = &self.0.error {
            write!(f, ": {error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PruneError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0.error)
    }
}

impl From<InboxError> for PruneError {
    fn from(error: InboxError) -> Self {
        PruneError::new(PruneReport::default(), error)
    }
}

impl From<PruneError> for InboxError {
    fn from(error: PruneError) -> Self {
        error.into_error()
    }
}
