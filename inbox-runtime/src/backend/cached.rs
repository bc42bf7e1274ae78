//! One of a backend's fixed statements with its binds, as a Diesel query
//! whose prepared statement the connection keeps in its statement cache
//! (keyed by the statement's text): what the statements a delivery sends
//! run as (recording a failure, storing a result, reading what a claim
//! stored, recording an outgoing message), so each costs one round trip and
//! no parse after its first use on a connection.
//!
//! The text marks where each value goes the backend's own way: `?` for the
//! next bind (MySQL/MariaDB, SQLite), `$n` for the `n`-th (PostgreSQL, where
//! a value may be used twice or out of order). Diesel writes its own
//! placeholders back in their place, in the order the values are pushed.

use diesel::QueryResult;
use diesel::backend::Backend;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, Binary, HasSqlType, Integer, Nullable, Text};

use super::Bind;

/// A fixed statement and its values (see the module's documentation).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CachedStatement<'a> {
    sql: &'static str,
    binds: &'a [Bind<'a>],
}

impl<'a> CachedStatement<'a> {
    /// `sql` (one of the backend's constants) with `binds`.
    pub(crate) fn new(sql: &'static str, binds: &'a [Bind<'a>]) -> Self {
        CachedStatement { sql, binds }
    }

    /// Pushes the `index`-th value, or refuses a statement that names a
    /// value it was not given.
    fn push_bind<'b, DB>(&'b self, index: usize, out: &mut AstPass<'_, 'b, DB>) -> QueryResult<()>
    where
        DB: Backend
            + HasSqlType<Text>
            + HasSqlType<Integer>
            + HasSqlType<BigInt>
            + HasSqlType<Binary>,
        str: ToSql<Text, DB>,
        Option<&'a str>: ToSql<Nullable<Text>, DB>,
        i32: ToSql<Integer, DB>,
        i64: ToSql<BigInt, DB>,
        Option<i64>: ToSql<Nullable<BigInt>, DB>,
        [u8]: ToSql<Binary, DB>,
    {
        let Some(bind) = self.binds.get(index) else {
            return Err(diesel::result::Error::QueryBuilderError(
                format!(
                    "the statement names value {} of {}: {}",
                    index + 1,
                    self.binds.len(),
                    self.sql
                )
                .into(),
            ));
        };
        match bind {
            Bind::Text(text) => out.push_bind_param::<Text, str>(text),
            Bind::OptionalText(text) => out.push_bind_param::<Nullable<Text>, _>(text),
            Bind::Integer(value) => out.push_bind_param::<Integer, _>(value),
            Bind::BigInt(value) => out.push_bind_param::<BigInt, _>(value),
            Bind::OptionalBigInt(value) => out.push_bind_param::<Nullable<BigInt>, _>(value),
            Bind::Bytes(bytes) => out.push_bind_param::<Binary, [u8]>(bytes),
        }
    }
}

/// No type of its own: Diesel caches it by its text and bind types.
impl QueryId for CachedStatement<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<'a, DB> QueryFragment<DB> for CachedStatement<'a>
where
    DB: Backend + HasSqlType<Text> + HasSqlType<Integer> + HasSqlType<BigInt> + HasSqlType<Binary>,
    str: ToSql<Text, DB>,
    Option<&'a str>: ToSql<Nullable<Text>, DB>,
    Option<i64>: ToSql<Nullable<BigInt>, DB>,
    i32: ToSql<Integer, DB>,
    i64: ToSql<BigInt, DB>,
    [u8]: ToSql<Binary, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        let mut rest = self.sql;
        let mut next = 0;
        while let Some(at) = rest.find(['?', '$']) {
            out.push_sql(&rest[..at]);
            let after = &rest[at + 1..];
            if rest[at..].starts_with('?') {
                self.push_bind(next, &mut out)?;
                next += 1;
                rest = after;
                continue;
            }
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            match after[..digits].parse::<usize>() {
                Ok(number) if number > 0 => self.push_bind(number - 1, &mut out)?,
                // Not a placeholder: the text as it is.
                _ => out.push_sql("$"),
            }
            rest = &after[digits..];
        }
        out.push_sql(rest);
        Ok(())
    }
}

/// Rows read by column name ([`QueryableByName`](diesel::QueryableByName)),
/// as from `sql_query`.
impl diesel::query_builder::Query for CachedStatement<'_> {
    type SqlType = diesel::sql_types::Untyped;
}

impl<C> diesel::RunQueryDsl<C> for CachedStatement<'_> {}

#[cfg(all(test, any(feature = "postgres", feature = "sqlite")))]
mod tests {
    use super::CachedStatement;
    use crate::backend::Bind;

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_values_are_named_by_number_and_renumbered_in_push_order() {
        let binds = [Bind::Text("id"), Bind::Integer(7), Bind::Text("key")];
        let sql = diesel::debug_query::<diesel::pg::Pg, _>(&CachedStatement::new(
            "WITH k AS (SELECT $3) INSERT INTO t VALUES ($1, $2, $3, '$x')",
            &binds,
        ))
        .to_string();
        assert!(
            sql.starts_with("WITH k AS (SELECT $1) INSERT INTO t VALUES ($2, $3, $4, '$x')"),
            "{sql}"
        );
        assert!(sql.contains(r#"binds: ["key", "id", 7, "key"]"#), "{sql}");
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn question_marks_take_the_values_in_order() {
        let binds = [Bind::Text("a"), Bind::BigInt(2)];
        let sql = diesel::debug_query::<diesel::sqlite::Sqlite, _>(&CachedStatement::new(
            "UPDATE t SET a = ? WHERE b = ?",
            &binds,
        ))
        .to_string();
        assert!(sql.starts_with("UPDATE t SET a = ? WHERE b = ?"), "{sql}");
        assert!(sql.contains(r#"binds: ["a", 2]"#), "{sql}");
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn a_value_the_statement_was_not_given_is_refused() {
        use diesel::prelude::*;
        let mut conn = SqliteConnection::establish(":memory:").unwrap();
        let refused = CachedStatement::new("SELECT ?, ?", &[Bind::Integer(1)]).execute(&mut conn);
        assert!(
            matches!(refused, Err(diesel::result::Error::QueryBuilderError(ref e)) if e.to_string().contains("value 2 of 1")),
            "{refused:?}"
        );
    }
}
