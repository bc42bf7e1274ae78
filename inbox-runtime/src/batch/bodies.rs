//! How a batch runs the bodies of its messages: a body per message
//! ([`Each`]) or one for all the new messages of a transaction ([`Bulk`]),
//! as async closures (a blocking front end wraps its closures in ones that
//! do not await).

use super::{BodyFailure, Pending, claimed};
use crate::claim::Claim;
use crate::delivery::current;
use crate::execution::caught;
use crate::observe::Delivery;

/// The bodies of a batch's messages, on connection type `C`.
pub(crate) trait Bodies<C, M, T, E> {
    /// Runs the bodies of the messages of `batch` whose ids were claimed
    /// (`claims`), in order, pushing their values: on failure, the position
    /// of the message it failed on, if it says (`None`: a bulk body), and
    /// the failure.
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
pub(crate) struct Each<F>(pub(crate) F);

impl<C, M, T, E, F> Bodies<C, M, T, E> for Each<F>
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
            let body = current::running([&pending.key], (self.0)(conn, pending.message));
            match deliveries[position].scope().instrument(caught(body)).await {
                Ok(Ok(value)) => values.push(value),
                Ok(Err(error)) => return Err((Some(position), BodyFailure::Error(error))),
                Err(panic) => return Err((Some(position), BodyFailure::Panic(panic))),
            }
        }
        Ok(())
    }

    async fn one(&mut self, conn: &mut C, pending: &Pending<'_, M>) -> Result<T, E> {
        current::running([&pending.key], (self.0)(conn, pending.message)).await
    }
}

/// One body for all the messages claimed.
pub(crate) struct Bulk<F>(pub(crate) F);

impl<C, M, E, F> Bodies<C, M, (), E> for Bulk<F>
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
        match caught(current::running(keys, (self.0)(conn, &messages))).await {
            Ok(Ok(())) => {
                values.extend(new.iter().map(|_| ()));
                Ok(())
            }
            Ok(Err(error)) => Err((None, BodyFailure::Error(error))),
            Err(panic) => Err((None, BodyFailure::Panic(panic))),
        }
    }

    async fn one(&mut self, conn: &mut C, pending: &Pending<'_, M>) -> Result<(), E> {
        current::running([&pending.key], (self.0)(conn, &[pending.message])).await
    }
}
