//! The rows the operator surface reads from `inbox_failures` (see
//! [`FailureSql`](super::FailureSql)).

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool, Integer, Text};

/// One dead message, as [`FailureSql::list_dead`](super::FailureSql) reads it.
#[derive(QueryableByName)]
pub struct DeadLetterRow {
    #[diesel(sql_type = Text)]
    pub(crate) handler: String,
    #[diesel(sql_type = Text)]
    pub(crate) message_id: String,
    #[diesel(sql_type = Integer)]
    pub(crate) attempts: i32,
    #[diesel(sql_type = Text)]
    pub(crate) last_error: String,
    #[diesel(sql_type = Bool)]
    pub(crate) rejected: bool,
    #[diesel(sql_type = BigInt)]
    pub(crate) first_failed_micros: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) last_failed_micros: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) dead_micros: i64,
}

/// Dead messages of one handler.
#[derive(QueryableByName)]
pub struct SummaryRow {
    #[diesel(sql_type = Text)]
    pub(crate) handler: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) dead: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) oldest_micros: i64,
}

/// A yes-or-no answer.
#[derive(QueryableByName)]
pub struct Present {
    #[diesel(sql_type = Bool)]
    pub(crate) present: bool,
}
