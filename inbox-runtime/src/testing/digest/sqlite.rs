//! SQLite's digest: the tables of `sqlite_master` (not SQLite's own
//! `sqlite_%`), each read as every row rendered `quote(col) || ',' || …`,
//! sorted, and hashed here (SQLite has no hash function built in).
//! `quote` renders `NULL` as the word `NULL`, text quoted and blobs as
//! `X'…'`, so values of different types or with commas cannot pass for one
//! another.

use std::hash::{DefaultHasher, Hash, Hasher};

use diesel::QueryResult;
use diesel::connection::LoadConnection;
use diesel::prelude::*;
use diesel::sql_types::Text;
use diesel::sqlite::Sqlite;

use super::{DigestBackend, Name, TableDigest, TableName, double_quoted};

/// The tables of the main database, SQLite's own and Diesel's migrations
/// table left out.
const TABLES_SQL: &str = "SELECT name FROM sqlite_master \
     WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND name <> ? \
     ORDER BY name";

/// A table's columns in order: binds the table and the schema (`main`
/// unless the user named another).
const COLUMNS_SQL: &str = "SELECT name FROM pragma_table_info(?, ?) ORDER BY cid";

/// Every row of a table over `columns`, rendered and sorted; `table` is its
/// quoted name.
fn rows_sql(table: &str, columns: &[String]) -> String {
    let row = columns
        .iter()
        .map(|column| format!("quote({})", double_quoted(column)))
        .collect::<Vec<_>>()
        .join(" || ',' || ");
    format!("SELECT {row} AS name FROM {table} ORDER BY 1")
}

impl super::sealed::Digest for Sqlite {
    fn tables<C>(conn: &mut C) -> QueryResult<Vec<TableName>>
    where
        C: LoadConnection<Backend = Self>,
    {
        let tables: Vec<Name> = diesel::sql_query(TABLES_SQL)
            .bind::<Text, _>(super::DIESEL_MIGRATIONS_TABLE)
            .load(conn)?;
        Ok(tables
            .into_iter()
            .map(|Name { name }| TableName::unqualified(name))
            .collect())
    }

    fn digest_table<C>(conn: &mut C, table: &TableName) -> QueryResult<TableDigest>
    where
        C: LoadConnection<Backend = Self>,
    {
        let columns: Vec<Name> = diesel::sql_query(COLUMNS_SQL)
            .bind::<Text, _>(&table.table)
            .bind::<Text, _>(table.schema.as_deref().unwrap_or("main"))
            .load(conn)?;
        if columns.is_empty() {
            return Err(diesel::result::Error::QueryBuilderError(
                format!("no table `{}` in this database", table.label).into(),
            ));
        }
        let columns: Vec<String> = columns.into_iter().map(|Name { name }| name).collect();
        let rows: Vec<Name> =
            diesel::sql_query(rows_sql(&table.sql(double_quoted), &columns)).load(conn)?;
        // Deterministic within the process, which is all a comparison of two
        // digests taken by one check needs.
        let mut hasher = DefaultHasher::new();
        for Name { name } in &rows {
            name.hash(&mut hasher);
        }
        Ok(TableDigest {
            rows: i64::try_from(rows.len()).unwrap_or(i64::MAX),
            hash: format!("{:016x}", hasher.finish()),
        })
    }

    super::common_digest_fns!();
}

impl DigestBackend for Sqlite {}
