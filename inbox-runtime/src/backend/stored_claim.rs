//! What a claim stores besides its key: the payload's fingerprint and the
//! handler's result (see [`StoredClaimSql`]).

use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{Binary, Bool, Nullable, Untyped};
use diesel::{QueryResult, QueryableByName, RunQueryDsl};

use crate::backend::{ClaimBound, InboxBackend};
use crate::key::ClaimKey;

/// One backend's statements over the `fingerprint` and `result` columns of
/// `inbox_messages`. Each takes its binds in the order given.
#[doc(hidden)]
#[derive(Debug)]
pub struct StoredClaimSql {
    /// The claim's `fingerprint` and `result`: `(handler, message_id)`; no
    /// row when the claim is not in the current table.
    pub(crate) select: &'static str,
    /// Where claims can also sit in archived generations (PostgreSQL's
    /// partitioned layout): a query telling whether that table exists
    /// (`present`), and [`select`](Self::select) there.
    pub(crate) archived_select: Option<(&'static str, &'static str)>,
    /// Stores the handler's result with its claim: `(result, handler,
    /// message_id)`.
    pub(crate) store_result: &'static str,
    /// Stores the payload's fingerprint with a claim made without one (a
    /// batch's, whose body is a fingerprinted handler): `(fingerprint,
    /// handler, message_id)`.
    pub(crate) store_fingerprint: &'static str,
}

/// The `fingerprint` and `result` stored with one claim.
#[derive(QueryableByName, Debug)]
pub struct StoredClaimRow {
    #[diesel(sql_type = Nullable<Binary>)]
    pub(crate) fingerprint: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Binary>)]
    pub(crate) result: Option<Vec<u8>>,
}

/// What a claim that reads what it met returns
/// ([`InboxBackend::walk_reading_claim`](crate::backend::InboxBackend::walk_reading_claim)).
#[derive(QueryableByName, Debug)]
pub struct ReadingClaimRow {
    /// The claim inserted the key.
    #[diesel(sql_type = Bool)]
    pub(crate) claimed: bool,
    /// The claim it met was in the statement's snapshot: `stored` holds
    /// what that claim stored.
    #[diesel(sql_type = Bool)]
    pub(crate) seen: bool,
    #[diesel(embed)]
    pub(crate) stored: StoredClaimRow,
}

/// The claim that reads, for a key already claimed, what that claim stored
/// ([`InboxBackend::walk_reading_claim`]), loaded as one
/// [`ReadingClaimRow`]. Cached by the id of its shape (with a bound or
/// without, a fingerprint or not: `backend::shaped`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadingClaimStatement<'k> {
    pub(crate) key: &'k ClaimKey,
    pub(crate) bound: Option<ClaimBound>,
}

impl QueryId for ReadingClaimStatement<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<DB: InboxBackend> QueryFragment<DB> for ReadingClaimStatement<'_> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        DB::walk_reading_claim(self.key, self.key.fingerprint(), self.bound.as_ref(), out)
    }
}

impl Query for ReadingClaimStatement<'_> {
    type SqlType = Untyped;
}

impl<C> RunQueryDsl<C> for ReadingClaimStatement<'_> {}

/// Fixed by its shape unless its text carries the bound.
impl super::shaped::Shaped for ReadingClaimStatement<'_> {
    type Kind = ReadingClaimStatement<'static>;

    fn shape(&self) -> super::shaped::Shape {
        super::shaped::Shape::of(self.key, self.bound.is_some())
    }

    fn fixed_on<DB: InboxBackend>(&self) -> bool {
        self.bound.is_none() || !DB::BOUND_IN_CLAIM_TEXT
    }
}
