//! The `metrics` side of [`observe`](super): counters and histograms
//! (documented in the parent module).

use ::metrics::{SharedString, Unit, counter, describe_counter, describe_histogram, histogram};

use super::{
    CLAIM_RETRIES_TOTAL, CLAIM_WAIT_SECONDS, Ending, HANDLER_DURATION_SECONDS, MESSAGES_TOTAL,
    PRUNED_ROWS_TOTAL, TARGET, Timing,
};
use crate::key::HandlerName;

/// Gives the installed recorder the unit and description of every metric
/// the inbox records (see [`observe`](super#metrics-feature-metrics)). Call
/// it once, after installing the recorder: a recorder installed later does
/// not learn them. Recording works without it.
///
/// ```
/// inbox_runtime::observe::describe_metrics();
/// ```
pub fn describe_metrics() {
    describe_counter!(
        MESSAGES_TOTAL,
        Unit::Count,
        "Deliveries to inbox handlers, by handler and outcome (processed, duplicate, failed, \
         rejected, dead, invalid_id, database_error)."
    );
    describe_histogram!(
        HANDLER_DURATION_SECONDS,
        Unit::Seconds,
        "Time from the start of a delivery (before its claim) to its end, by handler and outcome."
    );
    describe_histogram!(
        CLAIM_WAIT_SECONDS,
        Unit::Seconds,
        "Time from the start of a delivery until its claim was decided (claimed or duplicate), \
         by handler."
    );
    describe_counter!(
        CLAIM_RETRIES_TOTAL,
        Unit::Count,
        "Claims tried again after losing a lock conflict, by handler."
    );
    describe_counter!(
        PRUNED_ROWS_TOTAL,
        Unit::Count,
        "Rows deleted by committed pruning batches, by table (and handler, for a batch over \
         one handler)."
    );
}

/// The `handler` label: borrowed, without allocating, for the names
/// `#[idempotent]` uses (`&'static str`).
fn handler_label(handler: &HandlerName) -> SharedString {
    SharedString::from(handler.as_cow().clone())
}

/// A delivery ended.
#[inline]
pub(super) fn delivered(handler: &HandlerName, ending: &Ending<'_>, timing: Option<Timing>) {
    let handler = handler_label(handler);
    let outcome = ending.outcome();
    counter!(target: TARGET, MESSAGES_TOTAL, "handler" => handler.clone(), "outcome" => outcome)
        .increment(1);
    let Some(timing) = timing else { return };
    if let Some(wait) = timing.claim_wait {
        histogram!(target: TARGET, CLAIM_WAIT_SECONDS, "handler" => handler.clone()).record(wait);
    }
    histogram!(target: TARGET, HANDLER_DURATION_SECONDS, "handler" => handler, "outcome" => outcome)
        .record(timing.duration);
}

/// A claim is tried again.
#[inline]
pub(super) fn claim_retry(handler: &HandlerName) {
    counter!(target: TARGET, CLAIM_RETRIES_TOTAL, "handler" => handler_label(handler)).increment(1);
}

/// A pruning batch committed.
#[inline]
pub(super) fn pruned(table: &'static str, handler: Option<&str>, rows: u64) {
    match handler {
        Some(handler) => counter!(
            target: TARGET,
            PRUNED_ROWS_TOTAL,
            "table" => table,
            "handler" => handler.to_owned()
        )
        .increment(rows),
        None => counter!(target: TARGET, PRUNED_ROWS_TOTAL, "table" => table).increment(rows),
    }
}
