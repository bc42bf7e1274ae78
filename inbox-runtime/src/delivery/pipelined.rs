//! An async PostgreSQL delivery in one round trip fewer (features `async`
//! and `postgres`): the outermost `BEGIN` travels in one flight with the
//! claim after it.
//!
//! diesel-async pipelines the queries it is given through a shared
//! `&AsyncPgConnection`: both are written before either answer is read, and
//! the server runs them in order. A processed message then costs `BEGIN` +
//! claim, the body's statements, the commit; a duplicate `BEGIN` + claim and
//! the commit.
//!
//! What pipelining must not do is let the claim commit on its own: if the
//! `BEGIN` fails (a cancelled statement, an error in its text), the claim
//! after it would run outside a transaction block, commit at once, and the
//! message's effects would never join it. So the held `BEGIN` is sent with
//! a mark of its transaction block ([`PIPELINED_CLAIMING_SQL`], a `SET
//! LOCAL` after it in the same text, skipped when anything before it
//! failed), and the claim is the guarded one
//! ([`PipelinedClaimStatement`]): outside that block it fails and writes
//! nothing. The delivery reports the `BEGIN`'s own error then, after the
//! level's rollback (a `ROLLBACK` outside a block is a warning; one that
//! fails, the connection being gone, makes it `TransactionLost`).
//!
//! The counts above hold once the connection's statement cache holds the
//! claim: preparing it first takes a flight of its own.
//!
//! Only a handler whose connection's type is [`Pipelining`] (diesel-async's
//! `AsyncPgConnection` itself) takes this path: `#[idempotent]` routes it
//! here from the type it sees (see `__private::ConnRoute`). A generic
//! connection type cannot be told apart from the others without bounds the
//! public API does not ask for, so it sends `BEGIN` and the claim one after
//! the other.

use std::time::Duration;

use diesel::QueryResult;
use diesel::connection::TransactionManagerStatus;
use diesel::pg::Pg;
use diesel_async::{AsyncConnection, AsyncConnectionCore, RunQueryDsl, SimpleAsyncConnection};
use futures_util::future::{Either, join};

use super::asynchronous::{Async, ClaimedTransaction};
use super::executor::Executor;
use super::single::{Begun, begin};
use crate::backend::postgres::{
    PIPELINED_CLAIMING_SQL, PipelinedClaimStatement, PipelinedReadingClaimStatement,
};
use crate::backend::shaped::by_shape;
use crate::backend::{BatchClaimed, Bind, ClaimBound, ReadingClaimRow, StoredClaimRow};
use crate::error::InboxError;
use crate::key::ClaimKey;
use crate::options::Options;
use crate::scope::Scope;
use crate::short_text::ShortText;
use crate::stored::Reply;

/// A diesel-async PostgreSQL connection a shared reference to which is a
/// connection too, whose queries diesel-async pipelines: `AsyncPgConnection`.
/// Named by its capability, not its type, so the runtime needs no feature of
/// diesel-async's to use it.
pub trait Pipelining: AsyncConnection<Backend = Pg> + Sync {
    /// The connection behind a shared reference.
    type Shared<'a>: AsyncConnectionCore<Backend = Pg> + SimpleAsyncConnection + Send
    where
        Self: 'a;

    /// `self` as [`Shared`](Self::Shared).
    fn shared(&self) -> Self::Shared<'_>;
}

impl<C> Pipelining for C
where
    C: AsyncConnection<Backend = Pg> + Sync,
    for<'a> &'a C: AsyncConnectionCore<Backend = Pg> + SimpleAsyncConnection + Send,
{
    type Shared<'a>
        = &'a C
    where
        C: 'a;

    fn shared(&self) -> &C {
        self
    }
}

/// [`begin`] on a [`Pipelining`] connection, its `BEGIN` pipelined with the
/// claim: the async front end's `claim_in_new_level` for that connection.
pub(crate) async fn claim_in_new_level<P, R, C>(
    conn: &mut C,
    key: ClaimKey,
    options: Options,
) -> Result<Begun<R, ClaimedTransaction<'_, C>>, InboxError>
where
    P: Reply<R>,
    C: Pipelining,
{
    let mut exec = Pipelined::new(conn);
    Ok(match begin::<P, R, _>(&mut exec, key, options).await? {
        Begun::Claimed(claimed) => {
            // Claimed means the claim ran, which sent the held `BEGIN`.
            debug_assert!(exec.held.is_none(), "a BEGIN held past its claim");
            Begun::Claimed(ClaimedTransaction::new(exec.exec, claimed))
        }
        Begun::Answered(answer) => Begun::Answered(answer),
    })
}

/// The async executor of a [`Pipelining`] connection that holds the
/// outermost `BEGIN` for the claim that follows (see the [module](self)).
pub(crate) struct Pipelined<'c, C: AsyncConnection> {
    exec: Async<'c, C>,
    /// The outermost `BEGIN` not sent yet, with its transaction block's
    /// mark.
    held: Option<ShortText>,
}

impl<'c, C: Pipelining> Pipelined<'c, C> {
    fn new(conn: &'c mut C) -> Self {
        Pipelined {
            exec: Async::new(conn),
            held: None,
        }
    }

    /// Sends the held `BEGIN`, if any, on its own: for a statement other
    /// than the claim (the delivery core sends none before the claim).
    fn flush(&mut self) -> impl Future<Output = QueryResult<()>> + Send {
        let held = self.held.take();
        let mut conn = self.exec.conn().shared();
        async move {
            match held {
                Some(begin) => conn.batch_execute(&begin).await,
                None => Ok(()),
            }
        }
    }
}

/// The held `BEGIN` and the statement after it, written together: both are
/// sent by their first polls, the `BEGIN` first, before either answer is
/// read. The `BEGIN`'s failure is the one reported (the statement then
/// failed on its guard, or in the aborted block, and wrote nothing).
async fn after_begin<T>(
    mut conn: impl SimpleAsyncConnection,
    begin: &str,
    statement: impl Future<Output = QueryResult<T>>,
) -> QueryResult<T> {
    let (begun, done) = join(conn.batch_execute(begin), statement).await;
    begun?;
    done
}

/// The guarded reading claim's row, loaded on `conn` (a future of its own
/// type, `Send` for every lifetime of the connection's rows).
fn load_reading_claim<'a, S>(
    conn: &'a mut S,
    key: &'a ClaimKey,
    bound: Option<ClaimBound>,
) -> impl Future<Output = QueryResult<Vec<ReadingClaimRow>>> + Send + 'a
where
    S: AsyncConnectionCore<Backend = Pg> + Send,
{
    let statement = PipelinedReadingClaimStatement { key, bound };
    async move { by_shape!(Pg, statement, |claim| claim.load(conn).await) }
}

impl<C: Pipelining> Executor for Pipelined<'_, C> {
    type Backend = Pg;
    type Conn = C;

    fn conn(&mut self) -> &mut C {
        self.exec.conn()
    }

    fn status(&mut self) -> &mut TransactionManagerStatus {
        self.exec.status()
    }

    fn idle_limit(&self) -> Option<Duration> {
        self.exec.idle_limit()
    }

    fn set_open(&mut self, open: bool) {
        self.exec.set_open(open);
    }

    fn pays_per_statement(&self, scope: &Scope) -> bool {
        self.exec.pays_per_statement(scope)
    }

    async fn level_sql(&mut self, scope: &Scope, sql: &str) -> QueryResult<()> {
        self.flush().await?;
        self.exec.level_sql(scope, sql).await
    }

    /// Holds an outermost `BEGIN`, with the mark of its transaction block,
    /// for the claim. A savepoint it does not take: the caller sends it at
    /// once, through [`level_sql`](Executor::level_sql) (the caller's
    /// transaction is open already).
    fn hold_begin(&mut self, scope: &Scope) -> bool {
        if self.held.is_some() {
            // Never: a held `BEGIN` goes with the claim or before any other
            // statement. Were one left, it is sent first, then this level's.
            return false;
        }
        self.held = scope.outermost_begin_then(PIPELINED_CLAIMING_SQL);
        self.held.is_some()
    }

    fn claim(
        &mut self,
        key: &ClaimKey,
        bound: Option<ClaimBound>,
        token: bool,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        match self.held.take() {
            None => Either::Left(self.exec.claim(key, bound, token)),
            Some(begin) => {
                let conn: &C = self.exec.conn();
                Either::Right(async move {
                    let mut claim_conn = conn.shared();
                    // Built when first polled, after the `BEGIN`'s first
                    // poll: instrumentation sees them in their order.
                    let claim = async {
                        let statement = PipelinedClaimStatement { key, bound };
                        by_shape!(Pg, statement, |claim| claim.execute(&mut claim_conn).await)
                    };
                    after_begin(conn.shared(), &begin, claim).await
                })
            }
        }
    }

    fn commit_claim_checked(
        &mut self,
        key: &ClaimKey,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        self.exec.commit_claim_checked(key)
    }

    fn claim_reading(
        &mut self,
        key: &ClaimKey,
        bound: Option<ClaimBound>,
    ) -> impl Future<Output = QueryResult<Vec<ReadingClaimRow>>> + Send {
        match self.held.take() {
            None => Either::Left(self.exec.claim_reading(key, bound)),
            Some(begin) => {
                let conn: &C = self.exec.conn();
                Either::Right(async move {
                    let mut claim_conn = conn.shared();
                    let claim = async { load_reading_claim(&mut claim_conn, key, bound).await };
                    after_begin(conn.shared(), &begin, claim).await
                })
            }
        }
    }

    async fn execute_bound(&mut self, sql: &'static str, binds: &[Bind<'_>]) -> QueryResult<usize> {
        self.flush().await?;
        self.exec.execute_bound(sql, binds).await
    }

    async fn load_stored_claim(
        &mut self,
        sql: &'static str,
        binds: &[Bind<'_>],
    ) -> QueryResult<Vec<StoredClaimRow>> {
        self.flush().await?;
        self.exec.load_stored_claim(sql, binds).await
    }

    async fn load_flag(&mut self, sql: &'static str) -> QueryResult<bool> {
        self.flush().await?;
        self.exec.load_flag(sql).await
    }

    async fn claim_batch(
        &mut self,
        handler: &str,
        ids: &[&str],
        bound: Option<&ClaimBound>,
    ) -> QueryResult<BatchClaimed> {
        self.flush().await?;
        self.exec.claim_batch(handler, ids, bound).await
    }
}
