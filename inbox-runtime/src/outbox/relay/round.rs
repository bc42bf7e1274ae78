//! One round of a relay, written once for blocking and async connections:
//! lease the next messages, publish them, mark what the broker confirmed.

use std::future::{Future, Ready, ready};

use super::exec::{RelayExec, TransactionStep};
use super::{Relay, RelayReport};
use crate::backend::{Bind, InboxBackend, Lease, OutboxRow};
use crate::error::InboxError;
use crate::execution::{RetryPolicy, caught, depth, leave_broken_if_unusable};
use crate::observe::{self, Relayed};
use crate::outbox::headers;
use crate::outbox::id::OutboxId;
#[cfg(feature = "async")]
use crate::outbox::publisher::Publisher;
use crate::outbox::publisher::{BlockingPublisher, OutboxMessage, PublishError};
use crate::text::bounded;

/// How a round publishes: a [`Publisher`]'s future, or a
/// [`BlockingPublisher`]'s answer, ready when called.
pub(crate) trait Publish {
    fn publish(
        &mut self,
        messages: &[OutboxMessage],
    ) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send;
}

/// A [`BlockingPublisher`] as a round's [`Publish`].
pub(crate) struct BlockingPublish<'p, P>(pub(crate) &'p mut P);

#[allow(refining_impl_trait)]
impl<P: BlockingPublisher> Publish for BlockingPublish<'_, P> {
    fn publish(&mut self, messages: &[OutboxMessage]) -> Ready<Vec<Result<(), PublishError>>> {
        ready(self.0.publish(messages))
    }
}

/// A [`Publisher`] as a round's [`Publish`].
#[cfg(feature = "async")]
pub(crate) struct AsyncPublish<'p, P>(pub(crate) &'p mut P);

#[cfg(feature = "async")]
impl<P: Publisher> Publish for AsyncPublish<'_, P> {
    fn publish(
        &mut self,
        messages: &[OutboxMessage],
    ) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send {
        self.0.publish(messages)
    }
}

/// What [`InboxError::InsideTransaction`] names.
const ROUND: &str = "an outbox relay round";

/// Evaluates `$attempt` (an expression that awaits one statement or one
/// short transaction on `$exec`) until it succeeds, fails with an error
/// that is no lock conflict, or `$policy` has no tries left; waits between
/// tries with `$exec.pause`.
macro_rules! with_retries {
    ($policy:expr, $exec:expr, $attempt:expr) => {{
        let mut tries = $policy.tries();
        loop {
            match $attempt {
                Err(error) => match tries.again(&error) {
                    Some(wait) => $exec.pause(wait).await,
                    None => break Err(error),
                },
                done => break done,
            }
        }
    }};
}

/// One round: see [`Relay::run_once`]. A failure that left the connection
/// unusable marks it broken ([`leave_broken_if_unusable`]).
pub(crate) async fn round<X, P>(
    relay: &Relay,
    exec: &mut X,
    publisher: &mut P,
) -> Result<RelayReport, InboxError>
where
    X: RelayExec,
    P: Publish,
{
    let report = round_once(relay, exec, publisher).await;
    if let Err(error) = &report {
        leave_broken_if_unusable(exec.status(), error);
    }
    report
}

/// [`round`], without its check of the connection after a failure.
async fn round_once<X, P>(
    relay: &Relay,
    exec: &mut X,
    publisher: &mut P,
) -> Result<RelayReport, InboxError>
where
    X: RelayExec,
    P: Publish,
{
    if depth(exec.status())? > 0 {
        return Err(InboxError::InsideTransaction { operation: ROUND });
    }
    let owner = OutboxId::generate();
    let select = match <X::Backend as InboxBackend>::OUTBOX_SQL.lease {
        Lease::HeldLock(select) => select,
        Lease::Returning(sql) => {
            let rows = with_retries!(
                RetryPolicy::RELAY,
                exec,
                lease_returning(relay, exec, owner.as_str(), sql).await
            )?;
            return settle(relay, exec, owner.as_str(), rows, publisher, false).await;
        }
        Lease::LockThenWrite { select, lease } => {
            let rows = with_retries!(
                RetryPolicy::RELAY,
                exec,
                lock_then_lease(relay, exec, owner.as_str(), select, lease).await
            )?;
            return settle(relay, exec, owner.as_str(), rows, publisher, false).await;
        }
    };
    // The rows stay locked by this transaction while they are published:
    // it ends after what the broker answered is recorded.
    exec.transaction(TransactionStep::Begin).await?;
    let settled = caught(async {
        let (lease_millis, limit) = lease_binds(relay);
        let lease_millis = lease_millis.to_string();
        let rows = exec
            .load(select, &[Bind::Text(&lease_millis), Bind::BigInt(limit)])
            .await?;
        settle(relay, exec, owner.as_str(), rows, publisher, true).await
    })
    .await;
    match settled {
        Ok(Ok(report)) => match exec.transaction(TransactionStep::Commit).await {
            Ok(()) => Ok(report),
            Err(error) => {
                // Nothing of the round is recorded: its messages are
                // published again (the error says so).
                let _ = exec.transaction(TransactionStep::Rollback).await;
                Err(error.into())
            }
        },
        Ok(Err(error)) => {
            // The round's error is the one to report; a failed rollback
            // leaves the connection's manager broken, which its next use
            // (or its pool) reports.
            let _ = exec.transaction(TransactionStep::Rollback).await;
            Err(error)
        }
        Err(panic) => {
            let _ = exec.transaction(TransactionStep::Rollback).await;
            std::panic::resume_unwind(panic)
        }
    }
}

/// Publishes `rows` (leased for `owner`, or locked by the round's
/// transaction when `held`) and records what the broker answered: the
/// confirmed ones sent (deleted, or marked when the relay keeps them), the
/// refused ones counted, the others given back. Outside a held transaction
/// each record runs on its own and is tried again after a lock conflict
/// ([`RetryPolicy::RELAY`]): InnoDB keeps a lock on every row another
/// relay's lease scanned until that lease commits, so a record can wait
/// for it and lose, and a record that fails leaves a confirmed message to
/// be published again.
async fn settle<X, P>(
    relay: &Relay,
    exec: &mut X,
    owner: &str,
    mut rows: Vec<OutboxRow>,
    publisher: &mut P,
    held: bool,
) -> Result<RelayReport, InboxError>
where
    X: RelayExec,
    P: Publish,
{
    rows.sort_by_key(|row| row.position);
    let mut report = RelayReport {
        leased: rows.len(),
        ..RelayReport::default()
    };
    if rows.is_empty() {
        return Ok(report);
    }

    let mut positions = Vec::with_capacity(rows.len());
    let mut messages = Vec::with_capacity(rows.len());
    let mut refusals = Vec::new();
    for row in rows {
        match headers::decode(&row.headers) {
            Ok(decoded) => {
                positions.push((row.position, row.attempts));
                messages.push(message(row, decoded));
            }
            // Stored by this crate and damaged since: no publish can fix
            // it, so it is dead at once.
            Err(reason) => refusals.push(Refusal {
                position: row.position,
                attempts: row.attempts,
                reason,
                damaged: true,
                destination: row.destination,
            }),
        }
    }
    let limit = relay.publish_limit();
    let mut answers = if messages.is_empty() {
        Vec::new()
    } else {
        match exec.within(limit, publisher.publish(&messages)).await {
            Some(answers) => answers,
            None => {
                let reason = format!(
                    "the publisher did not answer within {} ms, three quarters of the lease",
                    limit.as_millis()
                );
                vec![Err(PublishError::unavailable(reason)); messages.len()]
            }
        }
    };
    answers.resize_with(messages.len(), || {
        Err(PublishError::unavailable(
            "the publisher gave no answer for this message",
        ))
    });

    let mut sent = Vec::new();
    let mut published = Vec::new();
    let mut unavailable = Vec::new();
    let mut given_back = Vec::new();
    for (((position, attempts), answer), message) in
        positions.into_iter().zip(answers).zip(&messages)
    {
        match answer {
            Ok(()) => {
                sent.push(position);
                published.push(message);
            }
            Err(error) if error.is_refused() => refusals.push(Refusal {
                position,
                attempts,
                reason: error.reason().to_owned(),
                damaged: false,
                destination: message.destination.clone(),
            }),
            Err(error) => {
                report.last_unavailable = Some(error.reason().to_owned());
                unavailable.push(position);
                given_back.push(message);
            }
        }
    }

    let sql = &<X::Backend as InboxBackend>::OUTBOX_SQL;
    let records = if held {
        RetryPolicy::ONCE
    } else {
        RetryPolicy::RELAY
    };
    if !sent.is_empty() {
        let done = if relay.keep_sent {
            sql.mark_sent
        } else {
            sql.delete_sent
        };
        with_retries!(records, exec, on_positions(exec, done, &[], &sent).await)?;
        report.published = sent.len();
        for message in published {
            let created_micros = message.created_micros;
            observe::relayed(&message.destination, Relayed::Published { created_micros });
        }
    }
    for refusal in refusals {
        let Refusal {
            position,
            attempts,
            reason,
            damaged,
            destination,
        } = refusal;
        let attempts = u32::try_from(attempts).unwrap_or(0).saturating_add(1);
        let limit = if damaged {
            attempts
        } else {
            relay.max_attempts
        };
        let retry_in = relay.backoff.after(attempts);
        let reason = bounded(reason);
        let binds = [
            Bind::Integer(i32::try_from(limit).unwrap_or(i32::MAX)),
            Bind::BigInt(i64::try_from(retry_in.as_millis()).unwrap_or(i64::MAX)),
            Bind::Text(&reason),
            Bind::BigInt(position),
            Bind::Text(owner),
        ];
        let counted = with_retries!(
            records,
            exec,
            exec.execute_cached(sql.record_refusal, &binds).await
        )?;
        report.refused += counted;
        let dead = counted > 0 && attempts >= limit;
        if dead {
            report.dead += 1;
        }
        if counted > 0 {
            observe::relayed(
                &destination,
                Relayed::Refused {
                    dead,
                    reason: &reason,
                },
            );
        }
    }
    if !unavailable.is_empty() {
        // Held rows are given back as the round's transaction ends.
        if !held {
            let owner = [Bind::Text(owner)];
            with_retries!(
                records,
                exec,
                on_positions(exec, sql.release, &owner, &unavailable).await
            )?;
        }
        report.unavailable = unavailable.len();
        for message in given_back {
            observe::relayed(&message.destination, Relayed::Unavailable);
        }
    }
    Ok(report)
}

/// A message the broker refused, or that cannot be published at all.
struct Refusal {
    position: i64,
    attempts: i32,
    reason: String,
    /// Its stored headers cannot be read: dead at once.
    damaged: bool,
    destination: String,
}

/// The lease's length in milliseconds and the round's limit, as bound.
fn lease_binds(relay: &Relay) -> (i64, i64) {
    let lease_millis = i64::try_from(relay.lease.as_millis()).unwrap_or(i64::MAX);
    (lease_millis, i64::from(relay.batch_size))
}

/// Leases the next messages for `owner` in one statement
/// ([`Lease::Returning`]).
async fn lease_returning<X: RelayExec>(
    relay: &Relay,
    exec: &mut X,
    owner: &str,
    sql: &'static str,
) -> diesel::QueryResult<Vec<OutboxRow>> {
    let (lease_millis, limit) = lease_binds(relay);
    let binds = [
        Bind::Text(owner),
        Bind::BigInt(lease_millis),
        Bind::BigInt(limit),
    ];
    exec.load(sql, &binds).await
}

/// Leases the next messages for `owner` in a short transaction of its own
/// ([`Lease::LockThenWrite`]).
async fn lock_then_lease<X: RelayExec>(
    relay: &Relay,
    exec: &mut X,
    owner: &str,
    select: &'static str,
    lease: &'static str,
) -> diesel::QueryResult<Vec<OutboxRow>> {
    let (lease_millis, limit) = lease_binds(relay);
    exec.transaction(TransactionStep::Begin).await?;
    let leased = async {
        let rows = exec.load(select, &[Bind::BigInt(limit)]).await?;
        if !rows.is_empty() {
            let positions: Vec<i64> = rows.iter().map(|row| row.position).collect();
            on_positions(
                exec,
                lease,
                &[Bind::Text(owner), Bind::BigInt(lease_millis)],
                &positions,
            )
            .await?;
        }
        Ok::<_, diesel::result::Error>(rows)
    }
    .await;
    match leased {
        Ok(rows) => {
            exec.transaction(TransactionStep::Commit).await?;
            Ok(rows)
        }
        Err(error) => {
            // The lease's error is the one to report; a failed rollback
            // leaves the connection's manager broken, which its next use
            // reports (and which no retry gets past).
            let _ = exec.transaction(TransactionStep::Rollback).await;
            Err(error)
        }
    }
}

/// Runs `sql` (ending with an open `IN (`) over the messages at
/// `positions`, after `binds`: the rows it affected.
async fn on_positions<X: RelayExec>(
    exec: &mut X,
    sql: &'static str,
    binds: &[Bind<'_>],
    positions: &[i64],
) -> diesel::QueryResult<usize> {
    exec.execute(&with_positions(sql, positions), binds).await
}

/// `sql` (ending with an open `IN (`) with `positions` and the closing
/// parenthesis appended.
fn with_positions(sql: &str, positions: &[i64]) -> String {
    use std::fmt::Write;
    let mut text = String::with_capacity(sql.len() + positions.len() * 8 + 1);
    text.push_str(sql);
    for (index, position) in positions.iter().enumerate() {
        if index > 0 {
            text.push_str(", ");
        }
        let _ = write!(text, "{position}");
    }
    text.push(')');
    text
}

fn message(row: OutboxRow, headers: Vec<(String, String)>) -> OutboxMessage {
    OutboxMessage {
        id: OutboxId::from_stored(row.id),
        destination: row.destination,
        ordering_key: row.ordering_key,
        headers,
        payload: row.payload,
        attempts: u32::try_from(row.attempts).unwrap_or(0),
        created_micros: row.created_micros,
    }
}

#[cfg(test)]
mod tests {
    use super::with_positions;

    #[test]
    fn positions_close_the_list() {
        assert_eq!(with_positions("x IN (", &[3, 1, 2]), "x IN (3, 1, 2)");
        assert_eq!(with_positions("x IN (", &[7]), "x IN (7)");
    }
}
