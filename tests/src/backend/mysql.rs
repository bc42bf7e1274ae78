//! MariaDB/MySQL: a database of a test's own on the server at
//! `INBOX_TEST_MYSQL_URL`, and its SQL for the tests.

use diesel::prelude::*;

use super::{ServerBackend, TestBackend, id_list};

/// A MariaDB/MySQL database of its own, with the inbox table, dropped on drop.
///
/// ```
/// use inbox_tests::{Mysql, TestBackend};
///
/// let Some(db) = Mysql::open() else { return }; // `skipped:` printed
/// let _conn = db.connect();
/// assert_eq!(Mysql::NAME, "mysql");
/// ```
pub struct Mysql {
    admin_url: String,
    name: String,
    url: String,
}

impl TestBackend for Mysql {
    type Connection = MysqlConnection;
    #[cfg(feature = "async")]
    type AsyncConnection = diesel_async::AsyncMysqlConnection;

    const NAME: &'static str = "mysql";
    const FAILED_STATEMENT_ABORTS_TRANSACTION: bool = false;
    const RECEIVED_AGE_MICROS_SQL: &'static str =
        "TIMESTAMPDIFF(MICROSECOND, received_at, UTC_TIMESTAMP(6))";
    const EXACT_TEXT_TYPE: &'static str = "VARBINARY(255)";
    const RACE_THREADS: usize = 16;
    const ROLLBACK_STORMS_MAY_OUTLAST_CLAIM_RETRIES: bool = true;

    /// A fresh database on the server at `INBOX_TEST_MYSQL_URL`.
    fn open() -> Option<Self> {
        let admin_url = crate::env_or("INBOX_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
        let mut admin = match MysqlConnection::establish(&admin_url) {
            Ok(conn) => conn,
            Err(error) => {
                crate::report_unavailable("MariaDB/MySQL", &admin_url, &error);
                return None;
            }
        };
        let name = crate::unique_name("inbox_test");
        diesel::sql_query(format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .expect("create the test database");
        let server = admin_url
            .rsplit_once('/')
            .map(|(server, _database)| server)
            .expect("a mysql:// URL with a database path");
        let url = format!("{server}/{name}");
        let database = Mysql {
            admin_url,
            name,
            url,
        };
        inbox_runtime::setup(&mut database.connect()).expect("create the inbox table");
        Some(database)
    }

    fn url(&self) -> &str {
        &self.url
    }

    fn connect(&self) -> MysqlConnection {
        MysqlConnection::establish(&self.url).expect("connect to the test database")
    }

    fn ago_sql(seconds: i64) -> String {
        format!("UTC_TIMESTAMP(6) - INTERVAL {seconds} SECOND")
    }

    const FIRST_SCHEMA_SQL: &'static str = include_str!(
        "../../../inbox-runtime/migrations/mysql/2026-12-01-000000_create_inbox_messages/up.sql"
    );

    const DESCRIBE_INBOX_SQL: &'static str = "SELECT CONCAT('column ', column_name, ' ', column_type, ' default ', \
                       COALESCE(column_default, '-')) AS value \
         FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND table_name = 'inbox_messages' \
         UNION ALL \
         SELECT CONCAT('constraint ', constraint_name, ' ', check_clause) \
         FROM information_schema.check_constraints \
         WHERE constraint_schema = DATABASE() AND table_name = 'inbox_messages' \
         UNION ALL \
         SELECT CONCAT('index ', index_name, ' ', non_unique, ' ', \
                       GROUP_CONCAT(column_name ORDER BY seq_in_index)) \
         FROM information_schema.statistics \
         WHERE table_schema = DATABASE() AND table_name = 'inbox_messages' \
         GROUP BY index_name, non_unique";
}

impl ServerBackend for Mysql {
    const CONNECTION_ID_SQL: &'static str = "CAST(CONNECTION_ID() AS SIGNED)";

    fn kill_sql(id: i64) -> String {
        format!("KILL {id}")
    }

    fn alive_sql(id: i64) -> String {
        format!("(SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE id = {id})")
    }

    /// The connections inside their claim statement (blocked on the
    /// holder's lock: it cannot finish before the holder). InnoDB's own view
    /// (`INNODB_TRX`) lists only the first of several waiters on one key as
    /// `LOCK WAIT`.
    fn lock_waiters_sql(ids: &[i64]) -> String {
        format!(
            "(SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE id IN ({}) AND info LIKE '%INTO inbox_messages%')",
            id_list(ids)
        )
    }

    #[cfg(feature = "async")]
    super::async_pools!(diesel_async::AsyncMysqlConnection);

    const DEFAULT_PORT: u16 = 3306;
    const DUPLICATE_CLAIM_LOCKS_ROW: bool = true;

    /// MariaDB/MySQL has no connection attribute to select by in
    /// `PROCESSLIST`: a test's connections are told apart by its database.
    fn tagged_url(&self, _tag: &str) -> String {
        self.url.clone()
    }

    fn tagged_connections_sql(&self, _tag: &str) -> String {
        format!(
            "SELECT CAST(ID AS SIGNED) AS value FROM information_schema.PROCESSLIST \
             WHERE DB = '{}' AND ID <> CONNECTION_ID()",
            self.name
        )
    }

    fn async_tcp_url(url: &str) -> String {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}prefer_socket=false")
    }
}

impl Drop for Mysql {
    fn drop(&mut self) {
        if let Ok(mut admin) = MysqlConnection::establish(&self.admin_url) {
            let _ = diesel::sql_query(format!("DROP DATABASE IF EXISTS {}", self.name))
                .execute(&mut admin);
        }
    }
}
