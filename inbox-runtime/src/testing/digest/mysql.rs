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
use diesel::prelude::*;
use diesel::sql_types::Text;

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

/// One table's digest over `columns`; `table` is its quoted name.
fn digest_sql(table: &str, columns: &[String]) -> String {
    let row = columns
        .iter()
        .map(|column| format!("QUOTE({})", backquoted(column)))
        .collect::<Vec<_>>()
        .join(", ");
    let half = |side: &str| format!("CAST(CONV({side}(h, 16), 16, 10) AS UNSIGNED)");
    format!(
        "SELECT COUNT(*) AS row_count, CAST(CONCAT(COALESCE(SUM({left}), 0), ':', \
         COALESCE(SUM({right}), 0), ':', BIT_XOR({left})) AS CHAR) AS digest \
         FROM (SELECT MD5(CONCAT_WS(',', {row})) AS h FROM {table}) AS row_hashes",
        left = half("LEFT"),
        right = half("RIGHT"),
    )
}

impl super::sealed::Digest for Mysql {
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
            .bind::<diesel::sql_types::Nullable<Text>, _>(table.schema.as_deref())
            .bind::<Text, _>(&table.table)
            .load(conn)?;
        if columns.is_empty() {
            // What the database says of a table that is not there.
            return Err(diesel::result::Error::QueryBuilderError(
                format!("no table `{}` in this database", table.label).into(),
            ));
        }
        let columns: Vec<String> = columns.into_iter().map(|Name { name }| name).collect();
        let rows: Vec<DigestRow> =
            diesel::sql_query(digest_sql(&table.sql(backquoted), &columns)).load(conn)?;
        let row = rows
            .into_iter()
            .next()
            .ok_or(diesel::result::Error::NotFound)?;
        Ok(TableDigest {
            rows: row.row_count,
            hash: row.digest,
        })
    }

    super::common_digest_fns!();
}

impl DigestBackend for Mysql {}
