//! Async handlers on diesel-async, against real PostgreSQL and MariaDB: the
//! blocking suite's behaviours, pooled connections (deadpool, bb8), a race of
//! tasks on a multi-threaded runtime, and cancellation at every await point.
#![cfg(feature = "async")]

#[macro_use]
#[path = "async_handlers/support.rs"]
mod support;
#[macro_use]
#[path = "async_handlers/failure.rs"]
mod failure;

#[cfg(feature = "postgres")]
mod postgres {
    use diesel_async::AsyncPgConnection;
    use inbox_tests::Postgres;

    /// A failed statement aborts the whole transaction until it rolls back.
    const FAILED_STATEMENT_ABORTS_TRANSACTION: bool = true;
    const CONNECTION_ID_SQL: &str = "pg_backend_pid()::bigint";
    /// How many of the connections `ids` wait for a lock.
    fn lock_waiters_sql(ids: &[i64]) -> String {
        let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
        format!(
            "(SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid IN ({}))",
            ids.join(", ")
        )
    }

    /// Ends the server connection `id` (waiting up to 5 s until it is gone).
    fn kill_sql(id: i64) -> String {
        format!("SELECT pg_terminate_backend({id}, 5000)")
    }

    async_suite!(AsyncPgConnection, Postgres, postgres);
    async_failure_tests!();
    async_fault_tests!();
}

#[cfg(feature = "mysql")]
mod mysql {
    use diesel_async::AsyncMysqlConnection;
    use inbox_tests::Mysql;

    /// A failed statement is undone on its own; the transaction goes on.
    const FAILED_STATEMENT_ABORTS_TRANSACTION: bool = false;
    const CONNECTION_ID_SQL: &str = "CAST(CONNECTION_ID() AS SIGNED)";
    /// How many of the connections `ids` are inside their claim statement
    /// (blocked on the holder's lock: it cannot finish before the holder).
    /// InnoDB's own view (`INNODB_TRX`) lists only the first of several
    /// waiters on one key as `LOCK WAIT`.
    fn lock_waiters_sql(ids: &[i64]) -> String {
        let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
        format!(
            "(SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE id IN ({}) AND info LIKE 'INSERT IGNORE INTO inbox_messages%')",
            ids.join(", ")
        )
    }

    /// Ends the server connection `id`.
    fn kill_sql(id: i64) -> String {
        format!("KILL {id}")
    }
    /// Whether connection `id` is inside its `UPDATE locks …` (0 or 1):
    /// behind the caller's row lock, which it cannot pass before the caller
    /// ends. (InnoDB's `INNODB_TRX` does not list every waiting
    /// transaction of a diesel-async connection as `LOCK WAIT`.)
    fn row_lock_waiters_sql(id: i64) -> String {
        format!(
            "(SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE id = {id} AND info LIKE 'UPDATE locks%')"
        )
    }

    async_suite!(AsyncMysqlConnection, Mysql, mysql);
    async_failure_tests!();
    async_fault_tests!();
    async_deadlock_tests!();
}
