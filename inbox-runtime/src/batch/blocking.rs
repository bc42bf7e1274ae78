//! The batch form on blocking Diesel connections.

use diesel::connection::LoadConnection;

use super::attempt::Batch;
use super::bodies::{Bulk, Each};
use super::{BatchReport, Run};
use crate::backend::InboxBackend;
use crate::delivery::blocking::Blocking;
use crate::error::HandlerError;
use crate::execution::block_ready;
use crate::key::HandlerName;
use crate::message_id::MessageId;
use crate::options::Options;

/// Handles a batch of messages exactly once each: one transaction, one
/// statement claiming every id, and `body` run on that transaction's
/// connection once per message whose id was not claimed before, in the
/// order given. The claims commit together with the bodies' effects.
///
/// The guarantees are those of [`run_idempotent`](crate::run_idempotent),
/// message by message:
///
/// - **Duplicates**: an id claimed before (also by a batch committing
///   concurrently) is `Ok(Outcome::Duplicate)` and its body does not run; a
///   copy of an id earlier in the same batch is a duplicate too, the
///   earlier copy carrying the outcome.
/// - **Invalid ids** (empty, too long, missing, not UTF-8) are that
///   message's [`InboxError::InvalidMessageId`](crate::InboxError::InvalidMessageId); the others proceed.
/// - **A body that fails** (its own error or a panic) does not sink the
///   others: the transaction rolls back, the messages before the failed one
///   run again in a transaction of their own and commit, the failed one
///   runs again **alone**, exactly as `run_idempotent_with` runs it (its
///   failed attempt is counted, and at `max_attempts` or on a rejection it
///   is dead), and the batch goes on with the messages after it. A failure
///   is only ever counted when its message failed alone, so a message is
///   never charged for another's fault. A panic is resumed once the messages
///   before it committed and its attempt was counted; the messages after it
///   are not run.
/// - **A refused commit** on a connection that stays sound (a body ignored
///   a failed statement, so PostgreSQL cannot commit; a deferred constraint
///   on SQLite) belongs to one message without saying which: the batch is
///   halved, and halved again, until that message runs alone and gets the
///   single form's error; the others commit.
/// - **Database trouble** (a lost connection, a lock conflict in a body, a
///   commit that fails for either, or that loses the connection — a
///   deferred constraint failing PostgreSQL's `COMMIT` does): nothing of
///   that transaction commits. The message that met it gets the error, and
///   every message of the batch not committed yet gets
///   [`InboxError::BatchAborted`](crate::InboxError::BatchAborted)
///   (retryable, with the same [`Recovery`](crate::Recovery)); the run
///   stops there. A claim that loses a lock conflict is retried first, as
///   `run_idempotent` retries it. Duplicates keep `Ok(Outcome::Duplicate)`:
///   their ids were committed by other deliveries.
/// - **Size**: any number of messages. A transaction holds at most
///   [`MAX_BATCH_MESSAGES`](crate::MAX_BATCH_MESSAGES); a longer batch is run as several, in order.
///   Each claim statement stays under its backend's parameter limit.
/// - **Concurrency**: the ids are claimed in one fixed order (sorted), so
///   overlapping batches wait for each other instead of deadlocking on
///   their claims, and an id two batches share is processed by one of them.
/// - Nested in a transaction open on `conn`, the batch is a savepoint, as
///   `run_idempotent` is, and failures are not counted.
///
/// On PostgreSQL and SQLite (3.35 or later) the claim is `INSERT …
/// ON CONFLICT DO NOTHING RETURNING message_id`. On MySQL/MariaDB it is an
/// `INSERT IGNORE`, whose affected-row count tells "all new" and "all
/// claimed before" apart; a batch mixing both is rolled back and claimed id
/// by id in a new transaction (one statement per id).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::connection::SimpleConnection;
/// use diesel::prelude::*;
/// use inbox_runtime::{ack_decision, AckDecision, HandlerName, run_idempotent_batch};
///
/// struct Payment { id: String, cents: i64 }
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// conn.batch_execute("CREATE TABLE ledger (id TEXT PRIMARY KEY, cents BIGINT NOT NULL)")?;
/// let handler = HandlerName::new("billing.apply_payment")?;
/// let batch = [
///     Payment { id: "pay-1".into(), cents: 500 },
///     Payment { id: "pay-2".into(), cents: 700 },
/// ];
/// let apply = |conn: &mut SqliteConnection, payment: &Payment| {
///     diesel::sql_query("INSERT INTO ledger VALUES (?, ?)")
///         .bind::<diesel::sql_types::Text, _>(&payment.id)
///         .bind::<diesel::sql_types::BigInt, _>(payment.cents)
///         .execute(conn)
///         .map(|_| ())
/// };
/// let first = run_idempotent_batch(&mut conn, &handler, &batch, |p| &p.id, apply);
/// assert_eq!(first.processed(), 2);
/// // The broker redelivers the batch: nothing is applied twice.
/// let again = run_idempotent_batch(&mut conn, &handler, &batch, |p| &p.id, apply);
/// assert_eq!(again.duplicates(), 2);
/// assert!(again.results().iter().all(|result| ack_decision(result) == AckDecision::Ack));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_idempotent_batch<C, M, I, T, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    body: F,
) -> BatchReport<T, E>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: FnMut(&mut C, &M) -> Result<T, E>,
{
    run_idempotent_batch_with(conn, handler, messages, id_of, Options::new(), body)
}

/// [`run_idempotent_batch`] with the handler's own [`Options`] (a
/// [`MaxAttempts`](crate::MaxAttempts) converts into them) instead of the
/// process defaults.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{ack_decision, AckDecision, HandlerName, InboxError, MaxAttempts, run_idempotent_batch_with};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let handler = HandlerName::new("orders")?;
/// let body = |_: &mut SqliteConnection, id: &&str| match *id {
///     "bad" => Err(InboxError::rejected("unknown sku")),
///     _ => Ok(()),
/// };
/// let report = run_idempotent_batch_with(&mut conn, &handler, &["a", "bad", "c"], |id| *id, MaxAttempts::limit(3), body);
/// let decisions: Vec<_> = report.results().iter().map(ack_decision).collect();
/// assert_eq!(decisions, [AckDecision::Ack, AckDecision::DeadLetter, AckDecision::Ack]);
/// assert_eq!(report.processed(), 2, "the good messages committed");
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_idempotent_batch_with<C, M, I, T, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    options: impl Into<Options>,
    body: F,
) -> BatchReport<T, E>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: FnMut(&mut C, &M) -> Result<T, E>,
{
    let mut body = body;
    let mut batch = Batch {
        exec: Blocking::new(conn),
        bodies: Each(async |conn: &mut C, message: &M| body(conn, message)),
        options: options.into(),
    };
    block_ready(Run::drive(&mut batch, handler, messages, id_of))
}
/// [`run_idempotent_batch`] with one body for all the new messages of a
/// transaction instead of one per message: what lets a batch write its
/// effects in one statement (one multi-row `INSERT` for a hundred ledger
/// rows), beyond what one transaction and one claim save.
///
/// `body` gets the messages whose ids were just claimed, in the order
/// given (duplicates, copies and invalid ids left out), and runs at most
/// once per transaction. When it fails (its error or a panic), the runtime
/// cannot tell which message it failed on: the batch is rolled back and
/// halved, and halved again, until the failing message runs alone, with
/// `body` called on it alone and the single form's rules (its attempt
/// counted, dead at the limit or on a rejection); the other halves commit.
/// A failure that is database trouble aborts the batch as
/// [`run_idempotent_batch`] does. Every other guarantee is
/// [`run_idempotent_batch`]'s.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::connection::SimpleConnection;
/// use diesel::prelude::*;
/// use inbox_runtime::{HandlerName, run_idempotent_batch_bulk};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// conn.batch_execute("CREATE TABLE ledger (id TEXT PRIMARY KEY)")?;
/// let handler = HandlerName::new("billing.record")?;
/// let record = |conn: &mut SqliteConnection, ids: &[&&str]| {
///     let values: Vec<String> = ids.iter().map(|id| format!("('{id}')")).collect();
///     conn.batch_execute(&format!("INSERT INTO ledger VALUES {}", values.join(", ")))
/// };
/// let first = run_idempotent_batch_bulk(&mut conn, &handler, &["a", "b"], |id| *id, record);
/// assert_eq!(first.processed(), 2);
/// // "a" again: the body gets only "c".
/// let second = run_idempotent_batch_bulk(&mut conn, &handler, &["a", "c"], |id| *id, record);
/// assert_eq!((second.duplicates(), second.processed()), (1, 1));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_idempotent_batch_bulk<C, M, I, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    body: F,
) -> BatchReport<(), E>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: FnMut(&mut C, &[&M]) -> Result<(), E>,
{
    let options = Options::new();
    run_idempotent_batch_bulk_with(conn, handler, messages, id_of, options, body)
}

/// [`run_idempotent_batch_bulk`] with the handler's own [`Options`]
/// instead of the process defaults.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{ack_decision, AckDecision, HandlerName, InboxError, MaxAttempts, run_idempotent_batch_bulk_with};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let handler = HandlerName::new("orders")?;
/// // Fails whenever "bad" is among the messages: halved until it is alone.
/// let body = |_: &mut SqliteConnection, ids: &[&&str]| match ids.contains(&&"bad") {
///     true => Err(InboxError::rejected("unknown sku")),
///     false => Ok(()),
/// };
/// let messages = ["a", "b", "bad", "c"];
/// let report = run_idempotent_batch_bulk_with(&mut conn, &handler, &messages, |id| *id, MaxAttempts::limit(3), body);
/// let decisions: Vec<_> = report.results().iter().map(ack_decision).collect();
/// assert_eq!(decisions, [AckDecision::Ack, AckDecision::Ack, AckDecision::DeadLetter, AckDecision::Ack]);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_idempotent_batch_bulk_with<C, M, I, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    options: impl Into<Options>,
    body: F,
) -> BatchReport<(), E>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: FnMut(&mut C, &[&M]) -> Result<(), E>,
{
    let mut body = body;
    let mut batch = Batch {
        exec: Blocking::new(conn),
        bodies: Bulk(async |conn: &mut C, messages: &[&M]| body(conn, messages)),
        options: options.into(),
    };
    block_ready(Run::drive(&mut batch, handler, messages, id_of))
}
