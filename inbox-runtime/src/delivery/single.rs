//! One message's delivery, written once for blocking and async
//! connections: [`begin`] claims the id in a new level (retrying a claim
//! that lost a lock conflict), the body runs on the level's connection, and
//! [`Claimed::finish`] ends the level by the body's result (storing a
//! result, counting a failure, resuming a panic).

use std::any::Any;
use std::time::Duration;

use super::deferred::{CollectAt, Collector, collecting};
use super::executor::Executor;
use super::level::{Level, Tripwire};
use super::steps::{record_failure, store_result, take};
use crate::attempts::MaxAttempts;
use crate::backend::InboxBackend;
use crate::claim::Taken;
use crate::error::{HandlerError, InboxError, into_handler_error};
use crate::execution::{RetryPolicy, caught, leave_broken_if_unusable};
use crate::failure::{self, Failure, NotCommitted};
use crate::key::ClaimKey;
use crate::observe::{BodyScope, Delivery, Ending, ending_of_inbox_error};
use crate::options::Options;
use crate::scope::{either, report_after_failed_rollback};
use crate::stored::{Encoded, Reply, encode_caught};

/// A body's result, its panic caught.
pub(crate) type Caught<R, E> = Result<Result<R, E>, Box<dyn Any + Send>>;

/// Delivers one message: claims `key` in a new level on `exec`, runs
/// `body` on the level's connection unless the id was claimed before, and
/// ends the level by its result. `P` decides what a duplicate returns and
/// what is stored with the claim. What the blocking runner and the async
/// one run (the batch too, for a message on its own).
pub(crate) async fn deliver<P, R, E, X, F>(
    exec: &mut X,
    key: ClaimKey,
    options: Options,
    body: F,
) -> Result<R, E>
where
    P: Reply<R>,
    E: HandlerError,
    X: Executor,
    F: AsyncFnOnce(&mut X::Conn) -> Result<R, E>,
{
    let mut claimed = match begin::<P, R, X>(exec, key, options).await {
        Ok(Begun::Claimed(claimed)) => claimed,
        Ok(Begun::Answered(answer)) => return Ok(answer),
        Err(error) => return Err(into_handler_error(error)),
    };
    // As `run_body`, written out: one async layer fewer, which a body that
    // nests deliveries (an async handler inside a batch's body) needs on a
    // test thread's stack in a debug build.
    let BodyStart { scope, collector } = claimed.body_start();
    // The call is inside the watch too: a closure that panics before it
    // returns its future is the body's panic.
    let conn = exec.conn();
    let (result, collected) = scope
        .instrument(collecting(
            collector,
            caught(async move { body(conn).await }),
        ))
        .await;
    let result = claimed.ran(BodyRan { result, collected });
    claimed.finish_replying::<P, R, E, X>(exec, result).await
}

/// What a delivery's body runs in ([`Claimed::body_start`]).
#[doc(hidden)]
pub struct BodyStart {
    scope: BodyScope,
    collector: Option<Collector>,
}

/// What a delivery's body came to ([`run_body`]): its output or its
/// panic, and the statements it left for the commit.
#[doc(hidden)]
pub struct BodyRan<T> {
    result: std::thread::Result<T>,
    collected: Collector,
}

impl<T> BodyRan<T> {
    /// `f` applied to the body's output (a panic stays one).
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> BodyRan<U> {
        BodyRan {
            result: self.result.map(f),
            collected: self.collected,
        }
    }
}

/// Runs an async handler's `body` as `start` says (what [`deliver`] does
/// for the closure runners, written out there): inside the delivery's span,
/// collecting the statements it leaves for the commit (an outgoing
/// message, sent in the commit's round trip when the delivery commits),
/// its panic caught so the level can be rolled back before it resumes.
#[cfg(feature = "async")]
pub(crate) async fn run_body<F: Future>(start: BodyStart, body: F) -> BodyRan<F::Output> {
    let (result, collected) = start
        .scope
        .instrument(collecting(start.collector, caught(body)))
        .await;
    BodyRan { result, collected }
}

/// What beginning a delivery came to: the id claimed in an open level, or
/// the answer to a duplicate (`R::on_duplicate()`, or the stored result).
// Built once per delivery and taken apart at once: boxing the claim would
// cost an allocation per delivery to save a move.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Begun<R, T = Claimed> {
    /// The id is claimed in the open level: the body runs.
    Claimed(T),
    /// The id was claimed before: the body does not run.
    Answered(R),
}

/// Begins a level on `exec` and claims `key` in it, retrying a claim that
/// lost a lock conflict (outermost level only, [`RetryPolicy::CLAIM`]).
/// The claim of an outermost level waits at most the options'
/// [`ClaimWait`](crate::ClaimWait) for a delivery of the same id in flight
/// ([`InboxError::InProgress`](crate::InboxError::InProgress), not retried); a nested level's waits are
/// its caller's. Reports the delivery when it ends here (a duplicate, a
/// failed claim).
pub(crate) async fn begin<P, R, X>(
    exec: &mut X,
    key: ClaimKey,
    options: Options,
) -> Result<Begun<R>, InboxError>
where
    P: Reply<R>,
    X: Executor,
{
    let mut delivery = Delivery::start(&key);
    let level = match Level::of_handler(exec) {
        Ok(level) => level,
        Err(error) => {
            delivery.finish(&key, Ending::DatabaseError { error: &error });
            return Err(error.into());
        }
    };
    // The claim, and a duplicate's answer (a stored result's decoding),
    // run inside the delivery's span.
    let taken = delivery
        .scope()
        .instrument(async {
            let wait = match level.is_outermost() {
                true => options.resolved_claim_wait().bound(),
                false => None,
            };
            let taken = claim_with_retries(exec, &level, &key, P::STORES, wait, &delivery).await;
            taken.map(|taken| match taken {
                (Taken::Claimed, tripwire) => Begun::Claimed(tripwire),
                (Taken::Duplicate(stored), _) => {
                    Begun::Answered(P::duplicate(&key, stored.as_deref()))
                }
                // Committed, its fingerprint compared there; it reads no
                // stored result.
                (Taken::DuplicateUnchecked(_), _) => Begun::Answered(P::duplicate(&key, None)),
            })
        })
        .await;
    match taken {
        Ok(Begun::Claimed(tripwire)) => {
            delivery.claimed();
            // Only where the commit is sent as one text, in one round
            // trip: statements sent one by one gain nothing by waiting.
            let collects = level.is_outermost() && !exec.pays_per_statement(&level.scope);
            let collect_at = collects.then(|| CollectAt::level(exec));
            Ok(Begun::Claimed(Claimed {
                collect_at,
                level,
                tripwire,
                key,
                max_attempts: options.resolved_max_attempts(),
                delivery: Some(delivery),
                with_commit: String::new(),
            }))
        }
        Ok(Begun::Answered(answer)) => {
            delivery.claimed();
            match &answer {
                Ok(_) => delivery.finish(&key, Ending::Duplicate),
                Err(error) => delivery.finish(&key, ending_of_inbox_error(error)),
            }
            answer.map(Begun::Answered)
        }
        Err(error) => {
            if error.is_conflict() {
                // A claim that found its id taken, as a duplicate does.
                delivery.claimed();
            }
            delivery.finish(&key, ending_of_inbox_error(&error));
            leave_broken_if_unusable(exec.status(), &error);
            Err(error)
        }
    }
}

/// Begins `level` and claims `key` in it, retrying a claim that lost a lock
/// conflict (outermost level only). Returns with the level open when the
/// key was claimed, with the level's tripwire for its commit
/// ([`Level::commit_claimed`]), and closed (committed) on a duplicate.
async fn claim_with_retries<X: Executor>(
    exec: &mut X,
    level: &Level,
    key: &ClaimKey,
    read_result: bool,
    wait: Option<Duration>,
    delivery: &Delivery,
) -> Result<(Taken, Tripwire), InboxError> {
    let mut tries = RetryPolicy::CLAIM.tries();
    loop {
        let mut tripwire = level.begin_for_claim(exec).await?;
        let taken = take_armed(exec, level, &mut tripwire, key, read_result, wait).await;
        match taken {
            Ok(Taken::Claimed) => return Ok((Taken::Claimed, tripwire)),
            Ok(Taken::Duplicate(stored)) => {
                level.commit_duplicate(exec, tripwire).await?;
                return Ok((Taken::Duplicate(stored), Tripwire::Set));
            }
            Ok(Taken::DuplicateUnchecked(late)) => {
                level.commit_duplicate_checked(exec, late, key).await?;
                return Ok((Taken::DuplicateUnchecked(late), Tripwire::Set));
            }
            Err(error) => {
                if let Err(rollback_error) = level.roll_back(exec).await {
                    return Err(either(report_after_failed_rollback(error, rollback_error)));
                }
                match error {
                    // Claims retry at once (the policy's wait is zero).
                    InboxError::Database(cause)
                        if level.is_outermost() && tries.again(&cause).is_some() =>
                    {
                        delivery.claim_retry(key, tries.made(), &cause);
                    }
                    error => return Err(error),
                }
            }
        }
    }
}

/// [`take`] in `level`, its tripwire armed once the id is claimed. An
/// outermost level's claim writes the session's claim token where the
/// backend gives each outermost transaction one (see [`LateTripwire`]):
/// the commit checks it where the tripwire was left unset
/// ([`Level::commit_claimed`]), and a claim that reads what it met tells
/// its own row by it. On a schema without the token's column, whose
/// refusal ran nothing, the id is claimed again without it in the same
/// transaction, and the tripwire is the savepoint.
///
/// [`LateTripwire`]: crate::backend::LateTripwire
async fn take_armed<X: Executor>(
    exec: &mut X,
    level: &Level,
    tripwire: &mut Tripwire,
    key: &ClaimKey,
    read_result: bool,
    wait: Option<Duration>,
) -> Result<Taken, InboxError> {
    let outermost = level.is_outermost();
    let mut token = outermost && X::Backend::OUTERMOST_LATE_TRIPWIRE.is_some();
    // A duplicate's commit that ends the unset tripwire can compare the
    // fingerprint itself.
    let checked_at_commit = match *tripwire {
        Tripwire::Unset(late) => Some(late),
        Tripwire::Set => None,
    };
    let taken = loop {
        let taken = take(
            exec,
            outermost,
            key,
            read_result,
            wait,
            token,
            checked_at_commit,
        )
        .await;
        match &taken {
            // A table without the token's column refused the claim, which
            // ran nothing: claimed again without the token.
            Err(InboxError::Database(cause)) if token && X::Backend::claim_token_refused(cause) => {
                crate::observe::claim_token_missing();
                token = false;
            }
            _ => break taken,
        }
    };
    match taken {
        Ok(Taken::Claimed) if !token => level.arm(exec, tripwire).await.map(|()| Taken::Claimed),
        taken => taken,
    }
}

/// A level open on a connection, holding a fresh claim: the message is
/// being processed for the first time. Ended by one of the `finish`
/// methods, which report the delivery.
#[derive(Debug)]
pub(crate) struct Claimed {
    level: Level,
    /// The level's tripwire, for its commit.
    tripwire: Tripwire,
    key: ClaimKey,
    max_attempts: MaxAttempts,
    /// Reported when the delivery ends (once).
    delivery: Option<Delivery>,
    /// Where the body may leave statements for the commit: an outermost
    /// level's connection at its depth, where the commit is one text.
    collect_at: Option<CollectAt>,
    /// Statements the body left to be sent with the commit (see
    /// [`deferred`](super::deferred)): dropped unless it commits.
    with_commit: String,
}

impl Claimed {
    /// What the body runs in ([`run_body`]): the delivery's span, and what
    /// collects the statements it leaves for the commit (none for a nested
    /// level, whose commit is a savepoint's release that the caller's
    /// transaction may still roll back past).
    pub(crate) fn body_start(&self) -> BodyStart {
        BodyStart {
            scope: self.observed(),
            collector: self.collect_at.map(CollectAt::collector),
        }
    }

    /// Keeps what the body left for the commit: the body's output.
    pub(crate) fn ran<T>(&mut self, ran: BodyRan<T>) -> std::thread::Result<T> {
        self.with_commit = ran.collected.into_sql();
        ran.result
    }

    /// What the delivery's parts after the claim run in: its span (feature
    /// `tracing`).
    pub(crate) fn observed(&self) -> BodyScope {
        self.delivery
            .as_ref()
            .map_or_else(BodyScope::none, Delivery::scope)
    }

    /// Ends the level after the body returned `result` (its panic caught):
    /// stores the `Ok` value's result first when `P` says so, then
    /// [`finish_or_resume`](Self::finish_or_resume). The value is encoded
    /// under the same watch as the body: a panicking `Serialize` is the
    /// delivery's panic (rolled back, counted, resumed); a result that
    /// cannot be stored rolls the delivery back without counting an attempt.
    pub(crate) async fn finish_replying<P, R, E, X>(
        self,
        exec: &mut X,
        result: Caught<R, E>,
    ) -> Result<R, E>
    where
        P: Reply<R>,
        E: HandlerError,
        X: Executor,
    {
        let result = match result {
            Ok(Ok(value)) => {
                let encoded = self
                    .observed()
                    .in_scope(|| encode_caught::<P, R>(&self.key, &value));
                match encoded {
                    Ok(encoded) => match self.store(exec, encoded).await {
                        Ok(()) => Ok(Ok(value)),
                        Err(error) => {
                            return Err(into_handler_error(self.abandon(exec, error).await));
                        }
                    },
                    Err(panic) => Err(panic),
                }
            }
            other => other,
        };
        self.finish_or_resume(exec, result).await
    }

    /// Stores the encoded result with the claim (a handler that stores
    /// results): before the commit, in the claim's level.
    async fn store<X: Executor>(&self, exec: &mut X, encoded: Encoded) -> Result<(), InboxError> {
        match encoded? {
            Some(result) => {
                let scope = self.observed();
                scope
                    .instrument(store_result(exec, &self.key, &result))
                    .await
            }
            None => Ok(()),
        }
    }

    /// Ends the level after the inbox's own step after a successful body
    /// failed with `error` (storing its result): rolls it back and reports
    /// the delivery, without recording a failed attempt (the body did not
    /// fail). Returns what the delivery fails with.
    async fn abandon<X: Executor>(mut self, exec: &mut X, error: InboxError) -> InboxError {
        let scope = self.observed();
        scope
            .instrument(async move {
                let error = match self.level.roll_back(exec).await {
                    Ok(()) => error,
                    Err(rollback_error) => {
                        either(report_after_failed_rollback(error, rollback_error))
                    }
                };
                self.report(ending_of_inbox_error(&error));
                leave_broken_if_unusable(exec.status(), &error);
                error
            })
            .await
    }

    /// Ends the level by the body's result: commits the claim and the
    /// effects on `Ok`, rolls both back on `Err` (counting the failure) and
    /// returns the body's error; a panic rolls back, is counted, then
    /// resumed (even when the rollback fails, which marks the connection
    /// broken).
    pub(crate) async fn finish_or_resume<R, E, X>(
        self,
        exec: &mut X,
        result: Caught<R, E>,
    ) -> Result<R, E>
    where
        E: HandlerError,
        X: Executor,
    {
        let scope = self.observed();
        scope.instrument(self.end_or_resume(exec, result)).await
    }

    /// Ends the level by a result whose error type takes Diesel's errors
    /// only (`ClaimedTransaction::finish`): the inbox's own failures arrive
    /// in a Diesel error that [`InboxError::find_in`](crate::InboxError::find_in) recovers.
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    pub(crate) async fn finish<R, E, X>(
        mut self,
        exec: &mut X,
        result: Result<R, E>,
    ) -> Result<R, E>
    where
        E: From<diesel::result::Error> + std::error::Error + 'static,
        X: Executor,
    {
        let scope = self.observed();
        match scope.instrument(self.end(exec, result)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(Failed::Body(error))) => Err(error),
            Ok(Err(Failed::Inbox(error))) | Err(error) => Err(E::from(error.into())),
        }
    }

    async fn end_or_resume<R, E, X>(mut self, exec: &mut X, result: Caught<R, E>) -> Result<R, E>
    where
        E: HandlerError,
        X: Executor,
    {
        match result {
            Ok(result) => match self.end(exec, result).await {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(Failed::Body(error))) => Err(error),
                Ok(Err(Failed::Inbox(error))) | Err(error) => Err(into_handler_error(error)),
            },
            Err(panic) => {
                // The panic matters more than a failed rollback, which marks
                // the connection broken anyway, or than a count that could
                // not be written.
                match self.level.roll_back(exec).await {
                    Ok(()) => {
                        let failure = Failure::of_panic(&*panic);
                        let recorded = record_failure(
                            exec,
                            &self.level,
                            &self.key,
                            &failure,
                            self.max_attempts,
                        )
                        .await;
                        self.report(match &recorded {
                            Ok(Some(recorded)) => recorded.ending(&failure),
                            _ => Ending::Failed { attempts: None },
                        });
                    }
                    Err(rollback_error) => self.report(Ending::DatabaseError {
                        error: &rollback_error,
                    }),
                }
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// Commits on `Ok`; on `Err`, rolls back and records the failure. The
    /// outer `Err` is a commit or rollback that failed. A failure that left
    /// the connection unusable marks it broken ([`leave_broken_if_unusable`]).
    async fn end<R, E, X>(
        &mut self,
        exec: &mut X,
        result: Result<R, E>,
    ) -> Result<Result<R, Failed<E>>, InboxError>
    where
        E: std::error::Error + 'static,
        X: Executor,
    {
        let ended = self.end_level(exec, result).await;
        match &ended {
            Ok(Ok(_)) => {}
            Ok(Err(Failed::Body(error))) => {
                leave_broken_if_unusable(exec.status(), error);
            }
            Ok(Err(Failed::Inbox(error))) | Err(error) => {
                leave_broken_if_unusable(exec.status(), error);
            }
        }
        ended
    }

    /// [`end`](Self::end), without its check of the connection.
    async fn end_level<R, E, X>(
        &mut self,
        exec: &mut X,
        result: Result<R, E>,
    ) -> Result<Result<R, Failed<E>>, InboxError>
    where
        E: std::error::Error + 'static,
        X: Executor,
    {
        match result {
            Ok(value) => match self
                .level
                .commit_claimed(
                    exec,
                    &std::mem::take(&mut self.with_commit),
                    self.tripwire,
                    &self.key,
                )
                .await
                .map_err(NotCommitted::of_commit)
            {
                Ok(()) => {
                    self.report(Ending::Processed);
                    Ok(Ok(value))
                }
                Err(NotCommitted::Refused(refusal)) => {
                    // A constraint checked at commit: the message's failed
                    // attempt, counted as a failed body's.
                    Err(match self.after_failure(exec, refusal).await {
                        Failed::Inbox(replacement) => replacement,
                        Failed::Body(refusal) => InboxError::Database(refusal),
                    })
                }
                Err(NotCommitted::Failed(error)) => {
                    self.report(ending_of_inbox_error(&error));
                    Err(error)
                }
            },
            Err(error) => match self.level.roll_back(exec).await {
                Ok(()) => Ok(Err(self.after_failure(exec, error).await)),
                Err(rollback_error) => {
                    self.report(Ending::DatabaseError {
                        error: &rollback_error,
                    });
                    report_after_failed_rollback(error, rollback_error)
                        .map(|error| Err(Failed::Body(error)))
                }
            },
        }
    }

    /// After the body failed with `error` and its level rolled back: records
    /// the failure, and says what the delivery fails with.
    async fn after_failure<E, X>(&mut self, exec: &mut X, error: E) -> Failed<E>
    where
        E: std::error::Error + 'static,
        X: Executor,
    {
        let failure = Failure::of_error(&error);
        let recorded = match &failure {
            Some(failure) => {
                record_failure(exec, &self.level, &self.key, failure, self.max_attempts).await
            }
            None => Ok(None),
        };
        let replacement =
            failure::conclude(failure.as_ref(), recorded, |ending| self.report(ending));
        match replacement {
            Some(replacement) => Failed::Inbox(replacement),
            None => Failed::Body(error),
        }
    }

    /// Reports how the delivery ended (once).
    fn report(&mut self, ending: Ending<'_>) {
        if let Some(delivery) = self.delivery.take() {
            delivery.finish(&self.key, ending);
        }
    }
}

/// What a failed body's delivery fails with: the body's own error, or an
/// inbox error in its place (exhausted attempts, a rejection that could not
/// be recorded).
enum Failed<E> {
    Body(E),
    Inbox(InboxError),
}
