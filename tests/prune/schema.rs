//! The schema the pruning relies on, however the inbox was created: by
//! `setup()`, by the migrations, or by an earlier version of either, then
//! upgraded. And `received_at` on PostgreSQL: the claim's statement time,
//! not its transaction's start.
//!
//! - `setup_and_migrations_agree`: `setup()` and the migrations make the same
//!   table, indexes and defaults (both include the `(handler, received_at)`
//!   index pruning walks);
//! - `migrations_upgrade_an_old_inbox` / `setup_upgrades_an_old_inbox`: an
//!   inbox created by the first migration (or the first version's
//!   `setup()`), holding ids, becomes the same as a new one, keeps its ids,
//!   and `setup()` run again changes nothing;
//! - PostgreSQL: a claim made late in a long transaction is dated by its
//!   statement (plain table, generation tables, upgraded tables), and the
//!   generation layout's functions are upgraded by its migration.

use diesel::connection::SimpleConnection;
use diesel::migration::{Migration, MigrationSource};
use diesel::prelude::*;
use diesel_migrations::MigrationHarness;
use inbox_runtime::migrations::EmbeddedInboxMigrations;
use inbox_runtime::{Outcome, Prune};

use crate::common::*;
use crate::window::per_backend;

/// What the schema tests need of a backend.
pub trait SchemaDb: PruneDb {
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

#[derive(QueryableByName)]
struct Line {
    #[diesel(sql_type = diesel::sql_types::Text)]
    line: String,
}

fn lines<C>(conn: &mut C, sql: &str) -> Vec<String>
where
    C: diesel::connection::LoadConnection,
    diesel::query_builder::SqlQuery: diesel::query_dsl::LoadQuery<'static, C, Line>,
{
    let mut lines: Vec<String> = diesel::sql_query(sql)
        .load::<Line>(conn)
        .expect("describe the inbox")
        .into_iter()
        .map(|line| line.line)
        .collect();
    lines.sort();
    lines
}

#[cfg(feature = "postgres")]
impl SchemaDb for inbox_suite::testdb::PgDatabase {
    const FIRST_SCHEMA_SQL: &'static str = include_str!(
        "../../inbox-runtime/migrations/postgres/2026-12-01-000000_create_inbox_messages/up.sql"
    );

    migration_methods!(diesel::pg::Pg);

    fn describe(conn: &mut PgConnection) -> Vec<String> {
        lines(
            conn,
            "SELECT 'column ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) \
                    || ' default ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '-') AS line \
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
impl SchemaDb for inbox_suite::testdb::MysqlDatabase {
    const FIRST_SCHEMA_SQL: &'static str = include_str!(
        "../../inbox-runtime/migrations/mysql/2026-12-01-000000_create_inbox_messages/up.sql"
    );

    migration_methods!(diesel::mysql::Mysql);

    fn describe(conn: &mut MysqlConnection) -> Vec<String> {
        lines(
            conn,
            "SELECT CONCAT('column ', column_name, ' ', column_type, ' default ', \
                           COALESCE(column_default, '-')) AS line \
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
impl SchemaDb for inbox_suite::testdb::SqliteDatabase {
    const FIRST_SCHEMA_SQL: &'static str = include_str!(
        "../../inbox-runtime/migrations/sqlite/2026-12-01-000000_create_inbox_messages/up.sql"
    );

    migration_methods!(diesel::sqlite::Sqlite);

    fn describe(conn: &mut SqliteConnection) -> Vec<String> {
        // A table renamed by the migration's rebuild is stored with its name
        // quoted.
        lines(
            conn,
            "SELECT type || ' ' || name || ': ' || replace(sql, '\"inbox_messages\"', 'inbox_messages') AS line \
             FROM sqlite_master WHERE tbl_name = 'inbox_messages'",
        )
    }
}

per_backend!(
    setup_and_migrations_agree,
    migrations_upgrade_an_old_inbox,
    setup_upgrades_an_old_inbox,
);

/// `db` without an inbox (the test database comes with one from `setup()`).
fn without_inbox<D: SchemaDb>(db: &D) -> D::Connection {
    let mut conn = db.connect();
    inbox_runtime::schema::teardown(&mut conn).expect("drop the inbox");
    conn
}

fn setup_and_migrations_agree<D: SchemaDb>(db: &D) {
    // The test database's inbox comes from `setup()`.
    let from_setup = D::describe(&mut db.connect());
    assert!(
        from_setup
            .iter()
            .any(|line| line.contains("inbox_messages_handler_received_at_idx")),
        "{from_setup:#?}"
    );

    let mut conn = without_inbox(db);
    assert_eq!(D::run_pending_migrations(&mut conn), D::migration_count());
    assert_eq!(D::describe(&mut conn), from_setup);
    inbox_runtime::setup(&mut conn).expect("setup after the migrations");
    assert_eq!(D::describe(&mut conn), from_setup, "setup changed nothing");
}

/// Ids an old inbox holds: expired ones of two handlers, live ones.
fn seed_old<D: SchemaDb>(conn: &mut D::Connection) {
    seed::<D>(conn, "a", &ids("old", 30), Some(10 * DAY));
    seed::<D>(conn, "b", &ids("old", 20), Some(10 * DAY));
    seed::<D>(conn, "a", &ids("new", 10), None);
}

/// The upgraded inbox: the same as a new one, with its ids, deduplicating
/// and pruning as before.
fn check_upgraded<D: SchemaDb>(conn: &mut D::Connection, new: &[String]) {
    assert_eq!(&D::describe(conn), new, "upgraded to the latest schema");
    inbox_runtime::setup(conn).expect("setup on the upgraded inbox");
    assert_eq!(&D::describe(conn), new, "setup changed nothing");
    assert_eq!(D::count(conn), 60, "every id kept");
    assert_eq!(
        deliver(conn, "a", "new-0", false).unwrap(),
        Outcome::Duplicate
    );
    let policy = policy(7 * DAY, DAY).with_handler(handler("b"), secs(30 * DAY));
    let report = Prune::new(policy).batch_size(7).run(conn).unwrap();
    assert_eq!(report.rows_deleted, 30, "a's expired ids: {report}");
    assert_eq!(D::stored_ids(conn, "b").len(), 20);
}

fn migrations_upgrade_an_old_inbox<D: SchemaDb>(db: &D) {
    let new = D::describe(&mut db.connect());
    let mut conn = without_inbox(db);
    D::run_first_migration(&mut conn);
    assert_ne!(D::describe(&mut conn), new, "the first version's inbox");
    seed_old::<D>(&mut conn);
    assert_eq!(
        D::run_pending_migrations(&mut conn),
        D::migration_count() - 1
    );
    check_upgraded::<D>(&mut conn, &new);
}

fn setup_upgrades_an_old_inbox<D: SchemaDb>(db: &D) {
    let new = D::describe(&mut db.connect());
    let mut conn = without_inbox(db);
    conn.batch_execute(D::FIRST_SCHEMA_SQL)
        .expect("the first version's setup()");
    assert_ne!(D::describe(&mut conn), new, "the first version's inbox");
    seed_old::<D>(&mut conn);
    inbox_runtime::setup(&mut conn).expect("setup on an old inbox");
    check_upgraded::<D>(&mut conn, &new);
}

#[cfg(feature = "postgres")]
mod postgres_only {
    use std::time::Duration;

    use inbox_runtime::prune::partitioned;
    use inbox_suite::testdb::{PgDatabase, TestDatabase as _};

    use super::*;

    #[derive(QueryableByName)]
    struct Clock {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        after_start: bool,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        not_after_now: bool,
    }

    /// Claims `id` late in a transaction that began earlier: `received_at`
    /// is later than the transaction's start (`now()`), and not later than
    /// the clock after the claim.
    fn late_claim(conn: &mut PgConnection, id: &str) {
        let clock = conn
            .transaction(|conn| {
                // The transaction's start is fixed by its first statement.
                conn.batch_execute("SELECT now(); SELECT pg_sleep(0.05)")?;
                assert_eq!(
                    deliver(conn, "h", id, false).expect("the claim"),
                    Outcome::Processed(())
                );
                diesel::sql_query(format!(
                    "SELECT received_at > now() AS after_start, \
                            received_at <= clock_timestamp() AS not_after_now \
                     FROM inbox_messages WHERE handler = 'h' AND message_id = '{id}'"
                ))
                .get_result::<Clock>(conn)
            })
            .unwrap();
        assert!(
            clock.after_start,
            "{id}: received_at is the claim's statement time, not the transaction's start"
        );
        assert!(clock.not_after_now);
    }

    #[test]
    fn a_claim_late_in_a_transaction_gets_its_statement_time() {
        let Some(db) = PgDatabase::open() else {
            return;
        };
        let mut conn = db.connect();
        late_claim(&mut conn, "plain");

        // An inbox of the first version, upgraded by the migrations.
        let mut conn = without_inbox(&db);
        PgDatabase::run_first_migration(&mut conn);
        PgDatabase::run_pending_migrations(&mut conn);
        late_claim(&mut conn, "migrated");

        // The generation layout: the converted table, then a new generation.
        partitioned::setup(&mut conn).unwrap();
        late_claim(&mut conn, "generation-1");
        partitioned::rotate(&mut conn, Duration::from_secs(5)).unwrap();
        late_claim(&mut conn, "generation-2");
    }

    #[derive(QueryableByName)]
    struct Proc {
        #[diesel(sql_type = diesel::sql_types::Text)]
        proname: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        config: Option<String>,
    }

    /// A generation layout converted by the first versions of both migration
    /// sets, with a generation rotated by the old functions, is upgraded by
    /// the later migrations: functions, the current table's index and
    /// default, and the tables of later rotations.
    #[test]
    fn migrations_upgrade_an_old_generation_layout() {
        let Some(db) = PgDatabase::open() else {
            return;
        };
        let new = PgDatabase::describe(&mut db.connect());
        let mut conn = without_inbox(&db);
        let mut layout =
            MigrationSource::<diesel::pg::Pg>::migrations(&partitioned::MIGRATIONS).unwrap();
        layout.sort_by_key(|migration| migration.name().version().to_string());
        PgDatabase::run_first_migration(&mut conn);
        conn.run_migration(&*layout[0]).unwrap();
        assert!(deliver(&mut conn, "h", "before", false).is_ok());
        partitioned::rotate(&mut conn, Duration::from_secs(5)).unwrap();

        PgDatabase::run_pending_migrations(&mut conn);
        conn.run_pending_migrations(partitioned::MIGRATIONS)
            .unwrap();
        let functions: Vec<Proc> = diesel::sql_query(
            "SELECT proname::text AS proname, array_to_string(proconfig, ',') AS config \
             FROM pg_proc WHERE pronamespace = current_schema()::regnamespace \
             ORDER BY proname",
        )
        .load(&mut conn)
        .unwrap();
        let expected = format!("search_path=pg_catalog, {}, pg_temp", db.schema());
        assert_eq!(functions.len(), 3);
        for function in &functions {
            assert_eq!(
                function.config.as_deref(),
                Some(expected.as_str()),
                "{}",
                function.proname
            );
        }
        let layout_columns = |lines: Vec<String>| -> Vec<String> {
            lines
                .into_iter()
                .filter(|line| line.starts_with("index") || line.contains("received_at"))
                .map(|line| line.replace("_g2_pkey", "_pkey"))
                .collect()
        };
        let plain = layout_columns(new);
        assert_eq!(layout_columns(PgDatabase::describe(&mut conn)), plain);
        partitioned::rotate(&mut conn, Duration::from_secs(5)).unwrap();
        let rotated: Vec<String> = layout_columns(PgDatabase::describe(&mut conn))
            .into_iter()
            .map(|line| line.replace("_g3_pkey", "_pkey"))
            .collect();
        assert_eq!(rotated, plain);
        assert_eq!(
            deliver(&mut conn, "h", "before", false).unwrap(),
            Outcome::Duplicate
        );
    }
}
