//! What a claim stores besides its key: the payload's fingerprint and the
//! handler's result (see [`StoredClaimSql`]).

use diesel::QueryableByName;
use diesel::sql_types::{Binary, Nullable};

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
