//! What "the database did not change" means, per backend: a digest of each
//! table (its row count and a hash of its rows, in an order of their own),
//! read in one statement per table. One file per backend holds its SQL.
//!
//! | backend | tables | a table's digest |
//! |---|---|---|
//! | PostgreSQL | base tables of `current_schema()` (`information_schema.tables`) | `count(*)` and `md5(string_agg(md5(ROW(t.*)::text), '' ORDER BY md5(ROW(t.*)::text)))` |
//! | MySQL, MariaDB | base tables of `DATABASE()` (`information_schema.tables`) | `COUNT(*)`, and sums and an XOR of each row's `MD5(CONCAT_WS(',', QUOTE(col), …))` |
//! | SQLite | `sqlite_master`'s tables (not `sqlite_%`) | every row as `quote(col) \|\| ',' \|\| …`, sorted, hashed by the caller |
//!
//! Diesel's `__diesel_schema_migrations` is left out everywhere.

// Without a backend feature nothing implements the trait, and its helpers
// go unused.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
    allow(dead_code)
)]

use std::collections::BTreeMap;

use diesel::QueryableByName;
use diesel::backend::Backend;
use diesel::sql_types::{BigInt, Text};

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

/// The table Diesel records applied migrations in: never compared (a
/// handler does not run migrations).
pub(crate) const DIESEL_MIGRATIONS_TABLE: &str = "__diesel_schema_migrations";

/// A backend whose tables [`check_idempotent`](super::check_idempotent) can
/// digest: PostgreSQL (feature `postgres`), SQLite (`sqlite`) and
/// MySQL/MariaDB (`mysql`). Sealed: its SQL lives in `inbox-runtime`, one
/// file per backend under `src/testing/digest/`.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// fn digestible<B: inbox_runtime::testing::DigestBackend>() {}
/// digestible::<diesel::sqlite::Sqlite>();
/// # }
/// ```
#[diagnostic::on_unimplemented(
    message = "`inbox_runtime::testing` cannot compare the tables of the `{Self}` backend",
    note = "it supports PostgreSQL, SQLite and MySQL/MariaDB: enable the `postgres`, `sqlite` or `mysql` feature of `inbox-runtime`"
)]
pub trait DigestBackend: Backend + sealed::Digest {}

/// Which tables a digest covers.
#[derive(Debug, Clone)]
pub(crate) enum Selection {
    /// Every base table of the current schema (PostgreSQL), database
    /// (MySQL) or file (SQLite), listed again at every digest.
    All,
    /// These, as the user named them.
    Named(Vec<TableName>),
}

/// A table: as the user named it (`table` or `schema.table`, each part an
/// identifier as the database stores it, quoted when used), or as a
/// backend listed it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TableName {
    pub(crate) schema: Option<String>,
    pub(crate) table: String,
    /// The name reported: what the user wrote, or the bare table name of a
    /// listed table.
    pub(crate) label: String,
}

impl TableName {
    /// `name` split at its first `.` into schema and table.
    pub(crate) fn parse(name: &str) -> Self {
        match name.split_once('.') {
            Some((schema, table)) => TableName {
                schema: Some(schema.to_owned()),
                table: table.to_owned(),
                label: name.to_owned(),
            },
            None => TableName::unqualified(name.to_owned()),
        }
    }

    /// A table of the current schema or database, reported by its name.
    pub(crate) fn unqualified(table: String) -> Self {
        TableName {
            schema: None,
            label: table.clone(),
            table,
        }
    }

    /// The name in SQL, each part quoted by `quote`.
    pub(crate) fn sql(&self, quote: fn(&str) -> String) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", quote(schema), quote(&self.table)),
            None => quote(&self.table),
        }
    }
}

/// One table's digest: equal digests mean equal contents (as a multiset of
/// rows), up to a hash collision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDigest {
    pub(crate) rows: i64,
    pub(crate) hash: String,
}

/// Every covered table's digest, by the name reported for it.
pub(crate) type Digest = BTreeMap<String, TableDigest>;

/// `"…"` quoting (PostgreSQL, SQLite).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn double_quoted(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

/// One `name` column of text.
#[derive(QueryableByName)]
pub struct Name {
    #[diesel(sql_type = Text)]
    pub(crate) name: String,
}

/// One row of a digest statement: the row count and the hash.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(QueryableByName)]
pub struct DigestRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) row_count: i64,
    #[diesel(sql_type = Text)]
    pub(crate) digest: String,
}

/// The digest a one-row digest statement returned.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn first_digest(rows: Vec<DigestRow>) -> diesel::QueryResult<TableDigest> {
    let row = rows
        .into_iter()
        .next()
        .ok_or(diesel::result::Error::NotFound)?;
    Ok(TableDigest {
        rows: row.row_count,
        hash: row.digest,
    })
}

/// What the database says of a named table that is not there (a table
/// with no columns, by `information_schema` or `pragma_table_info`).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn no_such_table(table: &TableName) -> diesel::result::Error {
    diesel::result::Error::QueryBuilderError(
        format!("no table `{}` in this database", table.label).into(),
    )
}

/// One `row_count` column.
#[derive(QueryableByName)]
pub struct Count {
    #[diesel(sql_type = BigInt)]
    pub(crate) row_count: i64,
}

/// The statement that counts the inbox's claims, the same on every backend.
pub(crate) const COUNT_CLAIMS_SQL: &str = "SELECT COUNT(*) AS row_count FROM inbox_messages";

pub(crate) mod sealed {
    use diesel::QueryResult;
    use diesel::connection::LoadConnection;

    use super::{TableDigest, TableName};

    /// What a [`DigestBackend`](super::DigestBackend) does, out of users'
    /// reach. (Its `async fn`s are awaited only by the async check's own
    /// future, which need not be `Send`: a test awaits it in place.)
    #[allow(async_fn_in_trait)]
    pub trait Digest: diesel::backend::Backend + Sized {
        /// The base tables to compare when the user named none, sorted.
        fn tables<C>(conn: &mut C) -> QueryResult<Vec<TableName>>
        where
            C: LoadConnection<Backend = Self>;

        /// One table's digest.
        fn digest_table<C>(conn: &mut C, table: &TableName) -> QueryResult<TableDigest>
        where
            C: LoadConnection<Backend = Self>;

        /// The rows in `inbox_messages`.
        fn count_claims<C>(conn: &mut C) -> QueryResult<i64>
        where
            C: LoadConnection<Backend = Self>;

        /// [`tables`](Self::tables) on a diesel-async connection.
        #[cfg(feature = "async")]
        async fn tables_async<C>(conn: &mut C) -> QueryResult<Vec<TableName>>
        where
            C: diesel_async::AsyncConnection<Backend = Self>;

        /// [`digest_table`](Self::digest_table) on a diesel-async connection.
        #[cfg(feature = "async")]
        async fn digest_table_async<C>(conn: &mut C, table: &TableName) -> QueryResult<TableDigest>
        where
            C: diesel_async::AsyncConnection<Backend = Self>;

        /// [`count_claims`](Self::count_claims) on a diesel-async connection.
        #[cfg(feature = "async")]
        async fn count_claims_async<C>(conn: &mut C) -> QueryResult<i64>
        where
            C: diesel_async::AsyncConnection<Backend = Self>;
    }
}

/// The sealed methods every backend writes the same way (its backend type
/// being concrete is what lets Diesel load the rows).
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
macro_rules! common_digest_fns {
    () => {
        fn count_claims<C>(conn: &mut C) -> diesel::QueryResult<i64>
        where
            C: diesel::connection::LoadConnection<Backend = Self>,
        {
            use diesel::RunQueryDsl;
            let rows: Vec<super::Count> = diesel::sql_query(super::COUNT_CLAIMS_SQL).load(conn)?;
            Ok(rows.first().map_or(0, |row| row.row_count))
        }

        #[cfg(feature = "async")]
        async fn count_claims_async<C>(conn: &mut C) -> diesel::QueryResult<i64>
        where
            C: diesel_async::AsyncConnection<Backend = Self>,
        {
            let rows: Vec<super::Count> =
                diesel_async::RunQueryDsl::load(diesel::sql_query(super::COUNT_CLAIMS_SQL), conn)
                    .await?;
            Ok(rows.first().map_or(0, |row| row.row_count))
        }
    };
}
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
use common_digest_fns;
