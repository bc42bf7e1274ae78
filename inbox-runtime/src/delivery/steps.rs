//! The inbox's own statements in a delivery, over an [`Executor`]: the
//! claim and what a duplicate reads, the fingerprint and result stored with
//! a claim, and a failed attempt's record.

use std::time::{Duration, Instant};

use super::current;
use super::executor::Executor;
use super::level::Level;
use crate::attempts::MaxAttempts;
use crate::backend::{ClaimBound, InboxBackend, LateTripwire, StoredClaimRow};
use crate::claim::{
    Claim, Taken, claim_from_affected_rows, column_binds, duplicate_of, key_binds,
    refused_or_database, stored_result_refused,
};
use crate::error::InboxError;
use crate::execution::require_transaction;
use crate::failure::{self, Failure, Recorded};
use crate::fingerprint::Fingerprint;
use crate::key::{ClaimKey, preview};
use crate::recovery::is_lock_wait_timeout;

/// What a claim statement answered: [`Claim`], and for a duplicate
/// whether the key's fingerprint is still to be compared with the one
/// stored with the claim it met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// The key is this transaction's now.
    Claimed,
    /// Already claimed; the key's fingerprint not yet compared with the
    /// stored one.
    Duplicate,
    /// Already claimed, and no fingerprint to compare: the key has none,
    /// or the claim compared it and met the same or none
    /// ([`InboxBackend::FINGERPRINTED_CLAIM_COMPARES`]).
    DuplicateMatched,
}

impl From<Answer> for Claim {
    fn from(answer: Answer) -> Claim {
        match answer {
            Answer::Claimed => Claim::Claimed,
            Answer::Duplicate | Answer::DuplicateMatched => Claim::Duplicate,
        }
    }
}

/// Runs the claim statement inside the transaction open on the executor's
/// connection (refused outside one: a claim committed on its own, apart
/// from the effects, is what the inbox exists to prevent), writing the
/// session's claim token if `token` (see [`Executor::claim`]).
async fn claim_statement<X: Executor>(
    exec: &mut X,
    key: &ClaimKey,
    wait: Option<Duration>,
    token: bool,
) -> diesel::QueryResult<Answer> {
    require_transaction(exec.status())?;
    let bound = claim_bound::<X::Backend>(wait);
    let affected = match exec.claim(key, bound, token).await {
        // A server without the bound's syntax ran nothing: claimed again,
        // unbounded (the backend remembers it for the process).
        Err(error) if bound.is_some() && X::Backend::bounded_claim_refused(&error) => {
            exec.claim(key, None, token).await
        }
        affected => affected,
    };
    let fingerprinted = key.fingerprint().is_some();
    let compares = fingerprinted && X::Backend::FINGERPRINTED_CLAIM_COMPARES;
    match affected {
        // Another fingerprint: the statement changed nothing; the stored
        // claim tells which (read by whoever needs it).
        Err(error) if compares && X::Backend::claim_met_another_fingerprint(&error) => {
            Ok(Answer::Duplicate)
        }
        Err(error) => Err(error),
        Ok(affected) => Ok(match claim_from_affected_rows(affected) {
            Claim::Claimed => Answer::Claimed,
            Claim::Duplicate if compares || !fingerprinted => Answer::DuplicateMatched,
            Claim::Duplicate => Answer::Duplicate,
        }),
    }
}

/// [`claim_statement`], its failure read as a refused key, a copy whose
/// first delivery is still in flight past `wait`, or a database failure.
pub(crate) async fn claim_or_refuse<X: Executor>(
    exec: &mut X,
    key: &ClaimKey,
    wait: Option<Duration>,
    token: bool,
) -> Result<Claim, InboxError> {
    answer_or_refuse(exec, key, wait, token)
        .await
        .map(Claim::from)
}

/// [`claim_or_refuse`], telling a duplicate whose claim compared the
/// fingerprint.
async fn answer_or_refuse<X: Executor>(
    exec: &mut X,
    key: &ClaimKey,
    wait: Option<Duration>,
    token: bool,
) -> Result<Answer, InboxError> {
    let started = Instant::now();
    claim_statement(exec, key, wait, token)
        .await
        .map_err(|error| claim_failure(key, wait, started, error))
}

/// The bound of a claim that waits at most `wait` for a delivery of its
/// key in flight, where the backend bounds claims.
fn claim_bound<DB: InboxBackend>(wait: Option<Duration>) -> Option<ClaimBound> {
    wait.filter(|_| DB::bounds_claims()).map(ClaimBound::of)
}

/// A failed claim of `key` sent at `started`: a copy in flight past `wait`,
/// a refused key, or a database failure.
fn claim_failure(
    key: &ClaimKey,
    wait: Option<Duration>,
    started: Instant,
    error: diesel::result::Error,
) -> InboxError {
    if wait.is_some() && is_lock_wait_timeout(&error) {
        in_progress(key, started.elapsed())
    } else {
        refused_or_database(key, error)
    }
}

/// The answer to a copy whose first delivery is still in flight.
pub(crate) fn in_progress(key: &ClaimKey, waited: Duration) -> InboxError {
    InboxError::InProgress {
        handler: key.handler().as_str().to_owned(),
        message_id: preview(key.message_id()),
        waited,
    }
}

/// The public `claim`: a duplicate of a fingerprinted key is compared with
/// the fingerprint stored with its claim.
pub(crate) async fn claim_checked<X: Executor>(
    exec: &mut X,
    key: &ClaimKey,
) -> diesel::QueryResult<Claim> {
    let answer = answer_or_refuse(exec, key, None, false).await?;
    if answer == Answer::Duplicate {
        duplicate_of(key, stored_claim(exec, key).await?)?;
    }
    Ok(answer.into())
}

/// Claims `key` in the level open on the executor: [`Taken::Claimed`] for
/// a new id, and for an id the running batch claimed for this very message
/// (a nested handler, see [`current`]); otherwise the duplicate is checked
/// against the fingerprint stored with its claim, and the stored result
/// read when `read_result`. The claim waits at most `wait` for a delivery
/// of the same id in flight, and writes the session's claim token if
/// `token` (see [`Executor::claim`]). Given `checked_at_commit`, the
/// transaction whose commit can compare the fingerprint (see
/// [`LateTripwire::end_duplicate_checked`]), a fingerprinted duplicate
/// that reads no result is [`Taken::DuplicateUnchecked`], read nothing.
///
/// [`LateTripwire::end_duplicate_checked`]: crate::backend::LateTripwire::end_duplicate_checked
pub(crate) async fn take<X: Executor>(
    exec: &mut X,
    outermost: bool,
    key: &ClaimKey,
    read_result: bool,
    wait: Option<Duration>,
    token: bool,
    checked_at_commit: Option<LateTripwire>,
) -> Result<Taken, InboxError> {
    let reads_stored = key.fingerprint().is_some() || read_result;
    if outermost && reads_stored && exec.claim_reads_stored(token) {
        match take_reading(exec, key, wait).await {
            // Refused by the server's parser: nothing ran, and the claim
            // and the read go as two statements below (from now on).
            Err(InboxError::Database(cause)) if X::Backend::reading_claim_refused(&cause) => {}
            taken => return taken,
        }
    }
    match answer_or_refuse(exec, key, wait, token).await? {
        Answer::Claimed => Ok(Taken::Claimed),
        Answer::Duplicate | Answer::DuplicateMatched if !outermost && current::is_running(key) => {
            if let Some(fingerprint) = key.fingerprint() {
                store_fingerprint(exec, key, fingerprint).await?;
            }
            Ok(Taken::Claimed)
        }
        Answer::DuplicateMatched if !read_result => Ok(Taken::Duplicate(None)),
        Answer::Duplicate if !read_result && let Some(late) = checked_at_commit => {
            Ok(Taken::DuplicateUnchecked(late))
        }
        Answer::Duplicate | Answer::DuplicateMatched => {
            let row = stored_claim(exec, key).await?;
            duplicate_of(key, row).map(Taken::Duplicate)
        }
    }
}

/// [`take`] by the claim that also reads what the claim it met stored
/// ([`Executor::claim_reads_stored`]): a duplicate's fingerprint and
/// result come in the claim's round trip, unless the claim it met is out
/// of the statement's sight (committed while it waited, or archived), and
/// are read on their own then.
async fn take_reading<X: Executor>(
    exec: &mut X,
    key: &ClaimKey,
    wait: Option<Duration>,
) -> Result<Taken, InboxError> {
    require_transaction(exec.status())?;
    let started = Instant::now();
    let rows = exec
        .claim_reading(key, claim_bound::<X::Backend>(wait))
        .await
        .map_err(|error| claim_failure(key, wait, started, error))?;
    let Some(row) = rows.into_iter().next() else {
        return Err(InboxError::Database(diesel::result::Error::NotFound));
    };
    if row.claimed {
        return Ok(Taken::Claimed);
    }
    let stored = match row.seen {
        true => Some(row.stored),
        false => stored_claim(exec, key).await?,
    };
    duplicate_of(key, stored).map(Taken::Duplicate)
}

/// The fingerprint and result stored with `key`'s claim, wherever the claim
/// sits.
pub(crate) async fn stored_claim<X: Executor>(
    exec: &mut X,
    key: &ClaimKey,
) -> diesel::QueryResult<Option<StoredClaimRow>> {
    let sql = X::Backend::STORED_CLAIM_SQL;
    let binds = key_binds(key);
    if let Some(row) = exec.load_stored_claim(sql.select, &binds).await?.pop() {
        return Ok(Some(row));
    }
    match sql.archived_select {
        Some((present, archived)) if exec.load_flag(present).await? => {
            Ok(exec.load_stored_claim(archived, &binds).await?.pop())
        }
        _ => Ok(None),
    }
}

/// Stores the payload's fingerprint with `key`'s claim, made without one by
/// the running batch, in the batch's transaction: a later delivery of the id
/// with another payload is then a conflict, as it is after a single claim.
async fn store_fingerprint<X: Executor>(
    exec: &mut X,
    key: &ClaimKey,
    fingerprint: &Fingerprint,
) -> diesel::QueryResult<()> {
    let binds = column_binds(fingerprint.as_bytes(), key);
    let sql = X::Backend::STORED_CLAIM_SQL.store_fingerprint;
    exec.execute_bound(sql, &binds).await.map(drop)
}

/// Stores `result` with `key`'s claim, in the transaction that claimed it.
pub(crate) async fn store_result<X: Executor>(
    exec: &mut X,
    key: &ClaimKey,
    result: &[u8],
) -> Result<(), InboxError> {
    let binds = column_binds(result, key);
    let sql = X::Backend::STORED_CLAIM_SQL.store_result;
    exec.execute_bound(sql, &binds)
        .await
        .map(drop)
        .map_err(stored_result_refused)
}

/// Records a failed body of `key` after its handler's level rolled back
/// (`handler_level`), in a short transaction of its own (see
/// [`crate::failure`]); a text the database's encoding cannot store is
/// recorded again in ASCII. `None`: nothing to record at this level (a
/// nested handler: its caller's transaction is still open).
pub(crate) async fn record_failure<X: Executor>(
    exec: &mut X,
    handler_level: &Level,
    key: &ClaimKey,
    failure: &Failure,
    limit: MaxAttempts,
) -> Result<Option<Recorded>, InboxError> {
    if !handler_level.is_outermost() {
        return Ok(None);
    }
    let recorded = match record_in_short_transaction(exec, key, failure, limit).await {
        Err(error) => match failure::retry_in_ascii(&error, failure) {
            Some(ascii) => record_in_short_transaction(exec, key, &ascii, limit).await,
            None => Err(error),
        },
        recorded => recorded,
    };
    recorded.map(Some)
}

/// [`record_failure`]'s short transaction.
async fn record_in_short_transaction<X: Executor>(
    exec: &mut X,
    key: &ClaimKey,
    failure: &Failure,
    limit: MaxAttempts,
) -> Result<Recorded, InboxError> {
    let level = Level::short(exec)?;
    level.begin(exec).await?;
    match write_failure(exec, key, failure, limit).await {
        Ok(Recorded::ProcessedMeanwhile) => {
            level.roll_back(exec).await?;
            Ok(Recorded::ProcessedMeanwhile)
        }
        Ok(recorded) => {
            level.commit(exec).await?;
            Ok(recorded)
        }
        Err(error) => {
            level.roll_back(exec).await?;
            Err(error)
        }
    }
}

/// Counts the attempt and, at the limit or on a rejection, marks the
/// message dead and claims its id (unless a delivery committed it
/// meanwhile).
async fn write_failure<X: Executor>(
    exec: &mut X,
    key: &ClaimKey,
    failure: &Failure,
    limit: MaxAttempts,
) -> Result<Recorded, InboxError> {
    let record = failure::record_attempt_binds(key, failure);
    exec.execute_bound(X::Backend::FAILURE_SQL.record_attempt, &record)
        .await?;
    let rows = match failure::mark_dead::<X::Backend>(key, failure, limit) {
        Some((sql, binds)) => Some(exec.execute_bound(sql, &binds).await?),
        None => None,
    };
    let recorded = failure::recorded(failure, limit, rows);
    if recorded.claims() && claim_or_refuse(exec, key, None, false).await? == Claim::Duplicate {
        return Ok(Recorded::ProcessedMeanwhile);
    }
    Ok(recorded)
}
