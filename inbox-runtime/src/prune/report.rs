//! What a pruning run reports: the run's [`PruneReport`], each committed
//! batch's [`BatchProgress`], and a failed run's [`PruneError`] (with what
//! committed before the failure).

use std::fmt;
use std::time::{Duration, Instant};

use super::{PruneScope, PrunedTable};
use crate::duration::format_duration;
use crate::error::InboxError;

/// A run's report so far and its clock, so that a failure can report what
/// committed before it (batched runs and the partitioned layout's).
pub(crate) struct PartialReport {
    pub(crate) started: Instant,
    pub(crate) report: PruneReport,
}

impl PartialReport {
    pub(crate) fn start() -> Self {
        PartialReport {
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

/// What a pruning run did.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// # use diesel::prelude::*;
/// # use inbox_runtime::{Prune, RetentionPolicy};
/// # let mut conn = SqliteConnection::establish(":memory:")?;
/// # inbox_runtime::setup(&mut conn)?;
/// let report = Prune::new(RetentionPolicy::parse("7d", "1d")?).run(&mut conn)?;
/// println!("{report}"); // "deleted 0 rows in 3 batches in 0.2 ms (caught up)"
/// // One batch over the claims, one over the failure records, one over
/// // the sent outgoing messages.
/// assert!(report.to_string().starts_with("deleted 0 rows in 3 batches"));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PruneReport {
    /// Claims (rows of `inbox_messages`) deleted (for dropped partitions:
    /// the planner's row estimate).
    pub rows_deleted: u64,
    /// Failure records (rows of `inbox_failures`: failed attempts and dead
    /// messages) deleted.
    pub failure_rows_deleted: u64,
    /// Sent outgoing messages (rows of `inbox_outbox` the broker confirmed)
    /// deleted.
    pub outbox_rows_deleted: u64,
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
    /// Scopes (handler names) found in `inbox_messages` that no handler of
    /// the program declares, in the database's order: see
    /// [`Prune::warn_unregistered`](crate::Prune::warn_unregistered).
    pub unregistered_scopes: Vec<String>,
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
        if self.failure_rows_deleted > 0 {
            write!(
                f,
                " and {} failure record{}",
                self.failure_rows_deleted,
                if self.failure_rows_deleted == 1 {
                    ""
                } else {
                    "s"
                }
            )?;
        }
        if self.outbox_rows_deleted > 0 {
            write!(
                f,
                " and {} sent outgoing message{}",
                self.outbox_rows_deleted,
                if self.outbox_rows_deleted == 1 {
                    ""
                } else {
                    "s"
                }
            )?;
        }
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
        })?;
        if !self.unregistered_scopes.is_empty() {
            write!(
                f,
                "; ids of {} scope{} no handler declares: {}",
                self.unregistered_scopes.len(),
                if self.unregistered_scopes.len() == 1 {
                    ""
                } else {
                    "s"
                },
                self.unregistered_scopes.join(", ")
            )?;
        }
        Ok(())
    }
}

/// Formats a duration as milliseconds with one decimal.
struct Millis(Duration);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1} ms", self.0.as_secs_f64() * 1e3)
    }
}

/// One committed batch, as passed to [`Prune::run_with_progress`](super::Prune::run_with_progress).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// # use std::ops::ControlFlow;
/// # use diesel::prelude::*;
/// # use inbox_runtime::{Prune, RetentionPolicy};
/// # let mut conn = SqliteConnection::establish(":memory:")?;
/// # inbox_runtime::setup(&mut conn)?;
/// Prune::new(RetentionPolicy::parse("7d", "1d")?).run_with_progress(&mut conn, |batch| {
///     if batch.batch == 1 {
///         assert!(batch.to_string().starts_with("batch 1: deleted 0 rows (total 0)"));
///     }
///     ControlFlow::Continue(())
/// })?;
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct BatchProgress<'a> {
    /// The table the batch deleted from.
    pub table: PrunedTable,
    /// The handlers the batch covered.
    pub scope: PruneScope<'a>,
    /// The window applied.
    pub keep: Duration,
    /// The batch's number in the run, from 1.
    pub batch: u64,
    /// Rows this batch deleted.
    pub rows: u64,
    /// Rows deleted so far in the run, from both tables.
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
            "batch {}: deleted {} rows (total {}) in {}, {:.0} rows/s overall [{} of {}, older than {}]",
            self.batch,
            self.rows,
            self.total_rows,
            Millis(self.batch_elapsed),
            rate,
            self.table,
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
