//! The batch form on diesel-async connections.

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;

use diesel_async::AsyncConnection;
use futures_util::FutureExt;

use super::{
    Attempt, BatchReport, BodyFailure, ClaimFailure, ClaimMode, Execute, Pending, Run,
    attempt_after_body_failure, attempt_after_claims_failed, attempt_after_commit, claimed,
    claims_of, current, lost_after_claims, next_claim_mode, one_by_one_failure, sorted_ids,
    sorted_positions,
};
use crate::attempts::{MaxAttempts, default_max_attempts};
use crate::backend::{BatchClaimed, InboxBackend};
use crate::claim::Claim;
use crate::claim::refused_or_database;
use crate::error::{HandlerError, InboxError};
use crate::execution::{AsyncLevel, RetryPolicy, async_status, require_transaction};
use crate::key::HandlerName;
use crate::message_id::MessageId;
use crate::observe::Delivery;
use crate::outcome::Outcome;
use crate::scope::Scope;
use crate::transaction_async::{
    abandoned_transaction_timeout, claim_statement_async, run_idempotent_async_with,
};

/// [`run_idempotent_batch`](crate::run_idempotent_batch) on a diesel-async
/// connection, with the same guarantees, and those of
/// [`run_idempotent_async`](crate::run_idempotent_async) for a cancelled
/// future: dropped while a transaction of the batch is open, it leaves the
/// connection's transaction manager broken (a pool discards it) and the
/// server rolls that transaction back when the connection closes, or when it
/// sat idle for [`abandoned_transaction_timeout`].
///
/// The future is `Send` when the connection, the messages and the body's
/// futures are, so it can be spawned. A body that borrows what it captures
/// (`async |conn, msg| apply(conn, &account, msg).await`) may fail
/// `tokio::spawn`'s check with "implementation of `Send` is not general
/// enough", a limit of the compiler's reasoning about borrowed captures:
/// move the captures in (`async move |conn, msg| …`, cloning what the body
/// needs).
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), inbox_runtime::InboxError> {
/// use inbox_runtime::{ack_decision, run_idempotent_batch_async, HandlerName};
///
/// let handler = HandlerName::new("greeter")?;
/// let ids = ["m-1", "m-2", "m-3"];
/// let report = run_idempotent_batch_async(conn, &handler, &ids, |id| *id, async |_conn, id| {
///     Ok::<usize, inbox_runtime::InboxError>(id.len())
/// })
/// .await;
/// for result in report.results() {
///     let _decision = ack_decision(result);
/// }
/// # Ok(())
/// # }
/// ```
pub async fn run_idempotent_batch_async<C, M, I, T, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    body: F,
) -> BatchReport<T, E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: AsyncFnMut(&mut C, &M) -> Result<T, E>,
{
    let max_attempts = default_max_attempts();
    run_idempotent_batch_async_with(conn, handler, messages, id_of, max_attempts, body).await
}

/// [`run_idempotent_batch_async`] with the handler's own limit of failed
/// attempts instead of [`default_max_attempts`].
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), inbox_runtime::InboxError> {
/// use inbox_runtime::{run_idempotent_batch_async_with, HandlerName, MaxAttempts};
///
/// let handler = HandlerName::new("greeter")?;
/// let report = run_idempotent_batch_async_with(conn, &handler, &["m-1"], |id| *id, MaxAttempts::limit(3), async |_conn, _id| {
///     Ok::<(), inbox_runtime::InboxError>(())
/// })
/// .await;
/// assert_eq!(report.len(), 1);
/// # Ok(())
/// # }
/// ```
pub async fn run_idempotent_batch_async_with<C, M, I, T, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    max_attempts: MaxAttempts,
    body: F,
) -> BatchReport<T, E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: AsyncFnMut(&mut C, &M) -> Result<T, E>,
{
    let mut exec = Async {
        conn,
        bodies: Each(body),
        max_attempts,
    };
    Run::drive(&mut exec, handler, messages, id_of).await
}

/// [`run_idempotent_batch_bulk`](crate::run_idempotent_batch_bulk) on a
/// diesel-async connection: one `async` body for all the new messages of a
/// transaction, with the guarantees of [`run_idempotent_batch_async`].
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), inbox_runtime::InboxError> {
/// use inbox_runtime::{run_idempotent_batch_bulk_async, HandlerName};
///
/// let handler = HandlerName::new("ledger.record")?;
/// let report = run_idempotent_batch_bulk_async(conn, &handler, &["m-1", "m-2"], |id| *id, async |_conn, ids: &[&&str]| {
///     // One statement writing the effects of every id in `ids`.
///     Ok::<(), inbox_runtime::InboxError>(())
/// })
/// .await;
/// assert_eq!(report.len(), 2);
/// # Ok(())
/// # }
/// ```
pub async fn run_idempotent_batch_bulk_async<C, M, I, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    body: F,
) -> BatchReport<(), E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: AsyncFnMut(&mut C, &[&M]) -> Result<(), E>,
{
    let max_attempts = default_max_attempts();
    run_idempotent_batch_bulk_async_with(conn, handler, messages, id_of, max_attempts, body).await
}

/// [`run_idempotent_batch_bulk_async`] with the handler's own limit of
/// failed attempts instead of [`default_max_attempts`].
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), inbox_runtime::InboxError> {
/// use inbox_runtime::{run_idempotent_batch_bulk_async_with, HandlerName, MaxAttempts};
///
/// let handler = HandlerName::new("ledger.record")?;
/// let report = run_idempotent_batch_bulk_async_with(conn, &handler, &["m-1"], |id| *id, MaxAttempts::limit(3), async |_conn, _ids: &[&&str]| {
///     Ok::<(), inbox_runtime::InboxError>(())
/// })
/// .await;
/// assert_eq!(report.len(), 1);
/// # Ok(())
/// # }
/// ```
pub async fn run_idempotent_batch_bulk_async_with<C, M, I, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    max_attempts: MaxAttempts,
    body: F,
) -> BatchReport<(), E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: AsyncFnMut(&mut C, &[&M]) -> Result<(), E>,
{
    let mut exec = Async {
        conn,
        bodies: Bulk(body),
        max_attempts,
    };
    Run::drive(&mut exec, handler, messages, id_of).await
}

/// A batch on a diesel-async connection.
struct Async<'c, C, B> {
    conn: &'c mut C,
    bodies: B,
    max_attempts: MaxAttempts,
}

/// How an async batch runs the bodies of its messages (see the blocking
/// executor's `Bodies`).
trait AsyncBodies<C, M, T, E> {
    /// Runs the bodies of the messages of `batch` whose ids were claimed,
    /// in order, pushing their values: on failure, the position of the
    /// message it failed on, if it says (`None`: a bulk body), and the
    /// failure.
    async fn run(
        &mut self,
        conn: &mut C,
        batch: &[&Pending<'_, M>],
        claims: &[Claim],
        deliveries: &[Delivery],
        values: &mut Vec<T>,
    ) -> Result<(), (Option<usize>, BodyFailure<E>)>;

    /// The body of one message on its own.
    async fn one(&mut self, conn: &mut C, pending: &Pending<'_, M>) -> Result<T, E>;
}

/// A body per message.
struct Each<F>(F);

impl<C, M, T, E, F> AsyncBodies<C, M, T, E> for Each<F>
where
    F: AsyncFnMut(&mut C, &M) -> Result<T, E>,
{
    async fn run(
        &mut self,
        conn: &mut C,
        batch: &[&Pending<'_, M>],
        claims: &[Claim],
        deliveries: &[Delivery],
        values: &mut Vec<T>,
    ) -> Result<(), (Option<usize>, BodyFailure<E>)> {
        for (position, (pending, claim)) in batch.iter().zip(claims).enumerate() {
            if *claim == Claim::Duplicate {
                continue;
            }
            let body = current::running_future([&pending.key], (self.0)(conn, pending.message));
            let body = AssertUnwindSafe(body).catch_unwind();
            match deliveries[position].scope().instrument(body).await {
                Ok(Ok(value)) => values.push(value),
                Ok(Err(error)) => return Err((Some(position), BodyFailure::Error(error))),
                Err(panic) => return Err((Some(position), BodyFailure::Panic(panic))),
            }
        }
        Ok(())
    }

    async fn one(&mut self, conn: &mut C, pending: &Pending<'_, M>) -> Result<T, E> {
        current::running_future([&pending.key], (self.0)(conn, pending.message)).await
    }
}

/// One body for all the messages claimed.
struct Bulk<F>(F);

impl<C, M, E, F> AsyncBodies<C, M, (), E> for Bulk<F>
where
    F: AsyncFnMut(&mut C, &[&M]) -> Result<(), E>,
{
    async fn run(
        &mut self,
        conn: &mut C,
        batch: &[&Pending<'_, M>],
        claims: &[Claim],
        _deliveries: &[Delivery],
        values: &mut Vec<()>,
    ) -> Result<(), (Option<usize>, BodyFailure<E>)> {
        let new = claimed(batch, claims);
        if new.is_empty() {
            return Ok(());
        }
        let messages: Vec<&M> = new.iter().map(|p| p.message).collect();
        let keys = new.iter().map(|p| &p.key);
        let body = current::running_future(keys, (self.0)(conn, &messages));
        match AssertUnwindSafe(body).catch_unwind().await {
            Ok(Ok(())) => {
                values.extend(new.iter().map(|_| ()));
                Ok(())
            }
            Ok(Err(error)) => Err((None, BodyFailure::Error(error))),
            Err(panic) => Err((None, BodyFailure::Panic(panic))),
        }
    }

    async fn one(&mut self, conn: &mut C, pending: &Pending<'_, M>) -> Result<(), E> {
        current::running_future([&pending.key], (self.0)(conn, &[pending.message])).await
    }
}

impl<C, M, T, E, B> Execute<M, T, E> for Async<'_, C, B>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    E: HandlerError,
    B: AsyncBodies<C, M, T, E>,
{
    async fn attempt(&mut self, batch: &[&Pending<'_, M>], values: &mut Vec<T>) -> Attempt<E> {
        let mut deliveries: Vec<Delivery> = batch.iter().map(|p| Delivery::start(&p.key)).collect();
        let bound =
            Scope::bounded::<C::Backend>(async_status(self.conn), abandoned_transaction_timeout());
        let scope = match bound {
            Ok(scope) => scope,
            Err(error) => return Attempt::Trouble(0, E::from(error), Vec::new()),
        };
        let mut level = AsyncLevel::new(&mut *self.conn, scope);
        let claims = match claim_all(&mut level, batch).await {
            Ok(claims) => claims,
            Err(failure) => return attempt_after_claims_failed(failure),
        };
        deliveries.iter_mut().for_each(Delivery::claimed);
        let ran = (self.bodies)
            .run(level.conn(), batch, &claims, &deliveries, values)
            .await;
        if let Err((at, failure)) = ran {
            let rolled_back = level.roll_back().await;
            return attempt_after_body_failure(at, failure, rolled_back, &claims);
        }
        let committed = level.commit().await;
        let broken = async_status(level.conn()).transaction_depth().is_err();
        attempt_after_commit(committed, broken, deliveries, batch, claims)
    }

    fn is_broken(&mut self) -> bool {
        async_status(self.conn).transaction_depth().is_err()
    }

    async fn alone(&mut self, pending: &Pending<'_, M>) -> Result<Outcome<T>, E> {
        let bodies = &mut self.bodies;
        run_idempotent_async_with(
            &mut *self.conn,
            pending.key.clone(),
            self.max_attempts,
            async |conn: &mut C| bodies.one(conn, pending).await.map(Outcome::Processed),
        )
        .await
    }
}

/// Begins the batch's level and claims every id in it (see
/// [`next_claim_mode`] for the tries). Returns the claims in batch order,
/// with the level open.
async fn claim_all<C, M>(
    level: &mut AsyncLevel<'_, C>,
    batch: &[&Pending<'_, M>],
) -> Result<Vec<Claim>, ClaimFailure>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let mut tries = RetryPolicy::CLAIM.tries();
    let mut mode = ClaimMode::Statements;
    loop {
        level.begin().await.map_err(ClaimFailure::Trouble)?;
        let claimed = match mode {
            ClaimMode::Statements => claim_in_statements(level.conn(), batch).await,
            ClaimMode::OneByOne => claim_each(level.conn(), batch).await.map(Some),
        };
        let failure = match claimed {
            Ok(Some(claims)) => return Ok(claims),
            Ok(None) => None,
            Err(failure) => Some(failure),
        };
        if let Err(rollback_error) = level.roll_back().await {
            return Err(lost_after_claims(failure, rollback_error));
        }
        mode = next_claim_mode(failure, mode, &level.scope, &mut tries)?;
    }
}

/// The claims of `batch` in as few statements as the backend's parameter
/// limit allows; `None` when a statement could not tell which ids it
/// inserted.
async fn claim_in_statements<C, M>(
    conn: &mut C,
    batch: &[&Pending<'_, M>],
) -> Result<Option<Vec<Claim>>, ClaimFailure>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    require_transaction(async_status(conn))
        .map_err(|error| ClaimFailure::Trouble(InboxError::Database(error)))?;
    let handler = batch[0].key.handler().as_str();
    let ids = sorted_ids(batch);
    let mut inserted = HashSet::with_capacity(ids.len());
    for statement in ids.chunks(C::Backend::MAX_CLAIMS_PER_STATEMENT) {
        match C::Backend::claim_batch_async(conn, handler, statement).await {
            Ok(BatchClaimed::Inserted(new)) => inserted.extend(new),
            Ok(BatchClaimed::Mixed) => return Ok(None),
            Err(error) => return Err(ClaimFailure::Trouble(InboxError::Database(error))),
        }
    }
    Ok(Some(claims_of(batch, &inserted)))
}

/// The claims of `batch`, one statement per id, in sorted order.
async fn claim_each<C, M>(
    conn: &mut C,
    batch: &[&Pending<'_, M>],
) -> Result<Vec<Claim>, ClaimFailure>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let mut claims = vec![Claim::Duplicate; batch.len()];
    for position in sorted_positions(batch) {
        let key = &batch[position].key;
        claims[position] = match claim_statement_async(conn, key).await {
            Ok(claim) => claim,
            Err(error) => {
                return Err(one_by_one_failure(
                    position,
                    refused_or_database(key, error),
                ));
            }
        };
    }
    Ok(claims)
}
