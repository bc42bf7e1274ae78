//! SQLite's digest: the tables of `sqlite_master` (not SQLite's own
//! `sqlite_%`), each read as every row rendered `quote(col) || ',' || …`,
//! sorted, and hashed here (SQLite has no hash function built in).
//! `quote` renders `NULL` as the word `NULL`, text quoted and blobs as
//! `X'…'`, so values of different types or with commas cannot pass for one
//! another.

use std::hash::{DefaultHasher, Hash, Hasher};

use diesel::QueryResult;
use diesel::connection::LoadConnection;
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

/// Every row of a table over its `columns` (none: no such table),
/// rendered and sorted.
fn rows_sql(table: &TableName, columns: Vec<Name>) -> QueryResult<String> {
    if columns.is_empty() {
        return Err(super::no_such_table(table));
    }
    let row = columns
        .iter()
        .map(|Name { name }| format!("quote({})", double_quoted(name)))
        .collect::<Vec<_>>()
        .join(" || ',' || ");
    Ok(format!(
        "SELECT {row} AS name FROM {} ORDER BY 1",
        table.sql(double_quoted)
    ))
}

impl super::sealed::Digest for Sqlite {
    fn tables<C>(conn: &mut C) -> QueryResult<Vec<TableName>>
    where
        C: LoadConnection<Backend = Self>,
    {
        use diesel::RunQueryDsl;
        let tables: Vec<Name> = diesel::sql_query(TABLES_SQL)
            .bind::<Text, _>(super::DIESEL_MIGRATIONS_TABLE)
            .load(conn)?;
        Ok(unqualified(tables))
    }

    fn digest_table<C>(conn: &mut C, table: &TableName) -> QueryResult<TableDigest>
    where
        C: LoadConnection<Backend = Self>,
    {
        use diesel::RunQueryDsl;
        let columns: Vec<Name> = diesel::sql_query(COLUMNS_SQL)
            .bind::<Text, _>(&table.table)
            .bind::<Text, _>(table.schema.as_deref().unwrap_or("main"))
            .load(conn)?;
        let sql = rows_sql(table, columns)?;
        let rows: Vec<Name> = diesel::sql_query(sql).load(conn)?;
        Ok(hashed(&rows))
    }

    #[cfg(feature = "async")]
    async fn tables_async<C>(conn: &mut C) -> QueryResult<Vec<TableName>>
    where
        C: diesel_async::AsyncConnection<Backend = Self>,
    {
        use diesel_async::RunQueryDsl;
        let tables: Vec<Name> = diesel::sql_query(TABLES_SQL)
            .bind::<Text, _>(super::DIESEL_MIGRATIONS_TABLE)
            .load(conn)
            .await?;
        Ok(unqualified(tables))
    }

    #[cfg(feature = "async")]
    async fn digest_table_async<C>(conn: &mut C, table: &TableName) -> QueryResult<TableDigest>
    where
        C: diesel_async::AsyncConnection<Backend = Self>,
    {
        use diesel_async::RunQueryDsl;
        let columns: Vec<Name> = diesel::sql_query(COLUMNS_SQL)
            .bind::<Text, _>(table.table.clone())
            .bind::<Text, _>(table.schema.clone().unwrap_or_else(|| "main".to_owned()))
            .load(conn)
            .await?;
        let sql = rows_sql(table, columns)?;
        let rows: Vec<Name> = diesel::sql_query(sql).load(conn).await?;
        Ok(hashed(&rows))
    }

    super::common_digest_fns!();
}

fn unqualified(tables: Vec<Name>) -> Vec<TableName> {
    tables
        .into_iter()
        .map(|Name { name }| TableName::unqualified(name))
        .collect()
}

/// The digest of a table's rendered rows, in their order. The hash is
/// deterministic within the process, which is all a comparison of two
/// digests taken by one check needs.
fn hashed(rows: &[Name]) -> TableDigest {
    let mut hasher = DefaultHasher::new();
    for Name { name } in rows {
        name.hash(&mut hasher);
    }
    TableDigest {
        rows: i64::try_from(rows.len()).unwrap_or(i64::MAX),
        hash: format!("{:016x}", hasher.finish()),
    }
}

impl DigestBackend for Sqlite {}
