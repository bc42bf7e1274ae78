//! Claim statements cached by their shape.
//!
//! A claim's text depends on whether it is bounded and whether it stores a
//! fingerprint, and on nothing else where the bound travels as a bind
//! (PostgreSQL) or is not written at all (SQLite, whose claims wait as the
//! connection's `busy_timeout` says). Diesel's statement cache keys a statement that has
//! no static id by its text: it writes the whole statement out, and copies
//! its bind types, on every execution just to look it up (diesel-async's
//! PostgreSQL connection writes every statement's text out regardless; the
//! id still spares it the key's copy and hash). [`by_shape!`]
//! runs such a claim as [`ByShape`], whose id is a type per shape, so each
//! shape is prepared once per connection and found again by that type.
//!
//! A claim whose text carries more than its shape (MariaDB's bounded claim
//! writes the bound's value into it) keeps the key of its text:
//! [`Shaped::fixed_on`] says which, and [`by_shape!`] runs it as it is.

use diesel::QueryResult;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};

use super::InboxBackend;

/// Which parts a claim statement's text has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// The claim waits at most a bound for a claim of the same key.
    pub(crate) bounded: bool,
    /// The claim stores the payload's fingerprint.
    pub(crate) fingerprinted: bool,
}

impl Shape {
    /// The shape of a claim of `key` (fingerprinted when the key carries
    /// a fingerprint), `bounded` or not.
    pub(crate) fn of(key: &crate::key::ClaimKey, bounded: bool) -> Shape {
        Shape {
            bounded,
            fingerprinted: key.fingerprint().is_some(),
        }
    }
}

/// A claim statement whose text its [`Shape`] fixes, on the backends that
/// [`fixed_on`](Self::fixed_on) names.
pub(crate) trait Shaped {
    /// The statement's own type with its lifetimes `'static`: part of the
    /// id of each of its shapes.
    type Kind: 'static;

    /// The parts this statement's text has.
    fn shape(&self) -> Shape;

    /// Whether on `DB` the statement's text is fixed by its shape.
    fn fixed_on<DB: InboxBackend>(&self) -> bool;
}

/// `S` with the statement-cache id of the shape `BOUNDED`, `FINGERPRINTED`.
/// Built by [`by_shape!`], which picks the shape the statement has; a
/// statement of another shape, or on a backend where its text is not
/// fixed, is refused when written out, never run under another's id.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ByShape<S, const BOUNDED: bool, const FINGERPRINTED: bool>(pub(crate) S);

impl<S: Shaped, const BOUNDED: bool, const FINGERPRINTED: bool> QueryId
    for ByShape<S, BOUNDED, FINGERPRINTED>
{
    type QueryId = ByShape<S::Kind, BOUNDED, FINGERPRINTED>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<S, DB, const BOUNDED: bool, const FINGERPRINTED: bool> QueryFragment<DB>
    for ByShape<S, BOUNDED, FINGERPRINTED>
where
    S: Shaped + QueryFragment<DB>,
    DB: InboxBackend,
{
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        let expected = Shape {
            bounded: BOUNDED,
            fingerprinted: FINGERPRINTED,
        };
        if self.0.shape() != expected || !self.0.fixed_on::<DB>() {
            return Err(diesel::result::Error::QueryBuilderError(
                "a claim statement was given the cache id of another shape".into(),
            ));
        }
        self.0.walk_ast(out)
    }
}

impl<S: Query, const BOUNDED: bool, const FINGERPRINTED: bool> Query
    for ByShape<S, BOUNDED, FINGERPRINTED>
{
    type SqlType = S::SqlType;
}

impl<S, C, const BOUNDED: bool, const FINGERPRINTED: bool> diesel::RunQueryDsl<C>
    for ByShape<S, BOUNDED, FINGERPRINTED>
{
}

/// Runs `$run` with `$s` bound to `$statement` as the [`ByShape`] of its
/// shape, or as it is where its text is not fixed on `$db`: one arm per
/// shape, each of its own type (an `.await` in `$run` is fine).
macro_rules! by_shape {
    ($db:ty, $statement:expr, |$s:ident| $run:expr) => {{
        use $crate::backend::shaped::{ByShape, Shape, Shaped};
        let statement = $statement;
        if !Shaped::fixed_on::<$db>(&statement) {
            let $s = statement;
            $run
        } else {
            match Shaped::shape(&statement) {
                Shape {
                    bounded: false,
                    fingerprinted: false,
                } => {
                    let $s = ByShape::<_, false, false>(statement);
                    $run
                }
                Shape {
                    bounded: false,
                    fingerprinted: true,
                } => {
                    let $s = ByShape::<_, false, true>(statement);
                    $run
                }
                Shape {
                    bounded: true,
                    fingerprinted: false,
                } => {
                    let $s = ByShape::<_, true, false>(statement);
                    $run
                }
                Shape {
                    bounded: true,
                    fingerprinted: true,
                } => {
                    let $s = ByShape::<_, true, true>(statement);
                    $run
                }
            }
        }
    }};
}
pub(crate) use by_shape;

/// The statement-cache id a statement runs with (`None`: its text).
#[cfg(all(test, any(feature = "postgres", feature = "mysql")))]
pub(crate) fn id_of<T: QueryId>(_: &T) -> Option<std::any::TypeId> {
    T::query_id()
}

#[cfg(all(test, any(feature = "postgres", feature = "mysql")))]
pub(crate) fn sql_of<T: QueryFragment<DB>, DB: InboxBackend + Default>(
    statement: &T,
) -> diesel::QueryResult<String>
where
    DB::QueryBuilder: Default,
{
    let mut builder = DB::QueryBuilder::default();
    statement.to_sql(&mut builder, &DB::default())?;
    Ok(diesel::query_builder::QueryBuilder::finish(builder))
}

/// Keys of every kind a claim statement meets: two handlers and ids, with
/// and without fingerprints (of different payloads).
#[cfg(all(test, any(feature = "postgres", feature = "mysql")))]
pub(crate) fn keys() -> Vec<crate::key::ClaimKey> {
    use crate::fingerprint::Fingerprint;
    use crate::key::{ClaimKey, HandlerName};
    let key = |handler: &'static str, id: &str| {
        ClaimKey::new(HandlerName::new(handler).unwrap(), id).unwrap()
    };
    let print = |payload: &[u8]| Fingerprint::of(payload).unwrap();
    vec![
        key("shapes", "m-1"),
        key("other.handler", "a-much-longer-message-id-2"),
        key("shapes", "m-1").with_fingerprint(print(b"payload")),
        key("other.handler", "m-3").with_fingerprint(print(b"another payload")),
    ]
}

/// Runs each of `statements` through [`by_shape!`] on PostgreSQL and checks
/// what makes the static ids sound: every one has a static id, and two
/// share an id exactly when they share their text.
#[cfg(all(test, feature = "postgres"))]
pub(crate) fn assert_one_id_per_text<S>(statements: impl IntoIterator<Item = S>)
where
    S: Shaped + QueryFragment<diesel::pg::Pg> + QueryId,
{
    use diesel::pg::Pg;
    let run: Vec<(std::any::TypeId, String)> = statements
        .into_iter()
        .map(|statement| {
            let (id, sql) = by_shape!(Pg, statement, |s| (id_of(&s), sql_of::<_, Pg>(&s)));
            (id.expect("a static id"), sql.expect("written out"))
        })
        .collect();
    for (id, sql) in &run {
        for (other_id, other_sql) in &run {
            assert_eq!(id == other_id, sql == other_sql, "{sql}\n{other_sql}");
        }
    }
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use std::time::Duration;

    use diesel::pg::Pg;

    use super::{ByShape, assert_one_id_per_text, sql_of};
    use crate::backend::ClaimBound;
    use crate::backend::postgres::PipelinedClaimStatement;
    use crate::backend::stored_claim::ReadingClaimStatement;

    /// Each shape has an id of its own, the macro picks the one of the
    /// statement's shape, and two statements share an id exactly when they
    /// share their text: the guarded claims, plain and reading, and the
    /// reading claim, over every kind of key and bound.
    #[test]
    fn statements_share_an_id_exactly_when_they_share_their_text() {
        let keys = super::keys();
        let bounds = [
            None,
            Some(Duration::from_secs(2)),
            Some(Duration::from_millis(7)),
        ];
        let every = || {
            keys.iter()
                .flat_map(|key| bounds.map(move |bound| (key, bound)))
        };
        let pipelined: Vec<_> = every()
            .map(|(key, bound)| PipelinedClaimStatement::new(key, bound))
            .collect();
        let shapes: std::collections::HashSet<_> = pipelined
            .iter()
            .map(super::Shaped::shape)
            .map(|shape| (shape.bounded, shape.fingerprinted))
            .collect();
        assert_eq!(shapes.len(), 4, "every shape is met");
        assert_one_id_per_text(pipelined);
        #[cfg(feature = "async")]
        assert_one_id_per_text(every().map(|(key, bound)| {
            crate::backend::postgres::PipelinedReadingClaimStatement {
                key,
                bound: bound.map(ClaimBound::of),
            }
        }));
        assert_one_id_per_text(every().map(|(key, bound)| ReadingClaimStatement {
            key,
            bound: bound.map(ClaimBound::of),
        }));
    }

    /// A statement given the id of another shape is refused when written
    /// out (so it never runs as the statement cached under that id).
    #[test]
    fn a_statement_under_another_shapes_id_is_refused() {
        let plain = &super::keys()[0];
        let statement = PipelinedClaimStatement::new(plain, None);
        assert!(sql_of::<_, Pg>(&ByShape::<_, false, false>(statement)).is_ok());
        for wrong in [
            sql_of::<_, Pg>(&ByShape::<_, true, false>(statement)),
            sql_of::<_, Pg>(&ByShape::<_, false, true>(statement)),
            sql_of::<_, Pg>(&ByShape::<_, true, true>(statement)),
        ] {
            assert!(wrong.is_err());
        }
    }
}
