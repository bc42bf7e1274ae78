//! The `tracing` side of [`observe`](super): the delivery span, its fields
//! and the events (documented in the parent module).

use std::time::Duration;

use ::tracing::{Level, Span, field};

use super::{Ending, SPAN_NAME, TARGET, Timing};
use crate::key::HandlerName;

/// The span of a delivery of `message_id` to `handler`, its end fields
/// empty. A disabled span (no subscriber wants it) costs nothing further.
#[inline]
pub(super) fn span(handler: &HandlerName, message_id: &str) -> Span {
    ::tracing::span!(
        target: TARGET,
        Level::INFO,
        SPAN_NAME,
        "messaging.operation.type" = "process",
        "messaging.operation.name" = "process",
        "messaging.message.id" = message_id,
        "inbox.handler" = handler.as_str(),
        "inbox.outcome" = field::Empty,
        "inbox.attempt" = field::Empty,
        "inbox.claim_wait_ms" = field::Empty,
        "inbox.duration_ms" = field::Empty,
        "error.type" = field::Empty,
        "otel.status_code" = field::Empty,
    )
}

/// `inbox.claim_retry`: the claim is tried again.
#[inline]
pub(super) fn claim_retry(span: &Span, next_try: u32, error: &diesel::result::Error) {
    ::tracing::event!(
        name: "inbox.claim_retry",
        target: TARGET,
        parent: span,
        Level::DEBUG,
        { "inbox.claim_try" = next_try, error = %error },
        "the claim lost a lock conflict and is tried again",
    );
}

/// Records the end fields on `span`, emits the ending's event, and closes
/// the span (unless a guard or an instrumented future still holds it).
#[inline]
pub(super) fn finish(
    span: Span,
    handler: &HandlerName,
    message_id: &str,
    ending: &Ending<'_>,
    timing: Option<Timing>,
) {
    // Recording on a disabled span does nothing; the events are emitted all
    // the same (a subscriber may want WARN events and no INFO spans), and
    // name the handler and the id themselves.
    let outcome = ending.outcome();
    span.record("inbox.outcome", outcome);
    if let Some(attempts) = ending.attempts() {
        span.record("inbox.attempt", attempts);
    }
    if let Some(timing) = timing {
        span.record("inbox.duration_ms", millis(timing.duration));
        if let Some(wait) = timing.claim_wait {
            span.record("inbox.claim_wait_ms", millis(wait));
        }
    }
    if ending.is_failure() {
        span.record("error.type", outcome);
        span.record("otel.status_code", "error");
    }
    let handler = handler.as_str();
    match *ending {
        Ending::Rejected { reason } => ::tracing::event!(
            name: "inbox.dead_lettered",
            target: TARGET,
            parent: &span,
            Level::WARN,
            {
                "inbox.handler" = handler,
                "messaging.message.id" = message_id,
                "inbox.outcome" = outcome,
                "inbox.reason" = reason,
            },
            "the handler rejected the message; it is recorded as dead",
        ),
        Ending::Dead {
            attempts,
            last_error,
        } => ::tracing::event!(
            name: "inbox.dead_lettered",
            target: TARGET,
            parent: &span,
            Level::WARN,
            {
                "inbox.handler" = handler,
                "messaging.message.id" = message_id,
                "inbox.outcome" = outcome,
                "inbox.attempt" = attempts,
                "inbox.last_error" = last_error,
            },
            "the message used up its attempts; it is recorded as dead",
        ),
        Ending::DatabaseError { error } => ::tracing::event!(
            name: "inbox.database_error",
            target: TARGET,
            parent: &span,
            Level::WARN,
            {
                "inbox.handler" = handler,
                "messaging.message.id" = message_id,
                error = %error,
            },
            "the inbox's database work failed; nothing of the delivery committed",
        ),
        Ending::Conflict { error } | Ending::Refused { error } => ::tracing::event!(
            name: "inbox.refused",
            target: TARGET,
            parent: &span,
            Level::WARN,
            {
                "inbox.handler" = handler,
                "messaging.message.id" = message_id,
                "inbox.outcome" = outcome,
                error = %error,
            },
            "the delivery was refused without running the body; dead-letter it",
        ),
        Ending::SharedScope { error } => ::tracing::event!(
            name: "inbox.shared_scope",
            target: TARGET,
            parent: &span,
            Level::ERROR,
            {
                "inbox.handler" = handler,
                "messaging.message.id" = message_id,
                error = %error,
            },
            "the handler's scope is declared by another handler too; nothing ran, redeliver once the deploy is fixed",
        ),
        Ending::InProgress { error } => ::tracing::event!(
            name: "inbox.in_progress",
            target: TARGET,
            parent: &span,
            Level::INFO,
            {
                "inbox.handler" = handler,
                "messaging.message.id" = message_id,
                error = %error,
            },
            "another delivery of the message is still in flight; nothing ran, redeliver it later",
        ),
        Ending::Processed | Ending::Duplicate | Ending::Failed { .. } | Ending::InvalidId => {}
    }
}

/// `inbox.shared_scopes`: the registry's check failed (once per process).
#[cold]
pub(super) fn shared_scopes(scopes: usize, report: &dyn std::fmt::Display) {
    ::tracing::event!(
        name: "inbox.shared_scopes",
        target: TARGET,
        Level::ERROR,
        { "inbox.scopes" = scopes, error = %report },
        "deduplication scopes are declared by more than one handler; their deliveries are refused",
    );
}

/// `inbox.claim_token_missing`: a claim found the inbox without the claim
/// token's column (once per process).
#[cold]
pub(super) fn claim_token_missing(message: &str) {
    ::tracing::event!(
        name: "inbox.claim_token_missing",
        target: TARGET,
        Level::WARN,
        "{message}",
    );
}

/// `inbox.unregistered_scopes`: a pruning run found ids of scopes no
/// registered handler declares.
pub(super) fn unregistered_scopes(count: usize, list: &str) {
    ::tracing::event!(
        name: "inbox.unregistered_scopes",
        target: TARGET,
        Level::WARN,
        { "inbox.scopes" = count, "inbox.handlers" = list },
        "the inbox holds ids of scopes that no handler of this program declares",
    );
}

/// `inbox.pruned`: a pruning batch committed.
#[inline]
pub(super) fn pruned(table: &'static str, handler: Option<&str>, rows: u64) {
    ::tracing::event!(
        name: "inbox.pruned",
        target: TARGET,
        Level::DEBUG,
        { "inbox.table" = table, "inbox.handler" = handler, "inbox.rows" = rows },
        "a pruning batch committed",
    );
}

/// A relay round's answer for one message: its refusals only (a publish is
/// counted, not logged).
pub(super) fn relayed(destination: &str, relayed: super::Relayed<'_>) {
    match relayed {
        super::Relayed::Refused { dead: true, reason } => ::tracing::event!(
            name: "inbox.outbox_dead",
            target: TARGET,
            Level::WARN,
            { "messaging.destination.name" = destination, error = reason },
            "the broker refused an outgoing message for the last time: it is dead",
        ),
        super::Relayed::Refused {
            dead: false,
            reason,
        } => ::tracing::event!(
            name: "inbox.outbox_refused",
            target: TARGET,
            Level::INFO,
            { "messaging.destination.name" = destination, error = reason },
            "the broker refused an outgoing message; it will be retried",
        ),
        super::Relayed::Published { .. } | super::Relayed::Unavailable => {}
    }
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1_000.0
}
