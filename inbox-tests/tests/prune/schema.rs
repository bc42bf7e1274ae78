//! The schema the pruning relies on, however the inbox was created: by
//! `setup()`, by the migrations, or by an earlier version of either, then
//! upgraded.
//!
//! - `setup_and_migrations_agree`: `setup()` and the migrations make the same
//!   table, indexes and defaults (both include the `(handler, received_at)`
//!   index pruning walks);
//! - `migrations_upgrade_an_old_inbox` / `setup_upgrades_an_old_inbox`: an
//!   inbox created by the first migration (or the first version's
//!   `setup()`), holding ids, becomes the same as a new one, keeps its ids,
//!   and `setup()` run again changes nothing.
//!
//! What only PostgreSQL has (a claim dated by its statement, the generation
//! layout's migrations) is in `partitioned`, with [`SchemaDb`] and
//! [`without_inbox`] from here.

use diesel::connection::SimpleConnection;
use diesel::migration::{Migration, MigrationSource};
use diesel::prelude::*;
use diesel_migrations::MigrationHarness;
use inbox_runtime::migrations::EmbeddedInboxMigrations;
use inbox_runtime::{Outcome, Prune};

use crate::support::*;

/// What the schema tests need of a backend: its first schema, how its
/// database describes a table, and its embedded migrations.
pub trait SchemaDb: TestBackend {
    /// The SQL of `inbox_runtime::setup()` in the first version: the first
    /// migration's `up.sql`.
    const FIRST_SCHEMA_SQL: &'static str;

    /// The inbox table as the database describes it (columns, defaults,
    /// constraints, indexes), one line per item, sorted.
    fn describe(conn: &mut Self::Connection) -> Vec<String>;

    /// The inbox's migrations, oldest first.
    fn migration_count() -> usize;

    /// Runs the first of the inbox's migrations only, as the first version
    /// of the crate would have.
    fn run_first_migration(conn: &mut Self::Connection);

    /// Runs the inbox's pending migrations; returns how many ran.
    fn run_pending_migrations(conn: &mut Self::Connection) -> usize;
}

/// The inbox's migrations for `DB`, oldest first.
fn migrations<DB: EmbeddedInboxMigrations>() -> Vec<Box<dyn Migration<DB>>> {
    let mut all =
        MigrationSource::<DB>::migrations(&DB::MIGRATIONS).expect("the embedded migrations");
    all.sort_by_key(|migration| migration.name().version().to_string());
    all
}

macro_rules! migration_methods {
    ($backend:ty) => {
        fn migration_count() -> usize {
            migrations::<$backend>().len()
        }

        fn run_first_migration(conn: &mut Self::Connection) {
            diesel::migration::MigrationConnection::setup(conn).expect("the migrations table");
            conn.run_migration(&*migrations::<$backend>()[0])
                .expect("the first migration");
        }

        fn run_pending_migrations(conn: &mut Self::Connection) -> usize {
            conn.run_pending_migrations(<$backend as EmbeddedInboxMigrations>::MIGRATIONS)
                .expect("the pending migrations")
                .len()
        }
    };
}

/// The text rows of `sql` (a `value` column), sorted.
fn lines(conn: &mut impl SqlRows, sql: &str) -> Vec<String> {
    let mut lines = conn.texts(sql);
    lines.sort();
    lines
}

#[cfg(feature = "postgres")]
impl SchemaDb for inbox_tests::Postgres {
    const FIRST_SCHEMA_SQL: &'static str = include_str!(
        "../../../inbox-runtime/migrations/postgres/2026-12-01-000000_create_inbox_messages/up.sql"
    );

    migration_methods!(diesel::pg::Pg);

    fn describe(conn: &mut PgConnection) -> Vec<String> {
        lines(
            conn,
            "SELECT 'column ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) \
                    || ' default ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '-') AS value \
             FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
             WHERE a.attrelid = 'inbox_messages'::regclass AND a.attnum > 0 AND NOT a.attisdropped \
             UNION ALL \
             SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint \
             WHERE conrelid = 'inbox_messages'::regclass \
             UNION ALL \
             SELECT 'index ' || regexp_replace(pg_get_indexdef(indexrelid), ' ON \\S+\\.inbox_messages ', ' ON inbox_messages ') \
             FROM pg_index WHERE indrelid = 'inbox_messages'::regclass",
        )
    }
}

#[cfg(feature = "mysql")]
impl SchemaDb for inbox_tests::Mysql {
    const FIRST_SCHEMA_SQL: &'static str = include_str!(
        "../../../inbox-runtime/migrations/mysql/2026-12-01-000000_create_inbox_messages/up.sql"
    );

    migration_methods!(diesel::mysql::Mysql);

    fn describe(conn: &mut MysqlConnection) -> Vec<String> {
        lines(
            conn,
            "SELECT CONCAT('column ', column_name, ' ', column_type, ' default ', \
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
             GROUP BY index_name, non_unique",
        )
    }
}

#[cfg(feature = "sqlite")]
impl SchemaDb for inbox_tests::Sqlite {
    const FIRST_SCHEMA_SQL: &'static str = include_str!(
        "../../../inbox-runtime/migrations/sqlite/2026-12-01-000000_create_inbox_messages/up.sql"
    );

    migration_methods!(diesel::sqlite::Sqlite);

    fn describe(conn: &mut SqliteConnection) -> Vec<String> {
        // A table renamed by the migration's rebuild is stored with its name
        // quoted.
        lines(
            conn,
            "SELECT type || ' ' || name || ': ' || replace(sql, '\"inbox_messages\"', 'inbox_messages') AS value \
             FROM sqlite_master WHERE tbl_name = 'inbox_messages'",
        )
    }
}

inbox_tests::backend_tests!(
    setup_and_migrations_agree,
    migrations_upgrade_an_old_inbox,
    setup_upgrades_an_old_inbox,
);

/// `db` without an inbox (the test database comes with one from `setup()`).
pub(crate) fn without_inbox<B: SchemaDb>(db: &B) -> B::Connection {
    let mut conn = db.connect();
    inbox_runtime::schema::teardown(&mut conn).expect("drop the inbox");
    conn
}

pub fn setup_and_migrations_agree<B: SchemaDb>() {
    let Some(db) = B::open() else { return };
    let db = &db;
    // The test database's inbox comes from `setup()`.
    let from_setup = B::describe(&mut db.connect());
    assert!(
        from_setup
            .iter()
            .any(|line| line.contains("inbox_messages_handler_received_at_idx")),
        "{from_setup:#?}"
    );

    let mut conn = without_inbox(db);
    assert_eq!(B::run_pending_migrations(&mut conn), B::migration_count());
    assert_eq!(B::describe(&mut conn), from_setup);
    inbox_runtime::setup(&mut conn).expect("setup after the migrations");
    assert_eq!(B::describe(&mut conn), from_setup, "setup changed nothing");
}

/// Ids an old inbox holds: expired ones of two handlers, live ones.
fn seed_old<B: SchemaDb>(conn: &mut B::Connection) {
    seed::<B>(conn, "a", &ids("old", 30), Some(10 * DAY));
    seed::<B>(conn, "b", &ids("old", 20), Some(10 * DAY));
    seed::<B>(conn, "a", &ids("new", 10), None);
}

/// The upgraded inbox: the same as a new one, with its ids, deduplicating
/// and pruning as before.
fn check_upgraded<B: SchemaDb>(conn: &mut B::Connection, new: &[String]) {
    assert_eq!(&B::describe(conn), new, "upgraded to the latest schema");
    inbox_runtime::setup(conn).expect("setup on the upgraded inbox");
    assert_eq!(&B::describe(conn), new, "setup changed nothing");
    assert_eq!(count(conn), 60, "every id kept");
    assert_eq!(
        deliver(conn, "a", "new-0", false).unwrap(),
        Outcome::Duplicate
    );
    let policy = policy(7 * DAY, DAY)
        .with_handler(handler("b"), secs(30 * DAY))
        .unwrap();
    let report = Prune::new(policy).batch_size(7).unwrap().run(conn).unwrap();
    assert_eq!(report.rows_deleted, 30, "a's expired ids: {report}");
    assert_eq!(stored_ids(conn, "b").len(), 20);
}

pub fn migrations_upgrade_an_old_inbox<B: SchemaDb>() {
    let Some(db) = B::open() else { return };
    let db = &db;
    let new = B::describe(&mut db.connect());
    let mut conn = without_inbox(db);
    B::run_first_migration(&mut conn);
    assert_ne!(B::describe(&mut conn), new, "the first version's inbox");
    seed_old::<B>(&mut conn);
    assert_eq!(
        B::run_pending_migrations(&mut conn),
        B::migration_count() - 1
    );
    check_upgraded::<B>(&mut conn, &new);
}

pub fn setup_upgrades_an_old_inbox<B: SchemaDb>() {
    let Some(db) = B::open() else { return };
    let db = &db;
    let new = B::describe(&mut db.connect());
    let mut conn = without_inbox(db);
    conn.batch_execute(B::FIRST_SCHEMA_SQL)
        .expect("the first version's setup()");
    assert_ne!(B::describe(&mut conn), new, "the first version's inbox");
    seed_old::<B>(&mut conn);
    inbox_runtime::setup(&mut conn).expect("setup on an old inbox");
    check_upgraded::<B>(&mut conn, &new);
}
