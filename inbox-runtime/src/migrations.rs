//! The inbox schema as Diesel migrations, one set per backend.
//!
//! They record themselves in Diesel's `__diesel_schema_migrations` table (under
//! versions such as `20261201000000`), beside your application's migrations.
//! Three ways to run them:
//!
//! - [`with_inbox`]: your migrations and the inbox's as one
//!   [`MigrationSource`], for every [`MigrationHarness`] method: run both sets
//!   in version order, and revert either set's migrations
//!   (`revert_last_migration`, `revert_all_migrations`). This is the way to
//!   use when you revert migrations.
//! - [`run_pending`]: applies the inbox's pending migrations on their own.
//! - Users of `diesel_cli` can instead copy `inbox-runtime/migrations/<backend>/`
//!   into their migrations folder (then do not also use [`with_inbox`]: the
//!   copies would have the same versions, which it refuses).
//!
//! ## Why revert needs the combined source
//! Diesel's harness reverts by looking the *applied* versions up in the source
//! it is given: `revert_last_migration(source)` takes the newest version in
//! `__diesel_schema_migrations`, whichever set it came from, and fails with
//! `UnknownMigrationVersion` when `source` does not contain it;
//! `revert_all_migrations` fails at the first applied version it cannot find.
//! So once both sets are applied, neither your source nor
//! [`POSTGRES`]/[`SQLITE`]/[`MYSQL`] alone can revert: the newest version
//! belongs to the other one (or soon will, after your next migration). The
//! source from [`with_inbox`] contains both, so every applied version is
//! found, and reverting walks back through both sets newest first.

use std::collections::HashMap;
use std::fmt;

use diesel::Connection;
use diesel::backend::Backend;
use diesel::migration::{Migration, MigrationSource};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness};

use crate::backend::InboxBackend;
use crate::error::InboxError;

/// The PostgreSQL migrations.
#[cfg(feature = "postgres")]
pub const POSTGRES: EmbeddedMigrations = crate::backend::postgres::MIGRATIONS;
/// The SQLite migrations.
#[cfg(feature = "sqlite")]
pub const SQLITE: EmbeddedMigrations = crate::backend::sqlite::MIGRATIONS;
/// The MySQL / MariaDB migrations.
#[cfg(feature = "mysql")]
pub const MYSQL: EmbeddedMigrations = crate::backend::mysql::MIGRATIONS;

/// A backend whose inbox migrations are embedded in this crate.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use inbox_runtime::migrations::EmbeddedInboxMigrations;
///
/// fn inbox_migrations<DB: EmbeddedInboxMigrations>() -> diesel_migrations::EmbeddedMigrations {
///     DB::MIGRATIONS
/// }
/// let _sqlite = inbox_migrations::<diesel::sqlite::Sqlite>();
/// # }
/// ```
pub trait EmbeddedInboxMigrations: InboxBackend {
    /// This backend's migrations.
    const MIGRATIONS: EmbeddedMigrations;
}

#[cfg(feature = "postgres")]
impl EmbeddedInboxMigrations for diesel::pg::Pg {
    const MIGRATIONS: EmbeddedMigrations = POSTGRES;
}
#[cfg(feature = "sqlite")]
impl EmbeddedInboxMigrations for diesel::sqlite::Sqlite {
    const MIGRATIONS: EmbeddedMigrations = SQLITE;
}
#[cfg(feature = "mysql")]
impl EmbeddedInboxMigrations for diesel::mysql::Mysql {
    const MIGRATIONS: EmbeddedMigrations = MYSQL;
}

/// The inbox's migrations for the connection's backend, as a
/// [`MigrationSource`]: [`POSTGRES`], [`SQLITE`] or [`MYSQL`], picked by the
/// harness's backend so that generic code need not name it.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::{Connection, SqliteConnection};
/// use diesel_migrations::MigrationHarness;
/// use inbox_runtime::migrations::InboxMigrations;
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// conn.run_pending_migrations(InboxMigrations)?;
/// assert!(!conn.has_pending_migration(InboxMigrations)?);
/// # }
/// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InboxMigrations;

impl<DB> MigrationSource<DB> for InboxMigrations
where
    DB: EmbeddedInboxMigrations,
{
    fn migrations(&self) -> diesel::migration::Result<Vec<Box<dyn Migration<DB>>>> {
        MigrationSource::<DB>::migrations(&DB::MIGRATIONS)
    }
}

/// Your application's migrations and the inbox's, as one [`MigrationSource`].
///
/// Pass it to any [`MigrationHarness`] method instead of your own source:
/// `run_pending_migrations` applies the pending migrations of both sets in
/// version order, and `revert_last_migration` / `revert_all_migrations` find
/// every applied version, whichever set it belongs to. (Given only your
/// source or only the inbox's, they fail with `UnknownMigrationVersion` as
/// soon as the newest applied version is the other set's; see the [module
/// documentation](self).)
///
/// `app` is any source: `embed_migrations!("migrations")`, or
/// `FileBasedMigrations` for a folder read at run time. A version present in
/// both sets is refused with [`DuplicateMigrationVersion`] (it happens when
/// the inbox's migration folder was also copied into yours). Add more sets
/// with [`Combined::and`], e.g. PostgreSQL's generation layout
/// (`inbox_runtime::prune::partitioned::MIGRATIONS`).
///
/// `cargo run --example migrations` runs both sets and reverts them on
/// embedded SQLite.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::{Connection, SqliteConnection};
/// use diesel_migrations::{FileBasedMigrations, MigrationHarness};
/// use inbox_runtime::migrations::with_inbox;
///
/// # let dir = std::env::temp_dir().join(format!("inbox-doc-with-inbox-{}", std::process::id()));
/// # for (name, up, down) in [
/// #     ("2025-01-01-000000_create_accounts", "CREATE TABLE accounts (id INTEGER PRIMARY KEY)", "DROP TABLE accounts"),
/// #     ("2999-01-01-000000_create_payments", "CREATE TABLE payments (id INTEGER PRIMARY KEY)", "DROP TABLE payments"),
/// # ] {
/// #     std::fs::create_dir_all(dir.join(name))?;
/// #     std::fs::write(dir.join(name).join("up.sql"), up)?;
/// #     std::fs::write(dir.join(name).join("down.sql"), down)?;
/// # }
/// // Your migrations: `embed_migrations!("migrations")`, or a folder read at run time.
/// let app = || FileBasedMigrations::from_path(&dir);
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// let applied = conn.run_pending_migrations(with_inbox(app()?))?.len();
/// assert!(applied > 2, "both of the app's and the inbox's");
///
/// // The newest applied version is the app's: reverting it needs the combined source.
/// let reverted = conn.revert_last_migration(with_inbox(app()?))?;
/// assert_eq!(reverted.to_string(), "29990101000000");
/// conn.revert_all_migrations(with_inbox(app()?))?;
/// assert!(conn.applied_migrations()?.is_empty());
/// # std::fs::remove_dir_all(&dir)?;
/// # }
/// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
/// ```
pub fn with_inbox<S>(app: S) -> Combined<S, InboxMigrations> {
    Combined::new(app, InboxMigrations)
}

/// Two migration sources as one; see [`with_inbox`].
///
/// Its migrations are both sources' migrations, sorted by version. A version
/// that both sources contain is an error ([`DuplicateMigrationVersion`]),
/// reported before anything runs: applying or reverting one of two
/// different migrations under one version would be a silent guess.
///
/// ```
/// # #[cfg(feature = "postgres")] {
/// use diesel::migration::MigrationSource;
/// use diesel_migrations::MigrationHarness;
/// use inbox_runtime::migrations::with_inbox;
///
/// fn migrate(
///     conn: &mut diesel::PgConnection,
///     app: impl MigrationSource<diesel::pg::Pg>,
/// ) -> diesel::migration::Result<()> {
///     // Your migrations, the inbox's, and the generation layout's (PostgreSQL):
///     let all = with_inbox(app).and(inbox_runtime::prune::partitioned::MIGRATIONS);
///     conn.run_pending_migrations(all)?;
///     Ok(())
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Combined<A, B> {
    first: A,
    second: B,
}

impl<A, B> Combined<A, B> {
    /// `first`'s migrations and `second`'s, as one source.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use diesel::migration::MigrationSource;
    /// use diesel::sqlite::Sqlite;
    /// use inbox_runtime::migrations::{Combined, InboxMigrations};
    ///
    /// // The same versions twice: refused.
    /// let twice = Combined::new(InboxMigrations, InboxMigrations);
    /// assert!(MigrationSource::<Sqlite>::migrations(&twice).is_err());
    /// # }
    /// ```
    pub fn new(first: A, second: B) -> Self {
        Combined { first, second }
    }

    /// These migrations and `next`'s, as one source.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use diesel::backend::Backend;
    /// use diesel::migration::{Migration, MigrationSource};
    /// use diesel::sqlite::Sqlite;
    /// use inbox_runtime::migrations::{with_inbox, InboxMigrations};
    ///
    /// /// Any source: here, one without migrations.
    /// struct Nothing;
    /// impl<DB: Backend> MigrationSource<DB> for Nothing {
    ///     fn migrations(&self) -> diesel::migration::Result<Vec<Box<dyn Migration<DB>>>> {
    ///         Ok(Vec::new())
    ///     }
    /// }
    ///
    /// let all = with_inbox(Nothing).and(Nothing);
    /// let inbox = MigrationSource::<Sqlite>::migrations(&InboxMigrations)?.len();
    /// assert_eq!(MigrationSource::<Sqlite>::migrations(&all)?.len(), inbox);
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    /// ```
    pub fn and<C>(self, next: C) -> Combined<Self, C> {
        Combined::new(self, next)
    }
}

impl<DB, A, B> MigrationSource<DB> for Combined<A, B>
where
    DB: Backend,
    A: MigrationSource<DB>,
    B: MigrationSource<DB>,
{
    fn migrations(&self) -> diesel::migration::Result<Vec<Box<dyn Migration<DB>>>> {
        let mut all = self.first.migrations()?;
        let second = self.second.migrations()?;
        let first_names: HashMap<String, String> = all
            .iter()
            .map(|m| (m.name().version().to_string(), m.name().to_string()))
            .collect();
        for migration in &second {
            let version = migration.name().version().to_string();
            if let Some(first) = first_names.get(&version) {
                return Err(Box::new(DuplicateMigrationVersion {
                    version,
                    first: first.clone(),
                    second: migration.name().to_string(),
                }));
            }
        }
        all.extend(second);
        all.sort_by_cached_key(|m| m.name().version().to_string());
        Ok(all)
    }
}

/// Two combined migration sources contain the same version; see
/// [`Combined`].
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::migration::MigrationSource;
/// use diesel::sqlite::Sqlite;
/// use inbox_runtime::migrations::{with_inbox, DuplicateMigrationVersion, InboxMigrations};
///
/// let error = MigrationSource::<Sqlite>::migrations(&with_inbox(InboxMigrations)).err().unwrap();
/// let duplicate = error.downcast_ref::<DuplicateMigrationVersion>().unwrap();
/// assert!(duplicate.to_string().contains(duplicate.version()));
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateMigrationVersion {
    version: String,
    first: String,
    second: String,
}

impl DuplicateMigrationVersion {
    /// The version both sources contain, such as `20261201000000`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// # use diesel::migration::MigrationSource;
    /// # use inbox_runtime::migrations::{with_inbox, DuplicateMigrationVersion, InboxMigrations};
    /// let error = MigrationSource::<diesel::sqlite::Sqlite>::migrations(&with_inbox(InboxMigrations)).err().unwrap();
    /// let version = error.downcast_ref::<DuplicateMigrationVersion>().unwrap().version();
    /// assert!(version.chars().all(|c| c.is_ascii_digit()));
    /// # }
    /// ```
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The two migrations' names (`<version>_<name>`), the first source's first.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// # use diesel::migration::MigrationSource;
    /// # use inbox_runtime::migrations::{with_inbox, DuplicateMigrationVersion, InboxMigrations};
    /// let error = MigrationSource::<diesel::sqlite::Sqlite>::migrations(&with_inbox(InboxMigrations)).err().unwrap();
    /// let (first, second) = error.downcast_ref::<DuplicateMigrationVersion>().unwrap().names();
    /// assert_eq!(first, second, "the inbox's migration, twice");
    /// # }
    /// ```
    pub fn names(&self) -> (&str, &str) {
        (&self.first, &self.second)
    }
}

impl fmt::Display for DuplicateMigrationVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "migration version {} is in two of the combined migration sources ({} and {}); \
             if the inbox's migrations were copied into your migrations folder, remove the \
             copies or stop combining the inbox's",
            self.version, self.first, self.second
        )
    }
}

impl std::error::Error for DuplicateMigrationVersion {}

/// Applies the inbox migrations that have not run on `conn` yet and returns
/// how many ran.
///
/// To revert them later beside your own migrations, run both sets through
/// [`with_inbox`] instead.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::{Connection, SqliteConnection};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// assert!(inbox_runtime::migrations::run_pending(&mut conn)? >= 1);
/// assert_eq!(inbox_runtime::migrations::run_pending(&mut conn)?, 0);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_pending<C>(conn: &mut C) -> Result<usize, InboxError>
where
    C: Connection + MigrationHarness<C::Backend>,
    C::Backend: EmbeddedInboxMigrations,
{
    let applied = conn
        .run_pending_migrations(<C::Backend as EmbeddedInboxMigrations>::MIGRATIONS)
        .map_err(InboxError::Migration)?;
    Ok(applied.len())
}
