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
//! layout's migrations) is in `partitioned`, with the helpers from here.

use diesel::connection::SimpleConnection;
use diesel::migration::{Migration, MigrationConnection, MigrationSource};
use diesel::prelude::*;
use diesel_migrations::MigrationHarness;
use inbox_runtime::migrations::EmbeddedInboxMigrations;
use inbox_runtime::{Outcome, Prune};
use inbox_tests::DieselBackend;

use crate::support::*;

/// The inbox's migrations for `DB`, oldest first.
fn migrations<DB: EmbeddedInboxMigrations>() -> Vec<Box<dyn Migration<DB>>> {
    let mut all =
        MigrationSource::<DB>::migrations(&DB::MIGRATIONS).expect("the embedded migrations");
    all.sort_by_key(|migration| migration.name().version().to_string());
    all
}

/// How many migrations the inbox has.
fn migration_count<B>() -> usize
where
    B: TestBackend,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    migrations::<DieselBackend<B>>().len()
}

/// Runs the first of the inbox's migrations only, as the first version of
/// the crate would have.
pub(crate) fn run_first_migration<C>(conn: &mut C)
where
    C: MigrationHarness<C::Backend> + MigrationConnection,
    C::Backend: EmbeddedInboxMigrations,
{
    MigrationConnection::setup(conn).expect("the migrations table");
    conn.run_migration(&*migrations::<C::Backend>()[0])
        .expect("the first migration");
}

/// Runs the inbox's pending migrations; returns how many ran.
pub(crate) fn run_pending_migrations<C>(conn: &mut C) -> usize
where
    C: MigrationHarness<C::Backend> + Connection,
    C::Backend: EmbeddedInboxMigrations,
{
    inbox_runtime::migrations::run_pending(conn).expect("the pending migrations")
}

/// The inbox table as the database describes it (columns, defaults,
/// constraints, indexes), one line per item, sorted.
pub(crate) fn describe<B: TestBackend>(conn: &mut B::Connection) -> Vec<String> {
    let mut lines = conn.texts(B::DESCRIBE_INBOX_SQL);
    lines.sort();
    lines
}

inbox_tests::backend_tests! {
    setup_and_migrations_agree,
    migrations_upgrade_an_old_inbox,
    setup_upgrades_an_old_inbox;
    only [postgres, mysql]: concurrent_setups_never_fail;
}

/// Services starting together each call `setup()`: on a database without
/// an inbox, then on one with it, 6 at once, 10 times, none fails (on
/// PostgreSQL two creations of one catalog entry race — "duplicate key
/// value", "tuple concurrently updated" — unless they take turns).
pub fn concurrent_setups_never_fail<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    drop(without_inbox(&db));
    for round in 0..10 {
        let barrier = std::sync::Barrier::new(6);
        let failures: Vec<String> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..6)
                .map(|_| {
                    let mut conn = db.connect();
                    let barrier = &barrier;
                    scope.spawn(move || {
                        barrier.wait();
                        inbox_runtime::setup(&mut conn).err().map(|e| {
                            format!(
                                "{e}: {:?}",
                                std::error::Error::source(&e).map(|s| s.to_string())
                            )
                        })
                    })
                })
                .collect();
            threads
                .into_iter()
                .filter_map(|t| t.join().unwrap())
                .collect()
        });
        assert!(failures.is_empty(), "round {round}: {failures:?}");
    }
}

/// `db` without an inbox (the test database comes with one from `setup()`).
pub(crate) fn without_inbox<B: TestBackend>(db: &B) -> B::Connection {
    let mut conn = db.connect();
    inbox_runtime::schema::teardown(&mut conn).expect("drop the inbox");
    conn
}

pub fn setup_and_migrations_agree<B>()
where
    B: TestBackend,
    B::Connection: MigrationHarness<DieselBackend<B>> + MigrationConnection,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    let Some(db) = B::open() else { return };
    let db = &db;
    // The test database's inbox comes from `setup()`.
    let from_setup = describe::<B>(&mut db.connect());
    assert!(
        from_setup
            .iter()
            .any(|line| line.contains("inbox_messages_handler_received_at_idx")),
        "{from_setup:#?}"
    );

    let mut conn = without_inbox(db);
    assert_eq!(run_pending_migrations(&mut conn), migration_count::<B>());
    assert_eq!(describe::<B>(&mut conn), from_setup);
    inbox_runtime::setup(&mut conn).expect("setup after the migrations");
    assert_eq!(
        describe::<B>(&mut conn),
        from_setup,
        "setup changed nothing"
    );
}

/// Ids an old inbox holds: expired ones of two handlers, live ones.
fn seed_old<B: TestBackend>(conn: &mut B::Connection) {
    seed::<B>(conn, "a", &ids("old", 30), Some(10 * DAY));
    seed::<B>(conn, "b", &ids("old", 20), Some(10 * DAY));
    seed::<B>(conn, "a", &ids("new", 10), None);
}

/// The upgraded inbox: the same as a new one, with its ids, deduplicating
/// and pruning as before.
fn check_upgraded<B: TestBackend>(conn: &mut B::Connection, new: &[String]) {
    assert_eq!(&describe::<B>(conn), new, "upgraded to the latest schema");
    inbox_runtime::setup(conn).expect("setup on the upgraded inbox");
    assert_eq!(&describe::<B>(conn), new, "setup changed nothing");
    assert_eq!(count(conn), 60, "every id kept");
    assert_eq!(
        deliver(conn, "a", "new-0", false).unwrap(),
        Outcome::Duplicate
    );
    let policy = policy(7 * DAY, DAY).with_handler(handler("b"), secs(30 * DAY));
    let report = Prune::new(policy).batch_size(7).run(conn).unwrap();
    assert_eq!(report.rows_deleted, 30, "a's expired ids: {report}");
    assert_eq!(stored_ids(conn, "b").len(), 20);
}

pub fn migrations_upgrade_an_old_inbox<B>()
where
    B: TestBackend,
    B::Connection: MigrationHarness<DieselBackend<B>> + MigrationConnection,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    let Some(db) = B::open() else { return };
    let db = &db;
    let new = describe::<B>(&mut db.connect());
    let mut conn = without_inbox(db);
    run_first_migration(&mut conn);
    assert_ne!(describe::<B>(&mut conn), new, "the first version's inbox");
    seed_old::<B>(&mut conn);
    assert_eq!(
        run_pending_migrations(&mut conn),
        migration_count::<B>() - 1
    );
    check_upgraded::<B>(&mut conn, &new);
}

pub fn setup_upgrades_an_old_inbox<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let db = &db;
    let new = describe::<B>(&mut db.connect());
    let mut conn = without_inbox(db);
    conn.batch_execute(B::FIRST_SCHEMA_SQL)
        .expect("the first version's setup()");
    assert_ne!(describe::<B>(&mut conn), new, "the first version's inbox");
    seed_old::<B>(&mut conn);
    inbox_runtime::setup(&mut conn).expect("setup on an old inbox");
    check_upgraded::<B>(&mut conn, &new);
}
