//! A foreign key the database checks only at `COMMIT`, and a row that
//! violates it: the setup of the tests of a refused `COMMIT`.

use diesel::connection::SimpleConnection;

use crate::TestBackend;

/// Inserts a child whose parent does not exist: accepted by the statement,
/// refused when the transaction commits (after [`create_deferred_foreign_key`]).
pub const ORPHAN_SQL: &str = "INSERT INTO deferred_children (parent) VALUES (7)";

/// Counts the children (orphans included, until refused).
pub const COUNT_CHILDREN_SQL: &str = "SELECT COUNT(*) AS value FROM deferred_children";

/// Creates `deferred_parents` and `deferred_children`, whose foreign key is
/// `DEFERRABLE INITIALLY DEFERRED`, and on SQLite turns foreign keys on for
/// `conn` (a per-connection setting there: call it on the connection the
/// handler runs on). PostgreSQL and SQLite; MariaDB/MySQL check foreign keys
/// at each statement.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::connection::SimpleConnection;
/// use inbox_tests::{create_deferred_foreign_key, Sqlite, TestBackend, ORPHAN_SQL};
///
/// let db = Sqlite::open().unwrap();
/// let mut conn = db.connect();
/// create_deferred_foreign_key::<Sqlite>(&mut conn);
/// let refused = conn.batch_execute(&format!("BEGIN; {ORPHAN_SQL}; COMMIT"));
/// assert!(refused.is_err(), "the orphan is refused at COMMIT");
/// # }
/// ```
///
/// # Panics
/// When the tables cannot be created.
pub fn create_deferred_foreign_key<B: TestBackend>(conn: &mut B::Connection) {
    conn.batch_execute(
        "CREATE TABLE deferred_parents (id INTEGER NOT NULL PRIMARY KEY); \
         CREATE TABLE deferred_children (parent INTEGER NOT NULL \
         REFERENCES deferred_parents (id) DEFERRABLE INITIALLY DEFERRED)",
    )
    .expect("create the tables of a deferred foreign key");
    if B::NAME == "sqlite" {
        conn.batch_execute("PRAGMA foreign_keys = ON")
            .expect("turn foreign keys on");
    }
}
