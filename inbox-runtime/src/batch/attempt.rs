//! One transaction over some of a batch's messages, and one message on its
//! own, written once over the delivery core's [`Executor`]: the claims (in
//! statements, or id by id), the bodies, the commit.

use std::collections::HashSet;
use std::time::Duration;

use super::bodies::Bodies;
use super::{
    Attempt, ClaimFailure, ClaimMode, Execute, Pending, attempt_after_body_failure,
    attempt_after_claims_failed, attempt_after_commit, claims_of, lost_after_claims,
    next_claim_mode, one_by_one_failure, sorted_ids, sorted_positions,
};
use crate::backend::{BatchClaimed, ClaimBound, InboxBackend};
use crate::claim::Claim;
use crate::delivery::executor::Executor;
use crate::delivery::level::{Level, Tripwire};
use crate::delivery::single::deliver;
use crate::delivery::steps::claim_or_refuse;
use crate::error::{HandlerError, InboxError};
use crate::execution::{RetryPolicy, leave_broken_if_unusable, require_transaction};
use crate::observe::Delivery;
use crate::options::Options;
use crate::outcome::Outcome;
use crate::recovery::is_lock_wait_timeout;
use crate::stored::Plain;

/// A batch on one executor: how its transactions run, blocking or async.
pub(crate) struct Batch<X, B> {
    pub(crate) exec: X,
    pub(crate) bodies: B,
    pub(crate) options: Options,
}

impl<X, B, M, T, E> Execute<M, T, E> for Batch<X, B>
where
    X: Executor,
    B: Bodies<X::Conn, M, T, E>,
    E: HandlerError,
{
    async fn attempt(&mut self, batch: &[&Pending<'_, M>], values: &mut Vec<T>) -> Attempt<E> {
        let exec = &mut self.exec;
        let mut deliveries: Vec<Delivery> = batch.iter().map(|p| Delivery::start(&p.key)).collect();
        let level = match Level::of_handler(exec) {
            Ok(level) => level,
            Err(error) => return Attempt::Trouble(0, E::from(error), Vec::new()),
        };
        let wait = match level.is_outermost() {
            true => self.options.resolved_claim_wait().bound(),
            false => None,
        };
        let (claims, tripwire) = match claim_all(exec, &level, batch, wait).await {
            Ok(claimed) => claimed,
            Err(failure) => return attempt_after_claims_failed(failure),
        };
        deliveries.iter_mut().for_each(Delivery::claimed);
        let ran = (self.bodies)
            .run(exec.conn(), batch, &claims, &deliveries, values)
            .await;
        if let Err((at, failure)) = ran {
            let rolled_back = level.roll_back(exec).await;
            return attempt_after_body_failure(at, failure, rolled_back, &claims);
        }
        let committed = level.commit_after_claim(exec, tripwire).await;
        let broken = exec.status().transaction_depth().is_err();
        attempt_after_commit(committed, broken, deliveries, batch, claims)
    }

    fn is_broken(&mut self) -> bool {
        self.exec.status().transaction_depth().is_err()
    }

    fn leave_broken_if_unusable(&mut self, error: &E) {
        leave_broken_if_unusable(self.exec.status(), error);
    }

    async fn alone(&mut self, pending: &Pending<'_, M>) -> Result<Outcome<T>, E> {
        let bodies = &mut self.bodies;
        deliver::<Plain, _, _, _, _>(
            &mut self.exec,
            pending.key.clone(),
            self.options,
            async |conn: &mut X::Conn| bodies.one(conn, pending).await.map(Outcome::Processed),
        )
        .await
    }
}

/// Begins the batch's level and claims every id in it (see
/// [`next_claim_mode`] for the tries), each claim waiting at most `wait` for
/// a delivery of its id in flight. Returns the claims in batch order, with
/// the level open, its tripwire armed if a body is to run.
async fn claim_all<X: Executor, M>(
    exec: &mut X,
    level: &Level,
    batch: &[&Pending<'_, M>],
    wait: Option<Duration>,
) -> Result<(Vec<Claim>, Tripwire), ClaimFailure> {
    let mut tries = RetryPolicy::CLAIM.tries();
    let mut mode = ClaimMode::Statements;
    loop {
        let mut tripwire = level
            .begin_for_claim(exec)
            .await
            .map_err(ClaimFailure::Trouble)?;
        let claimed = match mode {
            ClaimMode::Statements => claim_in_statements(exec, batch, wait).await,
            ClaimMode::OneByOne => claim_each(exec, batch, wait).await.map(Some),
        };
        let failure = match claimed {
            Ok(Some(claims)) if !claims.contains(&Claim::Claimed) => {
                return Ok((claims, tripwire));
            }
            Ok(Some(claims)) => match level.arm(exec, &mut tripwire).await {
                Ok(()) => return Ok((claims, tripwire)),
                Err(error) => Some(ClaimFailure::Trouble(error)),
            },
            Ok(None) => None,
            Err(failure) => Some(failure),
        };
        if let Err(rollback_error) = level.roll_back(exec).await {
            return Err(lost_after_claims(failure, rollback_error));
        }
        mode = next_claim_mode(failure, mode, &level.scope, &mut tries)?;
    }
}

/// The claims of `batch` in as few statements as the backend's parameter
/// limit allows, over the ids in sorted order; `None` when a statement
/// could not tell which ids it inserted, or gave up waiting (past `wait`)
/// for an id whose delivery is in flight without saying which: the claims
/// are then made id by id, each bounded, so that only that message is
/// answered `InProgress`.
async fn claim_in_statements<X: Executor, M>(
    exec: &mut X,
    batch: &[&Pending<'_, M>],
    wait: Option<Duration>,
) -> Result<Option<Vec<Claim>>, ClaimFailure> {
    require_transaction(exec.status())
        .map_err(|error| ClaimFailure::Trouble(InboxError::Database(error)))?;
    let handler = batch[0].key.handler().as_str();
    let ids = sorted_ids(batch);
    let bound = wait
        .filter(|_| X::Backend::bounds_claims())
        .map(ClaimBound::of);
    let mut inserted = HashSet::with_capacity(ids.len());
    for statement in ids.chunks(X::Backend::MAX_CLAIMS_PER_STATEMENT) {
        match exec.claim_batch(handler, statement, bound.as_ref()).await {
            Ok(BatchClaimed::Inserted(new)) => inserted.extend(new),
            Ok(BatchClaimed::Mixed) => return Ok(None),
            Err(error) if wait.is_some() && is_lock_wait_timeout(&error) => return Ok(None),
            Err(error) => return Err(ClaimFailure::Trouble(InboxError::Database(error))),
        }
    }
    Ok(Some(claims_of(batch, &inserted)))
}

/// The claims of `batch`, one statement per id, in sorted order, each
/// waiting at most `wait` for a delivery of its id in flight.
async fn claim_each<X: Executor, M>(
    exec: &mut X,
    batch: &[&Pending<'_, M>],
    wait: Option<Duration>,
) -> Result<Vec<Claim>, ClaimFailure> {
    let mut claims = vec![Claim::Duplicate; batch.len()];
    for position in sorted_positions(batch) {
        claims[position] = claim_or_refuse(exec, &batch[position].key, wait, false)
            .await
            .map_err(|error| one_by_one_failure(position, error))?;
    }
    Ok(claims)
}
