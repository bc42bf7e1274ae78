//! PostgreSQL: a schema of a test's own on the server at
//! `INBOX_TEST_POSTGRES_URL`, and PostgreSQL's SQL for the tests.

use diesel::prelude::*;

use diesel::r2d2::{ConnectionManager, Pool};

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
/// Behind PgBouncer ([`behind_pgbouncer`]): a database of its own instead
/// (PgBouncer passes no `search_path` option to the server), reached through
/// PgBouncer's transaction pooling, and every connection the harness makes
/// to it (blocking, async, pooled) has Diesel's statement cache off, as the
/// guide's PgBouncer chapter says.
///
/// ```
/// use inbox_tests::{Postgres, TestBackend};
///
/// let Some(db) = Postgres::open() else { return }; // `skipped:` printed
/// let _conn = db.connect();
/// if !inbox_tests::behind_pgbouncer() {
///     assert!(db.url().contains(db.schema()));
/// }
/// ```
pub struct Postgres {
    admin_url: String,
    schema: String,
    url: String,
    /// Behind PgBouncer: the database of the test's own, dropped on drop.
    database: Option<String>,
}

impl Postgres {
    /// The schema's name (`public` behind PgBouncer, in the test's own
    /// database).
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// A fresh database on the server, reached through the PgBouncer at
    /// `INBOX_TEST_PGBOUNCER_URL`.
    fn open_behind_pgbouncer(admin_url: String, admin: &mut PgConnection) -> Option<Self> {
        let bouncer = match std::env::var(PGBOUNCER_URL) {
            Ok(url) if !url.is_empty() => url,
            _ => {
                crate::report_unavailable(
                    "PgBouncer",
                    PGBOUNCER_URL,
                    &format!("{THROUGH_PGBOUNCER}=1 needs {PGBOUNCER_URL}"),
                );
                return None;
            }
        };
        let name = crate::unique_name("inbox_test");
        diesel::sql_query(format!("CREATE DATABASE {name}"))
            .execute(admin)
            .expect("create the test database");
        let url = with_database(&bouncer, &name);
        let database = Postgres {
            admin_url,
            schema: "public".to_owned(),
            url,
            database: Some(name),
        };
        inbox_runtime::setup(&mut database.connect()).expect("create the inbox table");
        Some(database)
    }
}

/// Whether the suite runs the PostgreSQL tests through PgBouncer
/// (`INBOX_TEST_POSTGRES_THROUGH_PGBOUNCER=1`, with the PgBouncer at
/// `INBOX_TEST_PGBOUNCER_URL`, in transaction pooling, in front of the
/// server at `INBOX_TEST_POSTGRES_URL`). A test that needs what transaction
/// pooling does not keep (a server session of its own: a backend to kill, a
/// session-level lock or setting, `LISTEN`) says so and returns when it is.
///
/// ```
/// let _through: bool = inbox_tests::behind_pgbouncer();
/// ```
pub fn behind_pgbouncer() -> bool {
    std::env::var(THROUGH_PGBOUNCER).is_ok_and(|v| v == "1")
}

/// Prints why a test does not run behind PgBouncer, and says whether it
/// should return: `true` behind PgBouncer.
///
/// ```
/// if inbox_tests::skipped_behind_pgbouncer("it kills its own server session") {
///     return;
/// }
/// ```
pub fn skipped_behind_pgbouncer(why: &str) -> bool {
    if !behind_pgbouncer() {
        return false;
    }
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr().lock(),
        "not run behind PgBouncer's transaction pooling: {why}"
    );
    true
}

const THROUGH_PGBOUNCER: &str = "INBOX_TEST_POSTGRES_THROUGH_PGBOUNCER";
const PGBOUNCER_URL: &str = "INBOX_TEST_PGBOUNCER_URL";

/// `url` with its database (the path) replaced by `database`, its query kept.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, ""), |(b, q)| (b, q));
    let after_scheme = base.find("://").map_or(0, |at| at + 3);
    let server = match base[after_scheme..].find('/') {
        Some(slash) => &base[..after_scheme + slash],
        None => base,
    };
    if query.is_empty() {
        format!("{server}/{database}")
    } else {
        format!("{server}/{database}?{query}")
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

    /// Behind PgBouncer's transaction pooling (1.18), diesel-async's
    /// connections are not tested by the generic suites: tokio-postgres
    /// prepares every statement by name, in an exchange of its own (its
    /// `Sync` ends PgBouncer's transaction), so a statement outside a
    /// transaction can be executed on another server connection than the
    /// one that prepared it; `AsyncPgConnection::establish`'s own setup
    /// statements included. The `pgbouncer` suite tests async handlers
    /// (whose statements all run in their transaction) on their own.
    fn skips_async() -> bool {
        skipped_behind_pgbouncer(
            "diesel-async prepares each statement by name in an exchange of its own, \
             which transaction pooling may split over two server connections",
        )
    }

    fn skipped_without_sessions(why: &str) -> bool {
        skipped_behind_pgbouncer(why)
    }

    /// A fresh schema on the server at `INBOX_TEST_POSTGRES_URL` (behind
    /// PgBouncer: a fresh database).
    fn open() -> Option<Self> {
        let (admin_url, mut admin) = admin_connection()?;
        if behind_pgbouncer() {
            return Self::open_behind_pgbouncer(admin_url, &mut admin);
        }
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
            database: None,
        };
        inbox_runtime::setup(&mut database.connect()).expect("create the inbox table");
        Some(database)
    }

    fn url(&self) -> &str {
        &self.url
    }

    fn connect(&self) -> PgConnection {
        let mut conn = PgConnection::establish(&self.url).expect("connect to the test schema");
        if self.database.is_some() {
            conn.set_prepared_statement_cache_size(diesel::connection::CacheSize::Disabled);
        }
        conn
    }

    fn pool_builder() -> diesel::r2d2::Builder<ConnectionManager<PgConnection>> {
        let builder = Pool::builder();
        if behind_pgbouncer() {
            builder.connection_customizer(Box::new(NoStatementCache))
        } else {
            builder
        }
    }

    #[cfg(feature = "async")]
    fn connect_async(
        &self,
    ) -> impl std::future::Future<Output = diesel_async::AsyncPgConnection> + Send {
        let url = self.url.clone();
        async move { establish_async(&url).await.expect("connect (async)") }
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
    super::async_pools!(diesel_async::AsyncPgConnection, manager_config());

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
            let drop = match &self.database {
                Some(name) => format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
                None => format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema),
            };
            let _ = diesel::sql_query(drop).execute(&mut admin);
        }
    }
}

/// Diesel's statement cache off on every connection an r2d2 pool opens (the
/// guide's recipe for PgBouncer's transaction pooling).
///
/// ```
/// use diesel::PgConnection;
/// use diesel::r2d2::{ConnectionManager, Pool};
///
/// let _builder = Pool::<ConnectionManager<PgConnection>>::builder()
///     .connection_customizer(Box::new(inbox_tests::NoStatementCache));
/// ```
#[derive(Debug)]
pub struct NoStatementCache;

impl diesel::r2d2::CustomizeConnection<PgConnection, diesel::r2d2::Error> for NoStatementCache {
    fn on_acquire(&self, conn: &mut PgConnection) -> Result<(), diesel::r2d2::Error> {
        conn.set_prepared_statement_cache_size(diesel::connection::CacheSize::Disabled);
        Ok(())
    }
}

/// A diesel-async connection to `url`, its statement cache off behind
/// PgBouncer.
#[cfg(feature = "async")]
async fn establish_async(url: &str) -> diesel::ConnectionResult<diesel_async::AsyncPgConnection> {
    use diesel_async::AsyncConnection;
    let mut conn = diesel_async::AsyncPgConnection::establish(url).await?;
    if behind_pgbouncer() {
        conn.set_prepared_statement_cache_size(diesel::connection::CacheSize::Disabled);
    }
    Ok(conn)
}

/// How the deadpool and bb8 pools connect: [`establish_async`].
#[cfg(feature = "async")]
fn manager_config()
-> diesel_async::pooled_connection::ManagerConfig<diesel_async::AsyncPgConnection> {
    let mut config = diesel_async::pooled_connection::ManagerConfig::default();
    if behind_pgbouncer() {
        config.custom_setup = Box::new(|url| Box::pin(establish_async(url)));
    }
    config
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
        let url = with_database(&admin_url, &name);
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
