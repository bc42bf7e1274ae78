//! Claiming a message id: the one statement that makes a delivery the
//! first, and what its answer means (the statements run through the
//! delivery core, `delivery::steps`).

use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::{QueryResult, RunQueryDsl};

use crate::backend::{Bind, ClaimBound, InboxBackend, StoredClaimRow};
use crate::error::{InboxError, PayloadConflict};
use crate::fingerprint::Fingerprint;
use crate::key::{ClaimKey, preview};
use crate::recovery::{is_refused_key_text, is_transaction_aborted};

/// Whether a claim made this delivery the first one for its key.
///
/// ```
/// assert_ne!(inbox_runtime::Claim::Claimed, inbox_runtime::Claim::Duplicate);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "a duplicate claim means the message's effects must not be applied again"]
pub enum Claim {
    /// The id was not in the inbox: this transaction now holds it and must
    /// apply the message's effects.
    Claimed,
    /// The id is already in the inbox (committed by an earlier delivery):
    /// apply nothing.
    Duplicate,
}

/// What a failed claim statement means: the database refused the key's text
/// (an invalid message, never retried), or a database failure.
pub(crate) fn refused_or_database(key: &ClaimKey, error: diesel::result::Error) -> InboxError {
    if is_refused_key_text(&error) {
        key.refused_by_database()
    } else {
        InboxError::Database(error)
    }
}

/// What a delivery's claim found: the id is now this transaction's, or it
/// was already claimed, with the result stored with that claim (read only
/// when asked for).
#[derive(Debug)]
pub(crate) enum Taken {
    /// Claimed now: the body runs.
    Claimed,
    /// Already claimed, by a delivery with the same fingerprint (or none):
    /// the body does not run.
    Duplicate(Option<Vec<u8>>),
    /// Already claimed, the stored fingerprint not read: the duplicate's
    /// commit, in the transaction this begin began, compares it
    /// ([`LateTripwire::end_duplicate_checked`]) and fails if it differs.
    /// The body does not run.
    ///
    /// [`LateTripwire::end_duplicate_checked`]: crate::backend::LateTripwire::end_duplicate_checked
    DuplicateUnchecked(crate::backend::LateTripwire),
}

pub(crate) use crate::backend::key_binds;

/// `(value, handler, message_id)` as binds: a statement setting one column
/// of `key`'s claim to `value`.
pub(crate) fn column_binds<'a>(value: &'a [u8], key: &'a ClaimKey) -> [Bind<'a>; 3] {
    let [handler, message_id] = key_binds(key);
    [Bind::Bytes(value), handler, message_id]
}

/// A duplicate of `key`, whose claim stores `row`: its stored result, or
/// [`InboxError::Conflict`] when the claim's fingerprint is not the
/// delivery's. A claim without a fingerprint (made without one, or before
/// the column existed) matches any; so does a claim no longer found (pruned
/// between the claim statement and this read).
pub(crate) fn duplicate_of(
    key: &ClaimKey,
    row: Option<StoredClaimRow>,
) -> Result<Option<Vec<u8>>, InboxError> {
    let Some(row) = row else {
        return Ok(None);
    };
    if let (Some(delivered), Some(stored)) = (key.fingerprint(), row.fingerprint.as_deref()) {
        if stored != delivered.as_bytes() {
            return Err(InboxError::Conflict(Box::new(PayloadConflict {
                handler: key.handler().as_str().to_owned(),
                message_id: preview(key.message_id()),
                stored: Fingerprint::from_stored(stored),
                delivered: *delivered,
            })));
        }
    }
    Ok(row.result)
}

/// What a failed statement storing a result means: the body ignored a failed
/// statement of its own (PostgreSQL refuses every later statement of the
/// aborted transaction, the inbox's first), or a database failure.
pub(crate) fn stored_result_refused(error: diesel::result::Error) -> InboxError {
    if is_transaction_aborted(&error) {
        InboxError::IgnoredStatementFailure { source: error }
    } else {
        InboxError::Database(error)
    }
}

/// Reads the claim statement's affected-row count: one row inserted means the
/// key is new; zero means it was already there.
pub(crate) fn claim_from_affected_rows(affected: usize) -> Claim {
    match affected {
        0 => Claim::Duplicate,
        _ => Claim::Claimed,
    }
}

/// The claim as a Diesel query: the same statement serves blocking and async
/// connections, and reports one affected row for a new key, zero for a
/// duplicate.
///
/// ```
/// # #[cfg(feature = "postgres")] {
/// use inbox_runtime::{ClaimKey, ClaimStatement, HandlerName};
/// let key = ClaimKey::new(HandlerName::new("h")?, "m")?;
/// let sql = diesel::debug_query::<diesel::pg::Pg, _>(&ClaimStatement::new(&key)).to_string();
/// assert!(sql.starts_with("INSERT INTO inbox_messages (handler, message_id) VALUES ($1, $2) ON CONFLICT"));
/// # }
/// # Ok::<(), inbox_runtime::InboxError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ClaimStatement<'k> {
    key: &'k ClaimKey,
}

impl<'k> ClaimStatement<'k> {
    /// The claim statement for `key`.
    ///
    /// ```
    /// # use inbox_runtime::{ClaimKey, ClaimStatement, HandlerName};
    /// let key = ClaimKey::new(HandlerName::new("h")?, "m")?;
    /// let _statement = ClaimStatement::new(&key);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn new(key: &'k ClaimKey) -> Self {
        ClaimStatement { key }
    }
}

/// The statement's text depends only on the backend, so prepared statements
/// are cached under one id.
#[doc(hidden)]
#[derive(Debug)]
pub struct ClaimStatementId;

impl QueryId for ClaimStatement<'_> {
    type QueryId = ClaimStatementId;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<DB: InboxBackend> QueryFragment<DB> for ClaimStatement<'_> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        DB::walk_claim(self.key, None, out)
    }
}

impl<C> RunQueryDsl<C> for ClaimStatement<'_> {}

/// The claim that also stores the payload's fingerprint: a statement of its
/// own, with its own cache id (a prepared statement is cached by its type,
/// so the two texts must not share one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FingerprintedClaimStatement<'k> {
    pub(crate) key: &'k ClaimKey,
    pub(crate) fingerprint: &'k Fingerprint,
}

/// See [`FingerprintedClaimStatement`].
#[doc(hidden)]
#[derive(Debug)]
pub struct FingerprintedClaimStatementId;

impl QueryId for FingerprintedClaimStatement<'_> {
    type QueryId = FingerprintedClaimStatementId;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<DB: InboxBackend> QueryFragment<DB> for FingerprintedClaimStatement<'_> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        DB::walk_claim(self.key, Some(self.fingerprint), out)
    }
}

impl<C> RunQueryDsl<C> for FingerprintedClaimStatement<'_> {}

/// The claim that waits at most a bound for a claim of the same key in
/// flight ([`InboxBackend::walk_bounded_claim`]). Its text carries the bound
/// on some backends (MariaDB's `SET STATEMENT`), where Diesel's statement
/// cache keys it by its text; elsewhere it runs with the id of its shape
/// (`backend::shaped`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BoundedClaimStatement<'k> {
    pub(crate) key: &'k ClaimKey,
    pub(crate) bound: ClaimBound,
}

impl QueryId for BoundedClaimStatement<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<DB: InboxBackend> QueryFragment<DB> for BoundedClaimStatement<'_> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        DB::walk_bounded_claim(self.key, self.key.fingerprint(), &self.bound, out)
    }
}

impl<C> RunQueryDsl<C> for BoundedClaimStatement<'_> {}

/// The claim of a single delivery that also writes the session's claim
/// token ([`InboxBackend::walk_token_claim`]), bounded or not.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenClaimStatement<'k> {
    pub(crate) key: &'k ClaimKey,
    pub(crate) bound: Option<ClaimBound>,
}

impl QueryId for TokenClaimStatement<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<DB: InboxBackend> QueryFragment<DB> for TokenClaimStatement<'_> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        DB::walk_token_claim(self.key, self.key.fingerprint(), self.bound.as_ref(), out)
    }
}

impl<C> RunQueryDsl<C> for TokenClaimStatement<'_> {}

/// The commit of a single delivery that checks its claim token
/// ([`InboxBackend::walk_claim_check`]): one text per backend, cached under
/// its type.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClaimCheckStatement<'k> {
    pub(crate) key: &'k ClaimKey,
}

/// See [`ClaimCheckStatement`].
#[doc(hidden)]
#[derive(Debug)]
pub struct ClaimCheckStatementId;

impl QueryId for ClaimCheckStatement<'_> {
    type QueryId = ClaimCheckStatementId;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<DB: InboxBackend> QueryFragment<DB> for ClaimCheckStatement<'_> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        DB::walk_claim_check(self.key, out)
    }
}

impl<C> RunQueryDsl<C> for ClaimCheckStatement<'_> {}

/// Fixed by its shape unless bounded where the bound is in the text.
impl crate::backend::shaped::Shaped for TokenClaimStatement<'_> {
    type Kind = TokenClaimStatement<'static>;

    fn shape(&self) -> crate::backend::shaped::Shape {
        crate::backend::shaped::Shape::of(self.key, self.bound.is_some())
    }

    fn fixed_on<DB: InboxBackend>(&self) -> bool {
        self.bound.is_none() || !DB::BOUND_IN_CLAIM_TEXT
    }
}

/// Fixed by its fingerprint where the bound is a bind.
impl crate::backend::shaped::Shaped for BoundedClaimStatement<'_> {
    type Kind = BoundedClaimStatement<'static>;

    fn shape(&self) -> crate::backend::shaped::Shape {
        crate::backend::shaped::Shape::of(self.key, true)
    }

    fn fixed_on<DB: InboxBackend>(&self) -> bool {
        !DB::BOUND_IN_CLAIM_TEXT
    }
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use std::time::Duration;

    use super::BoundedClaimStatement;
    use crate::backend::ClaimBound;
    use crate::backend::shaped::{assert_one_id_per_text, keys};

    /// On PostgreSQL the bound is a bind: bounded claims share an id
    /// exactly when they share their text, whatever their bound.
    #[test]
    fn bounded_claims_share_an_id_exactly_when_they_share_their_text() {
        let keys = keys();
        let bounds = [
            Duration::from_secs(2),
            Duration::from_millis(7),
            Duration::from_secs(90),
        ];
        assert_one_id_per_text(keys.iter().flat_map(|key| {
            bounds.map(|bound| BoundedClaimStatement {
                key,
                bound: ClaimBound::of(bound),
            })
        }));
    }

    #[cfg(feature = "mysql")]
    mod mysql {
        use std::time::Duration;

        use diesel::mysql::Mysql;
        use diesel::pg::Pg;

        use super::super::BoundedClaimStatement;
        use crate::backend::ClaimBound;
        use crate::backend::shaped::{ByShape, Shaped, by_shape, id_of, sql_of};
        use crate::key::{ClaimKey, HandlerName};

        /// MariaDB writes the bound's value into a bounded claim's text: the
        /// macro runs it keyed by its text, and as a shape it is refused.
        #[test]
        fn a_claim_whose_text_carries_its_bound_keeps_the_key_of_its_text() {
            let plain = ClaimKey::new(HandlerName::new("shapes").unwrap(), "m-1").unwrap();
            let bound = ClaimBound::of(Duration::from_secs(3));
            let statement = BoundedClaimStatement { key: &plain, bound };
            assert!(!statement.fixed_on::<Mysql>());
            assert!(statement.fixed_on::<Pg>());
            assert_eq!(by_shape!(Mysql, statement, |s| id_of(&s)), None);
            assert!(by_shape!(Pg, statement, |s| id_of(&s)).is_some());
            assert!(sql_of::<_, Mysql>(&ByShape::<_, true, false>(statement)).is_err());
            let sql = by_shape!(Mysql, statement, |s| sql_of::<_, Mysql>(&s)).unwrap();
            assert!(sql.contains("innodb_lock_wait_timeout = 3"), "{sql}");
        }
    }
}

#[cfg(all(test, feature = "mysql"))]
mod token_tests {
    use std::time::Duration;

    use diesel::mysql::Mysql;

    use super::{
        ClaimCheckStatement, ClaimStatement, FingerprintedClaimStatement, TokenClaimStatement,
    };
    use crate::backend::ClaimBound;
    use crate::backend::shaped::{by_shape, id_of, keys, sql_of};

    /// A claim that writes the token: unbounded, by the id of its shape
    /// (two share one exactly when they share their text, and none is a
    /// plain claim's); bounded, by its text, which carries the bound. Its
    /// text is the plain claim's with the token's column.
    #[test]
    fn token_claims_share_an_id_exactly_when_they_share_their_text() {
        let keys = keys();
        let mut run = Vec::new();
        for key in &keys {
            for wait in [
                None,
                Some(Duration::from_secs(2)),
                Some(Duration::from_millis(7)),
            ] {
                let statement = TokenClaimStatement {
                    key,
                    bound: wait.map(ClaimBound::of),
                };
                let (id, sql) = by_shape!(Mysql, statement, |s| (
                    id_of(&s),
                    sql_of::<_, Mysql>(&s).unwrap()
                ));
                let columns = match key.fingerprint() {
                    None => "(handler, message_id, claim_token) VALUES (?, ?, @inbox_claim_token)",
                    Some(_) => {
                        "(handler, message_id, fingerprint, claim_token) VALUES (?, ?, ?, @inbox_claim_token)"
                    }
                };
                let insert = format!("INSERT IGNORE INTO inbox_messages {columns}");
                match wait.map(ClaimBound::of) {
                    None => assert_eq!(sql, insert),
                    Some(bound) => {
                        assert_eq!(id, None, "keyed by its text");
                        let seconds = bound.seconds;
                        assert_eq!(
                            sql,
                            format!(
                                "SET STATEMENT innodb_lock_wait_timeout = {seconds} FOR {insert}"
                            )
                        );
                        continue;
                    }
                }
                run.push((id.expect("a static id"), sql));
            }
        }
        for (id, sql) in &run {
            for (other_id, other_sql) in &run {
                assert_eq!(id == other_id, sql == other_sql, "{sql}\n{other_sql}");
            }
        }
        let plain = [
            id_of(&ClaimStatement::new(&keys[0])),
            id_of(&FingerprintedClaimStatement {
                key: &keys[2],
                fingerprint: keys[2].fingerprint().unwrap(),
            }),
        ];
        assert!(run.iter().all(|(id, _)| !plain.contains(&Some(*id))));
    }

    /// The bound's seconds, every digit of the largest: the prefix is
    /// written whole.
    #[test]
    fn a_bounded_token_claim_carries_its_whole_bound() {
        let key = &keys()[0];
        for seconds in [0, 1, 59, u64::MAX] {
            let bound = ClaimBound { millis: 1, seconds };
            let sql = sql_of::<_, Mysql>(&TokenClaimStatement {
                key,
                bound: Some(bound),
            })
            .unwrap();
            assert!(
                sql.starts_with(&format!(
                    "SET STATEMENT innodb_lock_wait_timeout = {seconds} FOR INSERT IGNORE INTO inbox_messages (handler, message_id, claim_token)"
                )),
                "{sql}"
            );
        }
    }

    /// The claim that reads what it met (MariaDB's `RETURNING`): the token
    /// claim's text, an upsert that changes nothing, and the row; by the
    /// id of its shape when unbounded (two share one exactly when they
    /// share their text, and none is a token claim's), by its text when
    /// bounded.
    #[test]
    fn reading_claims_are_token_claims_that_return_the_row() {
        use crate::backend::stored_claim::ReadingClaimStatement;
        let keys = keys();
        let mut run = Vec::new();
        for key in &keys {
            for bound in [None, Some(ClaimBound::of(Duration::from_secs(2)))] {
                let reading = ReadingClaimStatement { key, bound };
                let (id, sql) = by_shape!(Mysql, reading, |s| (
                    id_of(&s),
                    sql_of::<_, Mysql>(&s).unwrap()
                ));
                let token = sql_of::<_, Mysql>(&TokenClaimStatement { key, bound }).unwrap();
                assert_eq!(
                    sql,
                    format!(
                        "{token} ON DUPLICATE KEY UPDATE received_at = received_at \
                         RETURNING claim_token <=> @inbox_claim_token AS claimed, TRUE AS seen, \
                         fingerprint, result"
                    )
                );
                let token_id = by_shape!(Mysql, TokenClaimStatement { key, bound }, |s| id_of(&s));
                match bound {
                    Some(_) => assert_eq!(id, None, "keyed by its text"),
                    None => {
                        assert_ne!(id, token_id);
                        run.push((id.expect("a static id"), sql));
                    }
                }
            }
        }
        for (id, sql) in &run {
            for (other_id, other_sql) in &run {
                assert_eq!(id == other_id, sql == other_sql, "{sql}\n{other_sql}");
            }
        }
    }

    /// The commit that checks the claim token: by its type, the key bound.
    #[test]
    fn the_claim_check_is_one_text_with_the_key_bound() {
        let keys = keys();
        let texts: Vec<String> = keys
            .iter()
            .map(|key| sql_of::<_, Mysql>(&ClaimCheckStatement { key }).unwrap())
            .collect();
        assert!(texts.iter().all(|text| text == &texts[0]));
        assert_eq!(
            texts[0],
            "SET SESSION autocommit = IF(EXISTS(SELECT 1 FROM inbox_messages WHERE handler = ? \
             AND message_id = ? AND claim_token = @inbox_claim_token), 'ON', 'inbox_transaction lost'), \
             SESSION autocommit = @inbox_saved_autocommit"
        );
        assert!(id_of(&ClaimCheckStatement { key: &keys[0] }).is_some());
    }
}
