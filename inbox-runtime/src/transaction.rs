//! Running a handler body exactly once per message id.

use std::panic::{self, AssertUnwindSafe};

use diesel::connection::{
    Connection, LoadConnection, TransactionManager, TransactionManagerStatus,
};

use crate::attempts::{MaxAttempts, default_max_attempts};
use crate::backend::InboxBackend;
use crate::claim::{
    Claim, Taken, claim_statement, refused_or_database, store_result, stored_result_refused, take,
};
use crate::error::{HandlerError, InboxError, into_handler_error};
use crate::execution::RetryPolicy;
use crate::failure::{self, Failure, NotCommitted, Recorded};
use crate::key::ClaimKey;
use crate::observe::{Delivery, Ending, ending_of_inbox_error};
use crate::outcome::{OnDuplicate, StoredOutcome};
use crate::recovery::{Recovery, recovery};
use crate::scope::{Scope, either, report_after_failed_rollback};
use crate::stored::{Encoded, Plain, Reply, StoredResult, Storing, encode_caught};

/// Runs `body` inside one transaction that first claims `key`, unless the key
/// was already claimed. This is what `#[idempotent]` expands to.
///
/// - A first delivery: the id is claimed, `body` runs on the transaction's
///   connection, and the claim commits together with the body's effects.
/// - A duplicate: `body` does not run and nothing is written; the result is
///   `Ok(R::on_duplicate())` (`()` or [`Outcome::Duplicate`](crate::Outcome)).
/// - `body` returns `Err` or panics: everything rolls back, the claim
///   included, so a redelivery processes the message again. A panic is
///   resumed after the rollback, also when the rollback itself fails. A
///   panic inside a Diesel transaction the body opened (whose savepoint
///   Diesel leaves open on unwinding) rolls back everything the handler did
///   all the same, and the connection is back at the depth the handler found
///   it.
/// - `body` returns `Ok` but PostgreSQL aborted the transaction (a statement
///   failed and the body ignored its error): nothing could commit, and the
///   result is [`InboxError::IgnoredStatementFailure`] (retryable), never
///   `Ok`. The check travels with the `COMMIT`, in the same round trip.
/// - `body` returns `Ok` but the `COMMIT` is refused by a constraint the
///   database checks at commit (a deferred foreign key or unique key, on
///   PostgreSQL or SQLite): nothing committed, and the refusal is the
///   message's failed attempt, counted as a failed body's (see below): its
///   writes fail the same way on every delivery, so it ends dead instead of
///   being retried forever. The connection stays usable.
/// - Called inside a transaction already open on `conn`, the work becomes a
///   savepoint (`inbox_savepoint_<depth>`): the claim is final only when the
///   outer transaction commits, and vanishes with it if it rolls back.
/// - A rollback that fails (the connection died, or MySQL/MariaDB rolled
///   back the whole transaction on a deadlock, the caller's outer one
///   included) is [`InboxError::TransactionLost`], and the connection's
///   transaction manager is marked broken: every later transaction on it
///   fails with `BrokenTransactionManager` instead of running outside any
///   transaction. Replace the connection (r2d2 discards a broken one).
/// - A claim that loses a lock conflict (a MySQL/MariaDB deadlock between
///   deliveries that waited on the same id, or a serialization failure under
///   `SERIALIZABLE`; see [`is_lock_conflict`](crate::is_lock_conflict)) is
///   retried in a new transaction, up to
///   [`CLAIM_ATTEMPTS`](crate::CLAIM_ATTEMPTS) times in all, since the body
///   has not run yet. Only when `conn` has no transaction open: inside an
///   outer transaction the conflict is returned to the caller.
/// - `body` fails (returns its own error or panics) in a handler that opened
///   the outermost transaction: after the rollback, the failed attempt is
///   counted in a short transaction of its own, and at the default
///   [`MaxAttempts`](crate::MaxAttempts) the message is recorded as dead and
///   the delivery fails with [`InboxError::AttemptsExhausted`]; a body that
///   returns [`InboxError::rejected`] makes the message dead at once. See
///   [`run_idempotent_with`] for the limit, and
///   [`dead_letters`](crate::dead_letters) for what operators can do.
/// - What to do with an error: [`ack_decision`](crate::ack_decision) turns
///   the result into the broker's decision; [`InboxError::recovery`] and
///   [`recovery`](crate::recovery) say retry, reconnect, or never.
///
/// Only effects written through the connection handed to `body` are covered.
/// Calls to other systems (HTTP, e-mail, another database) are not rolled
/// back and may run again after a failure: give them an idempotency key of
/// their own (the message id is a good one).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{run_idempotent, ClaimKey, HandlerName, Outcome};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let handler = HandlerName::new("greeter")?;
///
/// let mut deliver = |conn: &mut SqliteConnection, id: &str| {
///     let key = ClaimKey::new(handler.clone(), id)?;
///     run_idempotent(conn, key, |_conn| Ok::<_, inbox_runtime::InboxError>(Outcome::Processed(id.len())))
/// };
/// assert_eq!(deliver(&mut conn, "m-1")?, Outcome::Processed(3));
/// assert_eq!(deliver(&mut conn, "m-1")?, Outcome::Duplicate);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_idempotent<C, R, E, F>(conn: &mut C, key: ClaimKey, body: F) -> Result<R, E>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    R: OnDuplicate,
    E: HandlerError,
    F: FnOnce(&mut C) -> Result<R, E>,
{
    run_idempotent_with(conn, key, default_max_attempts(), body)
}

/// [`run_idempotent`] with the handler's own limit of failed attempts
/// (`#[idempotent(max_attempts = …)]` expands to it), instead of
/// [`default_max_attempts`].
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{run_idempotent_with, ClaimKey, HandlerName, InboxError, MaxAttempts};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let key = || ClaimKey::new(HandlerName::new("flaky")?, "m-1");
/// let fail = |_: &mut SqliteConnection| Err::<(), _>(diesel::result::Error::NotFound);
///
/// let first = run_idempotent_with(&mut conn, key()?, MaxAttempts::limit(2), fail);
/// assert!(matches!(first, Err(diesel::result::Error::NotFound)), "counted, may retry");
/// let second = run_idempotent_with(&mut conn, key()?, MaxAttempts::limit(2), fail).unwrap_err();
/// assert!(matches!(
///     InboxError::find_in(&second),
///     Some(InboxError::AttemptsExhausted { attempts: 2, .. })
/// ));
/// // Dead: the body no longer runs.
/// let third = run_idempotent_with(&mut conn, key()?, MaxAttempts::limit(2), |_: &mut SqliteConnection| -> QueryResult<()> {
///     unreachable!("a dead message's body does not run")
/// });
/// assert!(third.is_ok());
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_idempotent_with<C, R, E, F>(
    conn: &mut C,
    key: ClaimKey,
    max_attempts: MaxAttempts,
    body: F,
) -> Result<R, E>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    R: OnDuplicate,
    E: HandlerError,
    F: FnOnce(&mut C) -> Result<R, E>,
{
    run::<Plain, C, R, E, F>(conn, key, max_attempts, body)
}

/// [`run_idempotent_with`] for request/response handlers: the body's
/// result is stored with the claim (as JSON, at most
/// [`MAX_STORED_RESULT_BYTES`](crate::MAX_STORED_RESULT_BYTES)) and a later
/// delivery of the same id returns it as [`StoredOutcome::Replayed`] without
/// running the body. `#[idempotent(store_result)]` expands to it (feature
/// `serde`; see [`StoredResult`]).
///
/// A result that cannot be stored (too large, or not encodable) fails the
/// delivery with [`InboxError::StoredResult`] and rolls its effects back:
/// a claim is never committed without the result its duplicates replay.
///
/// ```
/// # #[cfg(all(feature = "sqlite", feature = "serde"))] {
/// use diesel::prelude::*;
/// use inbox_runtime::{run_idempotent_storing, ClaimKey, HandlerName, MaxAttempts, StoredOutcome};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let mut charge = |conn: &mut SqliteConnection, amount: u32| {
///     let key = ClaimKey::new(HandlerName::new("payments.charge")?, "req-1")?;
///     run_idempotent_storing(conn, key, MaxAttempts::Unbounded, |_conn| {
///         Ok::<_, inbox_runtime::InboxError>(StoredOutcome::Processed(format!("charged {amount}")))
///     })
/// };
/// assert_eq!(charge(&mut conn, 250)?, StoredOutcome::Processed("charged 250".to_owned()));
/// // The retry gets the first delivery's result; its body does not run.
/// assert_eq!(charge(&mut conn, 250)?, StoredOutcome::Replayed("charged 250".to_owned()));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_idempotent_storing<C, T, E, F>(
    conn: &mut C,
    key: ClaimKey,
    max_attempts: MaxAttempts,
    body: F,
) -> Result<StoredOutcome<T>, E>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    StoredOutcome<T>: StoredResult,
    E: HandlerError,
    F: FnOnce(&mut C) -> Result<StoredOutcome<T>, E>,
{
    run::<Storing, C, StoredOutcome<T>, E, F>(conn, key, max_attempts, body)
}

/// The runner: [`Plain`] or [`Storing`] decides what a duplicate returns
/// and what is stored after the body.
pub(crate) fn run<P, C, R, E, F>(
    conn: &mut C,
    key: ClaimKey,
    max_attempts: MaxAttempts,
    body: F,
) -> Result<R, E>
where
    P: Reply<R>,
    C: LoadConnection,
    C::Backend: InboxBackend,
    E: HandlerError,
    F: FnOnce(&mut C) -> Result<R, E>,
{
    let mut delivery = Delivery::start(&key);
    // The whole delivery, the body included, runs inside its span.
    let _entered = delivery.entered();
    let scope = match Scope::new::<C::Backend>(status(conn)) {
        Ok(scope) => scope,
        Err(error) => {
            delivery.finish(&key, Ending::DatabaseError { error: &error });
            return Err(error.into());
        }
    };
    let taken = match claim_with_retries(conn, &scope, &key, P::STORES, &delivery) {
        Ok(taken) => taken,
        Err(error) => {
            if error.is_conflict() {
                // A claim that found its id taken, as a duplicate does.
                delivery.claimed();
            }
            delivery.finish(&key, ending_of_inbox_error(&error));
            return Err(into_handler_error(error));
        }
    };
    delivery.claimed();
    if let Taken::Duplicate(stored) = taken {
        let answer = P::duplicate(&key, stored.as_deref());
        delivery.finish(
            &key,
            match &answer {
                Ok(_) => Ending::Duplicate,
                Err(error) => ending_of_inbox_error(error),
            },
        );
        return answer.map_err(into_handler_error);
    }
    // The result to store is encoded under the body's watch: a panicking
    // `Serialize` is the delivery's panic, not an unwind past the open level.
    let ran =
        panic::catch_unwind(AssertUnwindSafe(|| body(conn))).and_then(|result| match result {
            Ok(value) => encode_caught::<P, R>(&key, &value).map(|encoded| Ok((value, encoded))),
            Err(error) => Ok(Err(error)),
        });
    match ran {
        Ok(Ok((value, encoded))) => match store_and_commit(conn, &scope, &key, encoded) {
            Ok(()) => {
                delivery.finish(&key, Ending::Processed);
                Ok(value)
            }
            Err(NotCommitted::Refused(refusal)) => {
                let failure = Failure::of_error(&refusal);
                let replacement =
                    count_failure(conn, &scope, &key, failure.as_ref(), max_attempts, delivery);
                Err(into_handler_error(
                    replacement.unwrap_or(InboxError::Database(refusal)),
                ))
            }
            Err(NotCommitted::Failed(error)) => {
                delivery.finish(&key, ending_of_inbox_error(&error));
                Err(into_handler_error(error))
            }
        },
        Ok(Err(error)) => Err(match roll_back(conn, &scope) {
            Ok(()) => {
                let failure = Failure::of_error(&error);
                count_failure(conn, &scope, &key, failure.as_ref(), max_attempts, delivery)
                    .map_or(error, into_handler_error)
            }
            Err(rollback_error) => {
                delivery.finish(
                    &key,
                    Ending::DatabaseError {
                        error: &rollback_error,
                    },
                );
                report_after_failed_rollback(error, rollback_error)
                    .unwrap_or_else(into_handler_error)
            }
        }),
        Err(panic) => {
            // The panic matters more than a failed rollback, which marks
            // the connection broken anyway, or than a count that could not
            // be written.
            match roll_back(conn, &scope) {
                Ok(()) => {
                    let failure = Failure::of_panic(&*panic);
                    let recorded = record_failure(conn, &scope, &key, &failure, max_attempts);
                    delivery.finish(
                        &key,
                        match &recorded {
                            Ok(Some(recorded)) => recorded.ending(&failure),
                            _ => Ending::Failed { attempts: None },
                        },
                    );
                }
                Err(rollback_error) => delivery.finish(
                    &key,
                    Ending::DatabaseError {
                        error: &rollback_error,
                    },
                ),
            }
            panic::resume_unwind(panic)
        }
    }
}

/// After the body succeeded: stores its result with the claim (a handler
/// that stores results), then commits the handler's level. A result that
/// cannot be stored (too large, or the inbox's statement failed) rolls the
/// level back: the inbox's own step failed, not the body, so it is no failed
/// attempt of the message.
fn store_and_commit<C>(
    conn: &mut C,
    scope: &Scope,
    key: &ClaimKey,
    encoded: Encoded,
) -> Result<(), NotCommitted>
where
    C: Connection,
    C::Backend: InboxBackend,
{
    let stored = match encoded {
        Ok(Some(result)) => store_result(conn, key, &result).map_err(stored_result_refused),
        Ok(None) => Ok(()),
        Err(error) => Err(error),
    };
    match stored {
        Ok(()) => commit(conn, scope).map_err(NotCommitted::of_commit),
        Err(error) => Err(NotCommitted::Failed(match roll_back(conn, scope) {
            Ok(()) => error,
            Err(rollback_error) => either(report_after_failed_rollback(error, rollback_error)),
        })),
    }
}

/// Counts a failed attempt of `key` after its level was rolled back (when
/// `failure` says there is one to count), tells `delivery` how it ended,
/// and returns the inbox error the delivery fails with instead of its own
/// (`None`: its own error stands).
fn count_failure<C>(
    conn: &mut C,
    scope: &Scope,
    key: &ClaimKey,
    failure: Option<&Failure>,
    max_attempts: MaxAttempts,
    delivery: Delivery,
) -> Option<InboxError>
where
    C: Connection,
    C::Backend: InboxBackend,
{
    let recorded = match failure {
        Some(failure) => record_failure(conn, scope, key, failure, max_attempts),
        None => Ok(None),
    };
    failure::conclude(failure, recorded, |ending| delivery.finish(key, ending))
}

/// Records a failed body after its rollback, in a short transaction of its
/// own (see [`crate::failure`]). `None`: nothing to record at this level (a
/// nested handler: its caller's transaction is still open).
fn record_failure<C>(
    conn: &mut C,
    handler_scope: &Scope,
    key: &ClaimKey,
    failure: &Failure,
    limit: MaxAttempts,
) -> Result<Option<Recorded>, InboxError>
where
    C: Connection,
    C::Backend: InboxBackend,
{
    if !handler_scope.is_outermost() {
        return Ok(None);
    }
    let recorded = match record_in_short_transaction(conn, key, failure, limit) {
        Err(error) => match failure::retry_in_ascii(&error, failure) {
            Some(ascii) => record_in_short_transaction(conn, key, &ascii, limit),
            None => Err(error),
        },
        recorded => recorded,
    };
    recorded.map(Some)
}

/// [`record_failure`]'s short transaction.
fn record_in_short_transaction<C>(
    conn: &mut C,
    key: &ClaimKey,
    failure: &Failure,
    limit: MaxAttempts,
) -> Result<Recorded, InboxError>
where
    C: Connection,
    C::Backend: InboxBackend,
{
    let scope = Scope::new::<C::Backend>(status(conn))?;
    begin(conn, &scope)?;
    let written = (|| {
        let record = failure::record_attempt_binds(key, failure);
        C::Backend::execute_bound(conn, C::Backend::FAILURE_SQL.record_attempt, &record)?;
        let rows = match failure::mark_dead::<C::Backend>(key, failure, limit) {
            Some((sql, binds)) => Some(C::Backend::execute_bound(conn, sql, &binds)?),
            None => None,
        };
        let recorded = failure::recorded(failure, limit, rows);
        if recorded.claims() && claim_or_refuse(conn, key)? == Claim::Duplicate {
            return Ok(Recorded::ProcessedMeanwhile);
        }
        Ok(recorded)
    })();
    match written {
        Ok(Recorded::ProcessedMeanwhile) => {
            roll_back(conn, &scope)?;
            Ok(Recorded::ProcessedMeanwhile)
        }
        Ok(recorded) => {
            commit(conn, &scope)?;
            Ok(recorded)
        }
        Err(error) => {
            roll_back(conn, &scope)?;
            Err(error)
        }
    }
}

/// Begins the handler's level and claims `key` in it, retrying a claim that
/// lost a lock conflict (outermost level only). Returns with the level open
/// when the key was claimed, and closed (committed) on a duplicate.
fn claim_with_retries<C>(
    conn: &mut C,
    scope: &Scope,
    key: &ClaimKey,
    read_result: bool,
    delivery: &Delivery,
) -> Result<Taken, InboxError>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    let mut tries = RetryPolicy::CLAIM.tries();
    loop {
        begin(conn, scope)?;
        match take(conn, scope.is_outermost(), key, read_result) {
            Ok(Taken::Claimed) => return Ok(Taken::Claimed),
            Ok(Taken::Duplicate(stored)) => {
                commit(conn, scope)?;
                return Ok(Taken::Duplicate(stored));
            }
            Err(error) => {
                if let Err(rollback_error) = roll_back(conn, scope) {
                    return Err(either(report_after_failed_rollback(error, rollback_error)));
                }
                match error {
                    // Claims retry at once (the policy's wait is zero).
                    InboxError::Database(cause)
                        if scope.is_outermost() && tries.again(&cause).is_some() =>
                    {
                        delivery.claim_retry(key, tries.made(), &cause);
                    }
                    error => return Err(error),
                }
            }
        }
    }
}

pub(crate) fn claim_or_refuse<C>(conn: &mut C, key: &ClaimKey) -> Result<Claim, InboxError>
where
    C: Connection,
    C::Backend: InboxBackend,
{
    claim_statement(conn, key).map_err(|error| refused_or_database(key, error))
}

pub(crate) fn begin<C>(conn: &mut C, scope: &Scope) -> Result<(), InboxError>
where
    C: Connection,
{
    scope.execute(conn, &scope.begin_sql())?;
    scope.entered(status(conn))?;
    Ok(())
}

/// Commits the handler's level; on failure, rolls it back and says why it
/// did not commit.
pub(crate) fn commit<C: Connection>(conn: &mut C, scope: &Scope) -> Result<(), InboxError> {
    if !scope.is_open(status(conn))? {
        return Err(ended_by_body(conn, scope));
    }
    let Err(commit_error) = scope.execute(conn, &scope.commit_sql()) else {
        return scope.left(status(conn)).map_err(Into::into);
    };
    if scope.is_outermost() && matches!(scope.is_open(status(conn)), Ok(false)) {
        // The failed COMMIT ended the transaction itself (PostgreSQL rolls
        // back a transaction whose COMMIT fails, and Diesel's connection saw
        // it idle): nothing committed, nothing is left to roll back, and the
        // connection is sound.
        return Err(scope.failed_commit(false, commit_error));
    }
    let aborted = recovery(&commit_error) != Recovery::Reconnect
        && scope
            .aborted_probe_sql()
            .is_some_and(|probe| scope.execute(conn, probe).is_err());
    let failed = scope.failed_commit(aborted, commit_error);
    Err(match roll_back(conn, scope) {
        Ok(()) => failed,
        Err(rollback_error) => either(report_after_failed_rollback(failed, rollback_error)),
    })
}

/// Rolls back the handler's level and whatever the body left open above
/// it. A rollback that fails marks the connection broken.
pub(crate) fn roll_back<C>(conn: &mut C, scope: &Scope) -> Result<(), InboxError>
where
    C: Connection,
{
    if !scope.is_open(status(conn))? {
        return Err(ended_by_body(conn, scope));
    }
    match scope.execute(conn, &scope.rollback_sql()) {
        Ok(()) => scope.left(status(conn)).map_err(Into::into),
        Err(error) => Err(scope.lose(status(conn), error)),
    }
}

/// The body itself ended the handler's transaction: what it committed or
/// rolled back cannot be told apart any more.
fn ended_by_body<C: Connection>(conn: &mut C, scope: &Scope) -> InboxError {
    scope.lose(status(conn), diesel::result::Error::NotInTransaction)
}

pub(crate) fn status<C: Connection>(conn: &mut C) -> &mut TransactionManagerStatus {
    C::TransactionManager::transaction_manager_status_mut(conn)
}
