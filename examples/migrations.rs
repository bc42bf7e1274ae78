//! The inbox's embedded migrations beside an application's own: run both
//! sets, use them, then revert them, on embedded SQLite (no server).
//!
//! ```text
//! cargo run --example migrations
//! ```
//!
//! The application's migrations live in `examples/app_migrations/`: one older
//! than the inbox's, one newer. Diesel's harness reverts an applied version
//! only if the source it is given contains it, so once both sets are applied,
//! neither the application's source nor the inbox's alone can revert
//! (`UnknownMigrationVersion`). `inbox_runtime::migrations::with_inbox`
//! combines them into one source that runs and reverts both.

use std::error::Error;

use diesel::migration::MigrationSource;
use diesel::prelude::*;
use diesel::sqlite::Sqlite;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationError, MigrationHarness};
use inbox_runtime::idempotent;
use inbox_runtime::migrations::with_inbox;

/// The application's own migrations, embedded at compile time.
const APP_MIGRATIONS: EmbeddedMigrations = embed_migrations!("app_migrations");

diesel::table! {
    /// The application's accounts (its first migration).
    accounts (id) {
        /// The account number.
        id -> Integer,
        /// Who owns it.
        owner -> Text,
    }
}

diesel::table! {
    /// The payments recorded by the handler (its second migration).
    payments (id) {
        /// Row id.
        id -> Integer,
        /// The account paid into.
        account_id -> Integer,
        /// The amount in cents.
        cents -> BigInt,
    }
}

diesel::allow_tables_to_appear_in_same_query!(accounts, payments);

/// A message as the producer published it.
struct PaymentReceived {
    id: String,
    account: i32,
    cents: i64,
}

/// Records a payment once, however often it is delivered.
#[idempotent(id = msg.id, handler = "example.record_payment")]
fn record_payment(conn: &mut SqliteConnection, msg: &PaymentReceived) -> QueryResult<()> {
    diesel::insert_into(payments::table)
        .values((
            payments::account_id.eq(msg.account),
            payments::cents.eq(msg.cents),
        ))
        .execute(conn)?;
    Ok(())
}

type Result<T, E = Box<dyn Error + Send + Sync>> = std::result::Result<T, E>;

/// Whose migration `version` is.
fn owner(version: &str) -> Result<&'static str> {
    let app = MigrationSource::<Sqlite>::migrations(&APP_MIGRATIONS)?;
    Ok(
        if app
            .iter()
            .any(|m| m.name().version().to_string() == version)
        {
            "the app's"
        } else {
            "the inbox's"
        },
    )
}

/// A row of `SELECT COUNT(*) AS n`.
#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

fn table_exists(conn: &mut SqliteConnection, table: &str) -> QueryResult<bool> {
    let tables = diesel::sql_query(
        "SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'table' AND name = ?",
    )
    .bind::<diesel::sql_types::Text, _>(table)
    .get_result::<Count>(conn)?;
    Ok(tables.n > 0)
}

fn main() -> Result<()> {
    let mut conn = SqliteConnection::establish(":memory:")?;

    // 1. Both sets through one source: pending migrations run in version
    //    order, the two sets interleaved.
    println!("running the app's and the inbox's migrations:");
    let ran: Vec<String> = conn
        .run_pending_migrations(with_inbox(APP_MIGRATIONS))?
        .iter()
        .map(ToString::to_string)
        .collect();
    for version in &ran {
        println!("  applied  {version}  ({} migration)", owner(version)?);
    }

    // 2. Use them: an idempotent handler writing into the app's table.
    diesel::insert_into(accounts::table)
        .values((accounts::id.eq(1), accounts::owner.eq("ada")))
        .execute(&mut conn)?;
    let payment = PaymentReceived {
        id: "pay-1".into(),
        account: 1,
        cents: 250,
    };
    record_payment(&mut conn, &payment)?;
    record_payment(&mut conn, &payment)?; // a redelivery: no effect
    let recorded: i64 = payments::table.count().get_result(&mut conn)?;
    assert_eq!(recorded, 1, "one payment despite two deliveries");
    println!("delivered pay-1 twice: {recorded} payment recorded");

    // 3. Why the combined source: the newest applied version is the app's,
    //    and the inbox's source alone does not contain it.
    let newest = ran.last().expect("migrations ran").clone();
    if owner(&newest)? == "the app's" {
        match conn.revert_last_migration(inbox_runtime::migrations::SQLITE) {
            Err(error)
                if matches!(
                    error.downcast_ref::<MigrationError>(),
                    Some(MigrationError::UnknownMigrationVersion(_))
                ) =>
            {
                println!("the inbox's source alone cannot revert {newest}: {error}");
            }
            other => return Err(format!("expected UnknownMigrationVersion, got {other:?}").into()),
        }
    }

    // 4. Revert the newest migration, then all of them, through the combined
    //    source: newest first, whichever set each belongs to.
    let version = conn
        .revert_last_migration(with_inbox(APP_MIGRATIONS))?
        .to_string();
    assert_eq!(version, newest);
    println!("reverted {version}  ({} migration)", owner(&version)?);
    let reverted: Vec<String> = conn
        .revert_all_migrations(with_inbox(APP_MIGRATIONS))?
        .iter()
        .map(ToString::to_string)
        .collect();
    for version in &reverted {
        println!("reverted {version}  ({} migration)", owner(version)?);
    }
    assert_eq!(reverted.len() + 1, ran.len());
    assert!(conn.applied_migrations()?.is_empty());
    for table in ["accounts", "payments", "inbox_messages"] {
        assert!(!table_exists(&mut conn, table)?, "{table} is still there");
    }

    // 5. And back up again.
    let again = conn
        .run_pending_migrations(with_inbox(APP_MIGRATIONS))?
        .len();
    assert_eq!(again, ran.len());
    println!(
        "ok: {} migrations run, reverted and run again ({} of them the inbox's)",
        ran.len(),
        ran.len() - MigrationSource::<Sqlite>::migrations(&APP_MIGRATIONS)?.len()
    );
    Ok(())
}
