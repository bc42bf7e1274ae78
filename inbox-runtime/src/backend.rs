//! The database backends the inbox supports, and what differs between them.
//!
//! Everything backend-specific lives behind [`InboxBackend`]: the schema and
//! the single claim statement. The rest of the runtime is written once,
//! generically over Diesel's `Connection`.

use diesel::backend::Backend;
use diesel::query_builder::AstPass;
use diesel::sql_types::Text;
use diesel::QueryResult;

use crate::key::ClaimKey;

/// A Diesel backend the inbox can store claims in: PostgreSQL (`postgres`
/// feature), SQLite (`sqlite`) or MySQL/MariaDB (`mysql`).
///
/// The claim is one statement that inserts the `(handler, message_id)` row
/// and reports, by its affected-row count, whether the row is new. It never
/// checks before inserting and never relies on catching a unique violation
/// (which would abort a PostgreSQL transaction):
///
/// | backend | claim statement |
/// |---|---|
/// | PostgreSQL, SQLite | `INSERT … ON CONFLICT (handler, message_id) DO NOTHING` |
/// | MySQL, MariaDB | `INSERT IGNORE …` (ids are validated first, since `IGNORE` would also silence truncation) |
///
/// A concurrent delivery of the same id blocks on the first one's row lock
/// until that transaction commits (then it is a duplicate) or rolls back
/// (then it claims the id itself).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use inbox_runtime::InboxBackend;
/// assert!(<diesel::sqlite::Sqlite as InboxBackend>::CREATE_SCHEMA_SQL.contains("inbox_messages"));
/// # }
/// ```
#[diagnostic::on_unimplemented(
    message = "the inbox does not support the `{Self}` database backend",
    label = "no inbox schema or claim statement for `{Self}`",
    note = "the inbox supports PostgreSQL, SQLite and MySQL/MariaDB: enable the `postgres`, `sqlite` or `mysql` feature of `inbox-runtime`, and make a generic connection's `Backend` one of them"
)]
pub trait InboxBackend: Backend + sealed::Sealed {
    /// SQL that creates the inbox table and its index; safe to run again.
    const CREATE_SCHEMA_SQL: &'static str;
    /// SQL that drops the inbox table.
    const DROP_SCHEMA_SQL: &'static str;

    /// Writes the claim statement for `key` (used by [`crate::ClaimStatement`]).
    #[doc(hidden)]
    fn walk_claim<'b>(key: &'b ClaimKey, out: AstPass<'_, 'b, Self>) -> QueryResult<()>;

    /// Writes one pruning batch (used by [`crate::prune::PruneBatchStatement`]).
    #[doc(hidden)]
    fn walk_prune_batch<'b>(
        batch: &'b crate::prune::PruneBatchStatement<'_>,
        out: AstPass<'_, 'b, Self>,
    ) -> QueryResult<()>;

    /// SQL run right before a pruning batch's transaction begins (`""`: none).
    #[doc(hidden)]
    const PRUNE_BEFORE_BEGIN_SQL: &'static str;

    /// SQL run first inside a pruning batch's transaction (`""`: none).
    #[doc(hidden)]
    const PRUNE_AFTER_BEGIN_SQL: &'static str;
}

mod sealed {
    pub trait Sealed {}
}

/// Pushes `(handler, message_id)` as two bound text parameters.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn push_key<'b, DB>(key: &'b ClaimKey, out: &mut AstPass<'_, 'b, DB>) -> QueryResult<()>
where
    DB: Backend + diesel::sql_types::HasSqlType<Text>,
    str: diesel::serialize::ToSql<Text, DB>,
{
    out.push_sql("(");
    out.push_bind_param::<Text, str>(key.handler().as_str())?;
    out.push_sql(", ");
    out.push_bind_param::<Text, str>(key.message_id())?;
    out.push_sql(")");
    Ok(())
}

/// The claim for backends with `ON CONFLICT` (PostgreSQL, SQLite). Naming the
/// conflict target keeps every other constraint violation an error.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn walk_insert_on_conflict_do_nothing<'b, DB>(
    key: &'b ClaimKey,
    mut out: AstPass<'_, 'b, DB>,
) -> QueryResult<()>
where
    DB: Backend + diesel::sql_types::HasSqlType<Text>,
    str: diesel::serialize::ToSql<Text, DB>,
{
    out.push_sql("INSERT INTO inbox_messages (handler, message_id) VALUES ");
    push_key(key, &mut out)?;
    out.push_sql(" ON CONFLICT (handler, message_id) DO NOTHING");
    Ok(())
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
macro_rules! schema_sql {
    ($backend:literal, $file:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/migrations/",
            $backend,
            "/2026-12-01-000000_create_inbox_messages/",
            $file
        ))
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use diesel::pg::Pg;

    impl sealed::Sealed for Pg {}

    impl InboxBackend for Pg {
        const CREATE_SCHEMA_SQL: &'static str = schema_sql!("postgres", "up.sql");
        const DROP_SCHEMA_SQL: &'static str = schema_sql!("postgres", "down.sql");
        const PRUNE_BEFORE_BEGIN_SQL: &'static str = "";
        const PRUNE_AFTER_BEGIN_SQL: &'static str = crate::prune::statement::POSTGRES_AFTER_BEGIN;

        fn walk_claim<'b>(key: &'b ClaimKey, out: AstPass<'_, 'b, Self>) -> QueryResult<()> {
            walk_insert_on_conflict_do_nothing(key, out)
        }

        fn walk_prune_batch<'b>(
            batch: &'b crate::prune::PruneBatchStatement<'_>,
            out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            crate::prune::statement::walk_postgres(batch, out)
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use diesel::sqlite::Sqlite;

    impl sealed::Sealed for Sqlite {}

    impl InboxBackend for Sqlite {
        const CREATE_SCHEMA_SQL: &'static str = schema_sql!("sqlite", "up.sql");
        const DROP_SCHEMA_SQL: &'static str = schema_sql!("sqlite", "down.sql");
        const PRUNE_BEFORE_BEGIN_SQL: &'static str = "";
        const PRUNE_AFTER_BEGIN_SQL: &'static str = "";

        fn walk_claim<'b>(key: &'b ClaimKey, out: AstPass<'_, 'b, Self>) -> QueryResult<()> {
            walk_insert_on_conflict_do_nothing(key, out)
        }

        fn walk_prune_batch<'b>(
            batch: &'b crate::prune::PruneBatchStatement<'_>,
            out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            crate::prune::statement::walk_sqlite(batch, out)
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use diesel::mysql::Mysql;

    impl sealed::Sealed for Mysql {}

    impl InboxBackend for Mysql {
        const CREATE_SCHEMA_SQL: &'static str = schema_sql!("mysql", "up.sql");
        const DROP_SCHEMA_SQL: &'static str = schema_sql!("mysql", "down.sql");
        const PRUNE_BEFORE_BEGIN_SQL: &'static str = crate::prune::statement::MYSQL_BEFORE_BEGIN;
        const PRUNE_AFTER_BEGIN_SQL: &'static str = "";

        fn walk_claim<'b>(key: &'b ClaimKey, mut out: AstPass<'_, 'b, Self>) -> QueryResult<()> {
            // `ON DUPLICATE KEY UPDATE` cannot be used: Diesel connects with
            // CLIENT_FOUND_ROWS, so a duplicate would also report one row.
            out.push_sql("INSERT IGNORE INTO inbox_messages (handler, message_id) VALUES ");
            push_key(key, &mut out)
        }

        fn walk_prune_batch<'b>(
            batch: &'b crate::prune::PruneBatchStatement<'_>,
            out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            crate::prune::statement::walk_mysql(batch, out)
        }
    }
}
