//! Async handlers on diesel-async, against real PostgreSQL and MariaDB: the
//! blocking suite's behaviours, pooled connections (deadpool, bb8), a race of
//! tasks on a multi-threaded runtime, and cancellation at every await point.
#![cfg(feature = "async")]

#[macro_use]
#[path = "async_handlers/support.rs"]
mod support;

#[cfg(feature = "postgres")]
mod postgres {
    use diesel_async::AsyncPgConnection;
    use inbox_suite::testdb::PgDatabase;

    async_suite!(AsyncPgConnection, PgDatabase, postgres);
}

#[cfg(feature = "mysql")]
mod mysql {
    use diesel_async::AsyncMysqlConnection;
    use inbox_suite::testdb::MysqlDatabase;

    async_suite!(AsyncMysqlConnection, MysqlDatabase, mysql);
}
