//! The `metrics` side of [`observe`](super): counters and histograms
//! (documented in the parent module).

use ::metrics::{SharedString, Unit, counter, describe_counter, describe_histogram, histogram};

use super::{
    CLAIM_RETRIES_TOTAL, CLAIM_WAIT_SECONDS, Ending, HANDLER_DURATION_SECONDS, MESSAGES_TOTAL,
    OUTBOX_PUBLISH_DELAY_SECONDS, OUTBOX_PUBLISHED_TOTAL, OUTBOX_REFUSED_TOTAL,
    OUTBOX_UNAVAILABLE_TOTAL, PRUNED_ROWS_TOTAL, Relayed, TARGET, Timing, since_recorded,
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
    describe_counter!(
        OUTBOX_PUBLISHED_TOTAL,
        Unit::Count,
        "Outgoing messages the broker confirmed and the relay marked sent, by destination."
    );
    describe_counter!(
        OUTBOX_REFUSED_TOTAL,
        Unit::Count,
        "Publishes of outgoing messages the broker refused, by destination and whether the \
         message is now dead."
    );
    describe_counter!(
        OUTBOX_UNAVAILABLE_TOTAL,
        Unit::Count,
        "Outgoing messages given back uncounted because the broker could not take them."
    );
    describe_histogram!(
        OUTBOX_PUBLISH_DELAY_SECONDS,
        Unit::Seconds,
        "Time from an outgoing message's recording (database clock) to the broker's \
         confirmation (relay clock), by destination."
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

/// A relay round's answer for one message.
#[inline]
pub(super) fn relayed(destination: &str, relayed: Relayed<'_>) {
    match relayed {
        Relayed::Published { created_micros } => {
            let destination = destination.to_owned();
            counter!(target: TARGET, OUTBOX_PUBLISHED_TOTAL, "destination" => destination.clone())
                .increment(1);
            histogram!(target: TARGET, OUTBOX_PUBLISH_DELAY_SECONDS, "destination" => destination)
                .record(since_recorded(created_micros));
        }
        Relayed::Refused { dead, .. } => counter!(
            target: TARGET,
            OUTBOX_REFUSED_TOTAL,
            "destination" => destination.to_owned(),
            "dead" => if dead { "true" } else { "false" }
        )
        .increment(1),
        Relayed::Unavailable => counter!(target: TARGET, OUTBOX_UNAVAILABLE_TOTAL).increment(1),
    }
}
