//! PostgreSQL's digest: the base tables of `current_schema()`, each read
//! as `count(*)` and an md5 of its rows' md5s in sorted order (a row's text
//! is PostgreSQL's own rendering of the row, `ROW(t.*)::text`: every
//! column, even in a table with a column named `t`, which plain `t::text`
//! would take instead of the row).

use diesel::QueryResult;
use diesel::connection::LoadConnection;
use diesel::pg::Pg;
use diesel::sql_types::Text;

use super::{DigestBackend, DigestRow, Name, TableDigest, TableName, double_quoted};

/// The base tables of the current schema, Diesel's migrations table left
/// out. Each is then read qualified with the schema's name (which
/// [`CURRENT_SCHEMA_SQL`] reads), so no temporary table of the same name
/// stands in for it.
const TABLES_SQL: &str = "SELECT table_name::text AS name FROM information_schema.tables \
     WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' \
     AND table_name <> $1 ORDER BY table_name::text";

const CURRENT_SCHEMA_SQL: &str = "SELECT current_schema()::text AS name";

/// One table's digest; `{table}` is its quoted name.
fn digest_sql(table: &str) -> String {
    format!(
        "SELECT count(*)::bigint AS row_count, \
         coalesce(md5(string_agg(md5(ROW(t.*)::text), '' ORDER BY md5(ROW(t.*)::text))), '') \
         AS digest FROM {table} t"
    )
}

impl super::sealed::Digest for Pg {
    fn tables<C>(conn: &mut C) -> QueryResult<Vec<TableName>>
    where
        C: LoadConnection<Backend = Self>,
    {
        use diesel::RunQueryDsl;
        let schema: Vec<Name> = diesel::sql_query(CURRENT_SCHEMA_SQL).load(conn)?;
        let tables: Vec<Name> = diesel::sql_query(TABLES_SQL)
            .bind::<Text, _>(super::DIESEL_MIGRATIONS_TABLE)
            .load(conn)?;
        Ok(qualified(schema, tables))
    }

    fn digest_table<C>(conn: &mut C, table: &TableName) -> QueryResult<TableDigest>
    where
        C: LoadConnection<Backend = Self>,
    {
        use diesel::RunQueryDsl;
        let rows: Vec<DigestRow> =
            diesel::sql_query(digest_sql(&table.sql(double_quoted))).load(conn)?;
        super::first_digest(rows)
    }

    #[cfg(feature = "async")]
    async fn tables_async<C>(conn: &mut C) -> QueryResult<Vec<TableName>>
    where
        C: diesel_async::AsyncConnection<Backend = Self>,
    {
        use diesel_async::RunQueryDsl;
        let schema: Vec<Name> = diesel::sql_query(CURRENT_SCHEMA_SQL).load(conn).await?;
        let tables: Vec<Name> = diesel::sql_query(TABLES_SQL)
            .bind::<Text, _>(super::DIESEL_MIGRATIONS_TABLE)
            .load(conn)
            .await?;
        Ok(qualified(schema, tables))
    }

    #[cfg(feature = "async")]
    async fn digest_table_async<C>(conn: &mut C, table: &TableName) -> QueryResult<TableDigest>
    where
        C: diesel_async::AsyncConnection<Backend = Self>,
    {
        use diesel_async::RunQueryDsl;
        let rows: Vec<DigestRow> = diesel::sql_query(digest_sql(&table.sql(double_quoted)))
            .load(conn)
            .await?;
        super::first_digest(rows)
    }

    super::common_digest_fns!();
}

/// `tables` of the current `schema`; none when no schema is on the search
/// path.
fn qualified(schema: Vec<Name>, tables: Vec<Name>) -> Vec<TableName> {
    let Some(Name { name: schema }) = schema.into_iter().next() else {
        return Vec::new();
    };
    tables
        .into_iter()
        .map(|Name { name }| TableName {
            schema: Some(schema.clone()),
            label: name.clone(),
            table: name,
        })
        .collect()
}

impl DigestBackend for Pg {}
