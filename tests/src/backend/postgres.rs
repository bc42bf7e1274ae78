//! PostgreSQL: a schema of a test's own on the server at
//! `INBOX_TEST_POSTGRES_URL`, and PostgreSQL's SQL for the tests.

use diesel::prelude::*;

use super::{ServerBackend, TestBackend, id_list};

/// The server at `INBOX_TEST_POSTGRES_URL` (its URL and a connection), or
/// `None` after a `skipped:` line when it cannot be reached.
fn admin_connection() -> Option<(String, PgConnection)> {
    let admin_url = crate::env_or(
        "INBOX_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    match PgConnection::establish(&admin_url) {
        Ok(conn) => Some((admin_url, conn)),
        Err(error) => {
            crate::report_unavailable("PostgreSQL", &admin_url, &error);
            None
        }
    }
}

/// A PostgreSQL schema of its own, with the inbox table, dropped on drop.
/// Every connection made from [`TestBackend::url`] uses it as its
/// `search_path`.
///
/// ```
/// use inbox_tests::{Postgres, TestBackend};
///
/// let Some(db) = Postgres::open() else { return }; // `skipped:` printed
/// let _conn = db.connect();
/// assert!(db.url().contains(db.schema()));
/// ```
pub struct Postgres {
    admin_url: String,
    schema: String,
    url: String,
}

impl Postgres {
    /// The schema's name.
    pub fn schema(&self) -> &str {
        &self.schema
    }
}

impl TestBackend for Postgres {
    type Connection = PgConnection;
    #[cfg(feature = "async")]
    type AsyncConnection = diesel_async::AsyncPgConnection;

    const NAME: &'static str = "postgres";
    const FAILED_STATEMENT_ABORTS_TRANSACTION: bool = true;
    const RECEIVED_AGE_MICROS_SQL: &'static str =
        "(EXTRACT(EPOCH FROM (clock_timestamp() - received_at)) * 1000000)::BIGINT";
    const EXACT_TEXT_TYPE: &'static str = "TEXT";
    const RACE_THREADS: usize = 16;
    const ROLLBACK_STORMS_MAY_OUTLAST_CLAIM_RETRIES: bool = false;

    /// A fresh schema on the server at `INBOX_TEST_POSTGRES_URL`.
    fn open() -> Option<Self> {
        let (admin_url, mut admin) = admin_connection()?;
        let schema = crate::unique_name("inbox_test");
        diesel::sql_query(format!("CREATE SCHEMA {schema}"))
            .execute(&mut admin)
            .expect("create the test schema");
        let separator = if admin_url.contains('?') { '&' } else { '?' };
        let url = format!("{admin_url}{separator}options=-csearch_path%3D{schema}");
        let database = Postgres {
            admin_url,
            schema,
            url,
        };
        inbox_runtime::setup(&mut database.connect()).expect("create the inbox table");
        Some(database)
    }

    fn url(&self) -> &str {
        &self.url
    }

    fn connect(&self) -> PgConnection {
        PgConnection::establish(&self.url).expect("connect to the test schema")
    }

    fn ago_sql(seconds: i64) -> String {
        format!("now() - interval '{seconds} seconds'")
    }

    const FIRST_SCHEMA_SQL: &'static str = include_str!(
        "../../../inbox-runtime/migrations/postgres/2026-12-01-000000_create_inbox_messages/up.sql"
    );

    /// Indexes with the table's schema left out of their definition.
    const DESCRIBE_INBOX_SQL: &'static str = "SELECT 'column ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) \
                || ' default ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '-') AS value \
         FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
         WHERE a.attrelid = 'inbox_messages'::regclass AND a.attnum > 0 AND NOT a.attisdropped \
         UNION ALL \
         SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint \
         WHERE conrelid = 'inbox_messages'::regclass \
         UNION ALL \
         SELECT 'index ' || regexp_replace(pg_get_indexdef(indexrelid), ' ON \\S+\\.inbox_messages ', ' ON inbox_messages ') \
         FROM pg_index WHERE indrelid = 'inbox_messages'::regclass";
}

impl ServerBackend for Postgres {
    const CONNECTION_ID_SQL: &'static str = "pg_backend_pid()::bigint";

    fn kill_sql(id: i64) -> String {
        format!("SELECT pg_terminate_backend({id}, 5000)")
    }

    fn alive_sql(id: i64) -> String {
        format!("(SELECT count(*) FROM pg_stat_activity WHERE pid = {id})")
    }

    fn lock_waiters_sql(ids: &[i64]) -> String {
        format!(
            "(SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid IN ({}))",
            id_list(ids)
        )
    }

    #[cfg(feature = "async")]
    super::async_pools!(diesel_async::AsyncPgConnection);

    const DEFAULT_PORT: u16 = 5432;
    const DUPLICATE_CLAIM_LOCKS_ROW: bool = false;

    fn tagged_url(&self, tag: &str) -> String {
        format!("{}&application_name={tag}", self.url)
    }

    fn tagged_connections_sql(&self, tag: &str) -> String {
        format!(
            "SELECT pid::bigint AS value FROM pg_stat_activity WHERE application_name = '{tag}'"
        )
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Ok(mut admin) = PgConnection::establish(&self.admin_url) {
            let _ = diesel::sql_query(format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema))
                .execute(&mut admin);
        }
    }
}

/// A PostgreSQL database of its own, created with a server encoding
/// other than UTF-8 (`ENCODING 'LATIN1'`, say), with the inbox table;
/// dropped on drop. For what such a server refuses to store.
///
/// ```
/// let Some(db) = inbox_tests::PgEncodedDatabase::create("LATIN1") else { return };
/// let _conn = db.connect();
/// ```
pub struct PgEncodedDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl PgEncodedDatabase {
    /// A fresh database with server encoding `encoding` on the server at
    /// `INBOX_TEST_POSTGRES_URL`, or `None` (after a `skipped:` line).
    pub fn create(encoding: &str) -> Option<Self> {
        let (admin_url, mut admin) = admin_connection()?;
        let name = crate::unique_name("inbox_enc");
        diesel::sql_query(format!(
            "CREATE DATABASE {name} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
        ))
        .execute(&mut admin)
        .expect("create the test database");
        let (base, query) = admin_url
            .split_once('?')
            .map_or((admin_url.as_str(), ""), |(b, q)| (b, q));
        let server = base.rsplit_once('/').map_or(base, |(server, _)| server);
        let url = if query.is_empty() {
            format!("{server}/{name}")
        } else {
            format!("{server}/{name}?{query}")
        };
        let database = PgEncodedDatabase {
            admin_url,
            name,
            url,
        };
        inbox_runtime::setup(&mut database.connect()).expect("create the inbox table");
        Some(database)
    }

    /// A new connection to this database.
    pub fn connect(&self) -> PgConnection {
        PgConnection::establish(&self.url).expect("connect to the test database")
    }

    /// A new diesel-async connection to this database.
    #[cfg(feature = "async")]
    pub async fn connect_async(&self) -> diesel_async::AsyncPgConnection {
        use diesel_async::AsyncConnection;
        diesel_async::AsyncPgConnection::establish(&self.url)
            .await
            .expect("connect to the test database")
    }
}

impl Drop for PgEncodedDatabase {
    fn drop(&mut self) {
        if let Ok(mut admin) = PgConnection::establish(&self.admin_url) {
            let _ = diesel::sql_query(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .execute(&mut admin);
        }
    }
}
