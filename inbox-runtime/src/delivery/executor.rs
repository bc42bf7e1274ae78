//! How the steps of a delivery reach the database: the one seam between
//! the delivery core (written once, as `async fn`s) and a connection,
//! blocking ([`Blocking`](super::blocking::Blocking)) or diesel-async
//! (`Async`, feature `async`).

use std::future::Future;
use std::time::Duration;

use diesel::QueryResult;
use diesel::connection::TransactionManagerStatus;

use crate::backend::{
    BatchClaimed, Bind, ClaimBound, InboxBackend, ReadingClaimRow, StoredClaimRow,
};
use crate::key::ClaimKey;
use crate::scope::Scope;

/// The statements a delivery runs, on one connection.
///
/// A blocking executor runs each statement when its method is called and
/// returns a [`std::future::Ready`]: a core `async fn` over it completes in
/// one poll ([`block_ready`](crate::execution::block_ready)). An async
/// executor returns diesel-async's futures.
pub(crate) trait Executor {
    /// The backend the inbox's statements are written for.
    type Backend: InboxBackend;
    /// The connection a handler's body gets.
    type Conn;

    /// The connection, for the body.
    fn conn(&mut self) -> &mut Self::Conn;

    /// Diesel's transaction manager status of the connection.
    fn status(&mut self) -> &mut TransactionManagerStatus;

    /// How long the server may keep an outermost transaction of this
    /// executor's idle before it ends it (see
    /// [`Scope::bounded`]): what bounds a dropped async handler's claim.
    /// `None` for blocking connections, which roll back as they unwind.
    fn idle_limit(&self) -> Option<Duration>;

    /// Records that a transaction level is being opened (before its `BEGIN`
    /// is sent) or has ended: an async executor marks the connection broken
    /// if its future is dropped in between.
    fn set_open(&mut self, open: bool);

    /// Whether [`level_sql`](Self::level_sql) costs a round trip per
    /// statement of `scope`'s texts (a blocking MySQL/MariaDB connection's
    /// prepared statements), rather than one per text.
    fn pays_per_statement(&self, scope: &Scope) -> bool;

    /// One of `scope`'s level statements (begin, commit, rollback, the
    /// aborted probe), in one round trip.
    fn level_sql(
        &mut self,
        scope: &Scope,
        sql: &str,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Takes the outermost begin of `scope` to send in one flight with
    /// the claim that follows at once, if this executor does (an async
    /// PostgreSQL connection, see [`pipelined`](super::pipelined), whose
    /// claim then refuses to run unless the level opened): whether it took
    /// it. Otherwise the caller sends the begin now.
    fn hold_begin(&mut self, scope: &Scope) -> bool {
        let _ = scope;
        false
    }

    /// The claim statement for `key` (with its fingerprint, if it has
    /// one), waiting at most `bound` for a claim of the same key in flight
    /// (`None`: as long as the server lets it), and writing the session's
    /// claim token if `token` ([`InboxBackend::walk_token_claim`]): the
    /// rows it inserted.
    fn claim(
        &mut self,
        key: &ClaimKey,
        bound: Option<ClaimBound>,
        token: bool,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Commits a single delivery whose claim of `key` wrote the session's
    /// claim token, if that claim is still there
    /// ([`InboxBackend::walk_claim_check`]).
    fn commit_claim_checked(
        &mut self,
        key: &ClaimKey,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Whether [`claim_reading`](Self::claim_reading) is sent for a claim
    /// that writes the session's claim token if `token`: where the backend
    /// writes a reading claim ([`InboxBackend::claim_reads_stored`]).
    fn claim_reads_stored(&self, token: bool) -> bool {
        Self::Backend::claim_reads_stored(token)
    }

    /// The claim statement for `key` that also reads what the claim it met
    /// stored ([`InboxBackend::walk_reading_claim`]; only where
    /// [`claim_reads_stored`](Self::claim_reads_stored)), bounded as
    /// [`claim`](Self::claim) is: its one row.
    fn claim_reading(
        &mut self,
        key: &ClaimKey,
        bound: Option<ClaimBound>,
    ) -> impl Future<Output = QueryResult<Vec<ReadingClaimRow>>> + Send;

    /// One of the backend's fixed statements with its values, as a
    /// prepared statement the connection caches: the rows it affected.
    fn execute_bound(
        &mut self,
        sql: &'static str,
        binds: &[Bind<'_>],
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// The fingerprint and result stored with a claim (one of the backend's
    /// stored-claim selects).
    fn load_stored_claim(
        &mut self,
        sql: &'static str,
        binds: &[Bind<'_>],
    ) -> impl Future<Output = QueryResult<Vec<StoredClaimRow>>> + Send;

    /// The `present` column of the one row `sql` returns.
    fn load_flag(&mut self, sql: &'static str) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Claims the distinct, sorted `ids` of `handler` in one statement
    /// ([`InboxBackend::claim_batch`]).
    fn claim_batch(
        &mut self,
        handler: &str,
        ids: &[&str],
        bound: Option<&ClaimBound>,
    ) -> impl Future<Output = QueryResult<BatchClaimed>> + Send;
}
