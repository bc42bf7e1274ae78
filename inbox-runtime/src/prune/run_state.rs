//! Where a batched run stands: its passes, the walk over handlers of an
//! `AllExcept` pass, the batch cap, progress and the report so far. The
//! [driver](super::driver) executes the steps it hands out.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use diesel::connection::TransactionManagerStatus;

use super::report::PartialReport;
use super::{BatchProgress, Prune, PruneError, PruneReport};
use crate::backend::{NextHandler, PruneBatchStatement, PruneScope, PrunedTable};
use crate::error::InboxError;
use crate::execution::require_no_transaction;
use crate::key::HandlerName;

/// The bookkeeping of a batched run, for the [driver](super::driver), which
/// only executes the steps it hands out (and pauses when it says so): passes in order, the walk over handlers of an `AllExcept`
/// pass, the batch cap, progress callbacks, the report.
pub(crate) struct RunState<'p> {
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
    tally: PartialReport,
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

/// What a driver does next for a [`RunState`].
pub(crate) enum Step<'r> {
    /// Execute this batch in a transaction of its own, then
    /// [`record`](RunState::record) what it deleted.
    Batch(PruneBatchStatement<'r>),
    /// Load the next handler with this query
    /// ([`InboxBackend::next_prune_handler`]), then report it with
    /// [`found`](RunState::found).
    FindHandler(NextHandler<'r>),
}

impl<'p> RunState<'p> {
    /// Starts a run of `prune` on a connection whose transaction status is
    /// `status`; refused inside a transaction, since each batch must commit
    /// on its own.
    pub(crate) fn start(
        prune: &'p Prune,
        status: &mut TransactionManagerStatus,
    ) -> Result<Self, PruneError> {
        let tally = PartialReport::start();
        if let Err(error) = require_no_transaction(status) {
            return Err(tally.fail(error));
        }
        Ok(RunState {
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
        match statement.table() {
            PrunedTable::Claims => report.rows_deleted += rows,
            PrunedTable::Failures => report.failure_rows_deleted += rows,
            PrunedTable::Outbox => report.outbox_rows_deleted += rows,
        }
        let flow = progress(&BatchProgress {
            table: statement.table(),
            scope: statement.scope(),
            keep: statement.keep(),
            batch: report.batches,
            rows,
            total_rows: report.rows_deleted
                + report.failure_rows_deleted
                + report.outbox_rows_deleted,
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

    /// Whether the run was asked to stop (by the progress callback or a
    /// pause).
    pub(crate) fn stopped(&self) -> bool {
        self.stopped
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
///
/// `inbox_failures` is not walked: it holds only messages that failed, and
/// its handlers need not have claims to find them by.
fn step<'r>(statement: &PruneBatchStatement<'r>, walk: &'r Walk) -> Step<'r> {
    match statement.scope() {
        PruneScope::AllExcept(excluded)
            if !excluded.is_empty() && statement.table() == PrunedTable::Claims =>
        {
            match &walk.current {
                Some(handler) => Step::Batch(statement.with_scope(PruneScope::Handler(handler))),
                None => Step::FindHandler(NextHandler { after: &walk.after }),
            }
        }
        PruneScope::All | PruneScope::Handler(_) | PruneScope::AllExcept(_) => {
            Step::Batch(*statement)
        }
    }
}
