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
    let sql = &<X::Backend as InboxBackend>::OUTBOX_SQL;
    let deleting = sql
        .deleting_lease
        .filter(|_| !relay.keep_sent && !relay.put_back_refused.is_set());
    let (select, holding) = match (deleting, &sql.lease) {
        (Some(deleting), _) => (
            deleting.lease,
            Holding::Deleted {
                restore: deleting.restore,
            },
        ),
        (None, Lease::HeldLock(select)) => (*select, Holding::Locked),
        (None, lease) => {
            let rows = with_retries!(
                RetryPolicy::RELAY,
                exec,
                lease_for_owner(relay, exec, owner.as_str(), lease).await
            )?;
            return settle(
                relay,
                exec,
                owner.as_str(),
                rows,
                publisher,
                Holding::Leased,
            )
            .await
            .map(|(report, _)| report);
        }
    };
    // The rows stay locked (or deleted) by this transaction while they are
    // published: it ends after what the broker answered is recorded.
    exec.transaction(TransactionStep::Begin).await?;
    let settled = caught(async {
        let (lease_millis, limit) = lease_binds(relay);
        let lease_millis = lease_millis.to_string();
        let rows = exec
            .load(select, &[Bind::Text(&lease_millis), Bind::BigInt(limit)])
            .await?;
        settle(relay, exec, owner.as_str(), rows, publisher, holding).await
    })
    .await;
    match settled {
        Ok(Ok((report, RoundEnd::RollBack))) => {
            exec.transaction(TransactionStep::Rollback).await?;
            Ok(report)
        }
        Ok(Ok((report, RoundEnd::Commit))) => match exec.transaction(TransactionStep::Commit).await
        {
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

/// How a round holds the messages it publishes.
#[derive(Debug, Clone, Copy)]
enum Holding {
    /// Leased for the round's owner, in a transaction of their own: each
    /// record is a statement of its own.
    Leased,
    /// Locked by the round's transaction ([`Lease::HeldLock`]).
    Locked,
    /// Deleted by the round's transaction
    /// ([`DeletingLease`](crate::backend::DeletingLease)): what the broker
    /// did not confirm is inserted again with `restore`.
    Deleted { restore: fn(usize) -> String },
}

/// How a round that holds its messages ends its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RoundEnd {
    Commit,
    /// Nothing was recorded, and the transaction's own work is undone: a
    /// deleting lease's messages, none confirmed nor refused, are back as
    /// they were.
    RollBack,
}

/// What a leased message's row holds besides the message: what its
/// records and its restore need.
struct Leased {
    position: i64,
    attempts: i32,
    key_seq: Option<i64>,
    last_error: Option<String>,
    retry_micros: Option<i64>,
    /// As stored (the message holds them decoded).
    headers: Vec<u8>,
}

/// Publishes `rows` (leased for `owner`, or held by the round's
/// transaction) and records what the broker answered: the confirmed ones
/// sent (deleted, or marked when the relay keeps them), the refused ones
/// counted, the others given back. Outside a held transaction each record
/// runs on its own and is tried again after a lock conflict
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
    holding: Holding,
) -> Result<(RelayReport, RoundEnd), InboxError>
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
        return Ok((report, RoundEnd::Commit));
    }

    let mut leased = Vec::with_capacity(rows.len());
    let mut messages = Vec::with_capacity(rows.len());
    let mut refusals = Vec::new();
    let mut damaged_rows = Vec::new();
    for mut row in rows {
        match headers::decode(&row.headers) {
            Ok(decoded) => {
                leased.push(Leased {
                    position: row.position,
                    attempts: row.attempts,
                    key_seq: row.key_seq,
                    last_error: row.last_error.take(),
                    retry_micros: row.retry_micros,
                    headers: std::mem::take(&mut row.headers),
                });
                messages.push(message(row, decoded));
            }
            // Stored by this crate and damaged since: no publish can fix
            // it, so it is dead at once.
            Err(reason) => {
                refusals.push(Refusal {
                    position: row.position,
                    attempts: row.attempts,
                    reason,
                    damaged: true,
                    destination: row.destination.clone(),
                });
                damaged_rows.push(row);
            }
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
    let mut unconfirmed = Vec::new();
    for ((row, answer), message) in leased.iter().zip(answers).zip(&messages) {
        match answer {
            Ok(()) => {
                sent.push(row.position);
                published.push(message);
                continue;
            }
            Err(error) if error.is_refused() => refusals.push(Refusal {
                position: row.position,
                attempts: row.attempts,
                reason: error.reason().to_owned(),
                damaged: false,
                destination: message.destination.clone(),
            }),
            Err(error) => {
                report.last_unavailable = Some(error.reason().to_owned());
                unavailable.push(row.position);
                given_back.push(message);
            }
        }
        unconfirmed.push((row, message));
    }

    let sql = &<X::Backend as InboxBackend>::OUTBOX_SQL;
    let records = match holding {
        Holding::Leased => RetryPolicy::RELAY,
        Holding::Locked | Holding::Deleted { .. } => RetryPolicy::ONCE,
    };
    let mut end = RoundEnd::Commit;
    if let Holding::Deleted { restore } = holding {
        if sent.is_empty() && refusals.is_empty() {
            end = RoundEnd::RollBack;
        } else {
            let restored: Vec<Restored<'_>> = unconfirmed
                .into_iter()
                .map(|(row, message)| Restored::of_message(row, message))
                .chain(damaged_rows.iter().map(Restored::of_row))
                .collect();
            put_back(relay, exec, restore, &restored).await?;
        }
    }
    if !sent.is_empty() {
        let done = match (holding, relay.keep_sent) {
            (Holding::Deleted { .. }, _) => None,
            (_, true) => Some(sql.mark_sent),
            (_, false) => Some(sql.delete_sent),
        };
        if let Some(done) = done {
            with_retries!(records, exec, on_positions(exec, done, &[], &sent).await)?;
        }
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
        if matches!(holding, Holding::Leased) {
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
    Ok((report, end))
}

/// Inserts `restored` again with `restore` (see
/// [`DeletingLease`](crate::backend::DeletingLease)), in statements of up
/// to [`PUT_BACK_ROWS`] messages. A refusal that is neither a lock conflict
/// nor a lost connection (a role without `INSERT`, a trigger of the
/// application's) is noted on the relay, whose rounds
/// then hold their rows locked instead (see
/// [`PutBackRefused`](super::PutBackRefused)); the round that found it out
/// is rolled back, its confirmed messages published again later under the
/// same ids.
async fn put_back<X: RelayExec>(
    relay: &Relay,
    exec: &mut X,
    restore: fn(usize) -> String,
    restored: &[Restored<'_>],
) -> diesel::QueryResult<()> {
    for chunk in restored.chunks(PUT_BACK_ROWS) {
        let binds: Vec<Bind<'_>> = chunk.iter().flat_map(Restored::binds).collect();
        if let Err(error) = exec.execute(&restore(chunk.len()), &binds).await {
            let passing = crate::is_lock_conflict(&error)
                || crate::recovery(&error) == crate::Recovery::Reconnect;
            if !passing {
                relay.put_back_refused.set();
            }
            return Err(error);
        }
    }
    Ok(())
}

/// The most messages one put-back statement inserts: PostgreSQL takes up
/// to 65,535 binds in a statement.
const PUT_BACK_ROWS: usize = 1_000;

/// A message a deleting lease took, as the lease's restore inserts it again
/// (see [`DeletingLease`](crate::backend::DeletingLease)).
struct Restored<'a> {
    position: i64,
    id: &'a str,
    destination: &'a str,
    ordering_key: Option<&'a str>,
    key_seq: Option<i64>,
    headers: &'a [u8],
    payload: &'a [u8],
    created_micros: i64,
    attempts: i32,
    last_error: Option<&'a str>,
    retry_micros: Option<i64>,
}

impl<'a> Restored<'a> {
    /// A message whose headers were decoded for its publish.
    fn of_message(row: &'a Leased, message: &'a OutboxMessage) -> Self {
        Restored {
            position: row.position,
            id: message.id.as_str(),
            destination: &message.destination,
            ordering_key: message.ordering_key.as_deref(),
            key_seq: row.key_seq,
            headers: &row.headers,
            payload: &message.payload,
            created_micros: message.created_micros,
            attempts: row.attempts,
            last_error: row.last_error.as_deref(),
            retry_micros: row.retry_micros,
        }
    }

    /// A message as its row returned it.
    fn of_row(row: &'a OutboxRow) -> Self {
        Restored {
            position: row.position,
            id: &row.id,
            destination: &row.destination,
            ordering_key: row.ordering_key.as_deref(),
            key_seq: row.key_seq,
            headers: &row.headers,
            payload: &row.payload,
            created_micros: row.created_micros,
            attempts: row.attempts,
            last_error: row.last_error.as_deref(),
            retry_micros: row.retry_micros,
        }
    }

    /// The restore's binds, in its order.
    fn binds(&self) -> [Bind<'a>; 11] {
        [
            Bind::BigInt(self.position),
            Bind::Text(self.id),
            Bind::Text(self.destination),
            Bind::OptionalText(self.ordering_key),
            Bind::OptionalBigInt(self.key_seq),
            Bind::Bytes(self.headers),
            Bind::Bytes(self.payload),
            Bind::BigInt(self.created_micros),
            Bind::Integer(self.attempts),
            Bind::OptionalText(self.last_error),
            Bind::OptionalBigInt(self.retry_micros),
        ]
    }
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

/// Leases the next messages for `owner`, in a transaction of their own
/// ([`Lease::Returning`], [`Lease::LockThenWrite`]). A held lease takes
/// them in the round's transaction instead (see `round_once`): none here.
async fn lease_for_owner<X: RelayExec>(
    relay: &Relay,
    exec: &mut X,
    owner: &str,
    lease: &Lease,
) -> diesel::QueryResult<Vec<OutboxRow>> {
    match *lease {
        Lease::Returning(sql) => lease_returning(relay, exec, owner, sql).await,
        Lease::LockThenWrite { select, lease } => {
            lock_then_lease(relay, exec, owner, select, lease).await
        }
        Lease::HeldLock(_) => Ok(Vec::new()),
    }
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
