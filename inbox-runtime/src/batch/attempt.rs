//! One transaction over some of a batch's messages, and one message on its
//! own, written once over the delivery core's [`Executor`]: the claims (in
//! statements, or id by id), the bodies, the commit.

use std::collections::HashSet;

use super::bodies::Bodies;
use super::{
    Attempt, ClaimFailure, ClaimMode, Execute, Pending, attempt_after_body_failure,
    attempt_after_claims_failed, attempt_after_commit, claims_of, lost_after_claims,
    next_claim_mode, one_by_one_failure, sorted_ids, sorted_positions,
};
use crate::attempts::MaxAttempts;
use crate::backend::{BatchClaimed, InboxBackend};
use crate::claim::Claim;
use crate::delivery::executor::Executor;
use crate::delivery::level::Level;
use crate::delivery::single::deliver;
use crate::delivery::steps::claim_or_refuse;
use crate::error::{HandlerError, InboxError};
use crate::execution::{RetryPolicy, require_transaction};
use crate::observe::Delivery;
use crate::outcome::Outcome;
use crate::stored::Plain;

/// A batch on one executor: how its transactions run, blocking or async.
pub(crate) struct Batch<X, B> {
    pub(crate) exec: X,
    pub(crate) bodies: B,
    pub(crate) max_attempts: MaxAttempts,
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
        let claims = match claim_all(exec, &level, batch).await {
            Ok(claims) => claims,
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
        let committed = level.commit(exec).await;
        let broken = exec.status().transaction_depth().is_err();
        attempt_after_commit(committed, broken, deliveries, batch, claims)
    }

    fn is_broken(&mut self) -> bool {
        self.exec.status().transaction_depth().is_err()
    }

    async fn alone(&mut self, pending: &Pending<'_, M>) -> Result<Outcome<T>, E> {
        let bodies = &mut self.bodies;
        deliver::<Plain, _, _, _, _>(
            &mut self.exec,
            pending.key.clone(),
            self.max_attempts,
            async |conn: &mut X::Conn| bodies.one(conn, pending).await.map(Outcome::Processed),
        )
        .await
    }
}

/// Begins the batch's level and claims every id in it (see
/// [`next_claim_mode`] for the tries). Returns the claims in batch order,
/// with the level open.
async fn claim_all<X: Executor, M>(
    exec: &mut X,
    level: &Level,
    batch: &[&Pending<'_, M>],
) -> Result<Vec<Claim>, ClaimFailure> {
    let mut tries = RetryPolicy::CLAIM.tries();
    let mut mode = ClaimMode::Statements;
    loop {
        level.begin(exec).await.map_err(ClaimFailure::Trouble)?;
        let claimed = match mode {
            ClaimMode::Statements => claim_in_statements(exec, batch).await,
            ClaimMode::OneByOne => claim_each(exec, batch).await.map(Some),
        };
        let failure = match claimed {
            Ok(Some(claims)) => return Ok(claims),
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
/// could not tell which ids it inserted.
async fn claim_in_statements<X: Executor, M>(
    exec: &mut X,
    batch: &[&Pending<'_, M>],
) -> Result<Option<Vec<Claim>>, ClaimFailure> {
    require_transaction(exec.status())
        .map_err(|error| ClaimFailure::Trouble(InboxError::Database(error)))?;
    let handler = batch[0].key.handler().as_str();
    let ids = sorted_ids(batch);
    let mut inserted = HashSet::with_capacity(ids.len());
    for statement in ids.chunks(X::Backend::MAX_CLAIMS_PER_STATEMENT) {
        match exec.claim_batch(handler, statement).await {
            Ok(BatchClaimed::Inserted(new)) => inserted.extend(new),
            Ok(BatchClaimed::Mixed) => return Ok(None),
            Err(error) => return Err(ClaimFailure::Trouble(InboxError::Database(error))),
        }
    }
    Ok(Some(claims_of(batch, &inserted)))
}

/// The claims of `batch`, one statement per id, in sorted order.
async fn claim_each<X: Executor, M>(
    exec: &mut X,
    batch: &[&Pending<'_, M>],
) -> Result<Vec<Claim>, ClaimFailure> {
    let mut claims = vec![Claim::Duplicate; batch.len()];
    for position in sorted_positions(batch) {
        claims[position] = claim_or_refuse(exec, &batch[position].key)
            .await
            .map_err(|error| one_by_one_failure(position, error))?;
    }
    Ok(claims)
}
