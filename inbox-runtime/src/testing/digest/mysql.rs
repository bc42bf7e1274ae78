//! MySQL's and MariaDB's digest: the base tables of `DATABASE()`, each read
//! as `COUNT(*)` and, over every row's `MD5(CONCAT_WS(',', QUOTE(col), …))`,
//! the sums of its two 64-bit halves and the XOR of its first half: a hash
//! of the rows as a multiset, with no `GROUP_CONCAT` (whose
//! `group_concat_max_len` would truncate it) and no session setting changed.
//! `QUOTE` renders `NULL` as the word `NULL` and escapes strings, so a `NULL`
//! and a comma inside a value cannot pass for one another.

use diesel::QueryResult;
use diesel::connection::LoadConnection;
use diesel::mysql::Mysql;
use diesel::sql_types::{Nullable, Text};

use super::{DigestBackend, DigestRow, Name, TableDigest, TableName};

/// The base tables of the current database, Diesel's migrations table left
/// out.
const TABLES_SQL: &str = "SELECT CAST(table_name AS CHAR) AS name FROM information_schema.tables \
     WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE' AND table_name <> ? \
     ORDER BY CAST(table_name AS CHAR)";

/// A table's columns in order: binds the database (`NULL`: the current one)
/// and the table.
const COLUMNS_SQL: &str = "SELECT CAST(column_name AS CHAR) AS name FROM information_schema.columns \
     WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? ORDER BY ordinal_position";

fn backquoted(identifier: &str) -> String {
    format!("`{}`", identifier.replace('`', "``"))
}

/// One table's digest over its `columns` (none: no such table).
fn digest_sql(table: &TableName, columns: Vec<Name>) -> QueryResult<String> {
    if columns.is_empty() {
        return Err(super::no_such_table(table));
    }
    let row = columns
        .iter()
        .map(|Name { name }| format!("QUOTE({})", backquoted(name)))
        .collect::<Vec<_>>()
        .join(", ");
    let half = |side: &str| format!("CAST(CONV({side}(h, 16), 16, 10) AS UNSIGNED)");
    Ok(format!(
        "SELECT COUNT(*) AS row_count, CAST(CONCAT(COALESCE(SUM({left}), 0), ':', \
         COALESCE(SUM({right}), 0), ':', BIT_XOR({left})) AS CHAR) AS digest \
         FROM (SELECT MD5(CONCAT_WS(',', {row})) AS h FROM {table}) AS row_hashes",
        left = half("LEFT"),
        right = half("RIGHT"),
        table = table.sql(backquoted),
    ))
}

impl super::sealed::Digest for Mysql {
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
            .bind::<Nullable<Text>, _>(table.schema.as_deref())
            .bind::<Text, _>(&table.table)
            .load(conn)?;
        let sql = digest_sql(table, columns)?;
        let rows: Vec<DigestRow> = diesel::sql_query(sql).load(conn)?;
        super::first_digest(rows)
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
            .bind::<Nullable<Text>, _>(table.schema.clone())
            .bind::<Text, _>(table.table.clone())
            .load(conn)
            .await?;
        let sql = digest_sql(table, columns)?;
        let rows: Vec<DigestRow> = diesel::sql_query(sql).load(conn).await?;
        super::first_digest(rows)
    }

    super::common_digest_fns!();
}

fn unqualified(tables: Vec<Name>) -> Vec<TableName> {
    tables
        .into_iter()
        .map(|Name { name }| TableName::unqualified(name))
        .collect()
}

impl DigestBackend for Mysql {}
