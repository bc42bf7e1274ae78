//! The only per-backend text of the suite: DDL of the effects table, how to
//! read `received_at`'s age by the database clock, and the race's size.

#[cfg(feature = "postgres")]
pub mod postgres {
    pub use inbox_runtime::schema::postgres::inbox_messages;

    pub const EFFECTS_DDL: &str = "CREATE TABLE effects (
        handler    TEXT    NOT NULL,
        message_id TEXT    NOT NULL,
        worker     INTEGER NOT NULL,
        note       TEXT    NOT NULL
    )";
    pub const RECEIVED_AGE_MICROS_SQL: &str =
        "(EXTRACT(EPOCH FROM (clock_timestamp() - received_at)) * 1000000)::BIGINT";
    pub const RACE_THREADS: usize = 16;
    pub const RACE_IDS: usize = 500;
    /// Claim waiters never deadlock here.
    pub const ROLLBACK_STORMS_MAY_OUTLAST_CLAIM_RETRIES: bool = false;
    /// A failed statement aborts the whole transaction until it rolls back.
    pub const FAILED_STATEMENT_ABORTS_TRANSACTION: bool = true;
    /// This connection's id on the server, as a `BIGINT` expression.
    pub const CONNECTION_ID_SQL: &str = "pg_backend_pid()::bigint";
    /// Ends the server connection `id` (and waits up to 5 s until it is gone).
    pub fn kill_sql(id: i64) -> String {
        format!("SELECT pg_terminate_backend({id}, 5000)")
    }
}

#[cfg(feature = "mysql")]
pub mod mysql {
    pub use inbox_runtime::schema::mysql::inbox_messages;

    /// Bytes, like the inbox's own columns, so that comparisons are exact
    /// whatever the server's default collation.
    pub const EFFECTS_DDL: &str = "CREATE TABLE effects (
        handler    VARBINARY(255) NOT NULL,
        message_id VARBINARY(255) NOT NULL,
        worker     INTEGER        NOT NULL,
        note       VARBINARY(255) NOT NULL
    ) ENGINE = InnoDB";
    pub const RECEIVED_AGE_MICROS_SQL: &str =
        "TIMESTAMPDIFF(MICROSECOND, received_at, UTC_TIMESTAMP(6))";
    pub const RACE_THREADS: usize = 16;
    pub const RACE_IDS: usize = 500;
    /// InnoDB: when a claim rolls back while several deliveries of its id
    /// wait, the waiters deadlock on the key's gap lock and the runtime
    /// retries the victims' claims (`CLAIM_ATTEMPTS`). In a storm where
    /// successive holders keep rolling back, the retries can run out, and
    /// the delivery fails with a retryable `SerializationFailure`.
    pub const ROLLBACK_STORMS_MAY_OUTLAST_CLAIM_RETRIES: bool = true;
    /// A failed statement is undone on its own; the transaction goes on.
    pub const FAILED_STATEMENT_ABORTS_TRANSACTION: bool = false;
    /// This connection's id on the server, as a `BIGINT` expression.
    pub const CONNECTION_ID_SQL: &str = "CAST(CONNECTION_ID() AS SIGNED)";
    /// Ends the server connection `id`.
    pub fn kill_sql(id: i64) -> String {
        format!("KILL {id}")
    }
}

#[cfg(feature = "sqlite")]
pub mod sqlite {
    pub use inbox_runtime::schema::sqlite::inbox_messages;

    pub const EFFECTS_DDL: &str = "CREATE TABLE effects (
        handler    TEXT    NOT NULL,
        message_id TEXT    NOT NULL,
        worker     INTEGER NOT NULL,
        note       TEXT    NOT NULL
    )";
    pub const RECEIVED_AGE_MICROS_SQL: &str =
        "CAST(ROUND((julianday('now') - julianday(received_at)) * 86400000000.0) AS INTEGER)";
    /// One writer at a time: every delivery, duplicates included, takes the
    /// write lock for its claim, so more threads only add busy-waiting.
    pub const RACE_THREADS: usize = 8;
    pub const RACE_IDS: usize = 500;
    /// Claim waiters never deadlock here.
    pub const ROLLBACK_STORMS_MAY_OUTLAST_CLAIM_RETRIES: bool = false;
    /// A failed statement is undone on its own; the transaction goes on.
    pub const FAILED_STATEMENT_ABORTS_TRANSACTION: bool = false;
}
