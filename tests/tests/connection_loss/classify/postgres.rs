//! PostgreSQL: each server error that decides between retry, reconnect and
//! never, produced for real, blocking (`PgConnection`, which hides the
//! SQLSTATE: the inbox reads the message) and async (`AsyncPgConnection`).
//! Each test prints what the driver said and what `recovery()` answered.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::result::Error;
use inbox_runtime::Recovery;

use inbox_tests::{Postgres, TestBackend, connection_id};

use super::{msg, read_only_refused, touch, victim, wait_until, with_locks};
use crate::support::Findings;

/// The setup: a row to fight over.
const LOCKS_DDL: &str = "CREATE TABLE cls (k INT PRIMARY KEY, v INT NOT NULL);
                         INSERT INTO cls VALUES (1, 0), (2, 0);";

fn statement(conn: &mut PgConnection, sql: &str) -> Result<(), Error> {
    diesel::sql_query(sql).execute(conn).map(drop)
}

/// Whether backend `pid` waits for a lock (a scalar subquery).
fn waiting_sql(pid: i64) -> String {
    format!(
        "(SELECT count(*) FROM pg_stat_activity WHERE pid = {pid} AND wait_event_type = 'Lock')"
    )
}

/// Blocks until backend `pid` waits for a lock (bounded).
fn wait_for_lock(observer: &mut PgConnection, pid: i64) {
    wait_until::<Postgres>(
        observer,
        &waiting_sql(pid),
        &format!("backend {pid} never waited for the lock"),
    );
}

#[test]
fn blocking_postgres_errors_classify_by_server_code() {
    let Some((db, mut a, mut b)) = with_locks::<Postgres>(LOCKS_DDL) else {
        return;
    };
    let mut seen = Findings::default();

    // 40001: REPEATABLE READ, a row updated by another transaction since
    // the snapshot. Diesel maps it (SerializationFailure).
    let error = a
        .build_transaction()
        .repeatable_read()
        .run(|a| {
            statement(a, "SELECT v FROM cls WHERE k = 1")?;
            statement(&mut b, "UPDATE cls SET v = v + 1 WHERE k = 1").expect("b updates");
            statement(a, "UPDATE cls SET v = v + 1 WHERE k = 1")
        })
        .expect_err("a serialization failure");
    seen.diesel("40001 serialization_failure", &error, Recovery::Retry);

    // 55P03: lock_timeout, and NOWAIT.
    a.batch_execute("BEGIN; UPDATE cls SET v = v + 1 WHERE k = 1")
        .unwrap();
    b.batch_execute("SET lock_timeout = '50ms'").unwrap();
    let error =
        statement(&mut b, "UPDATE cls SET v = v + 1 WHERE k = 1").expect_err("lock timeout");
    seen.diesel(
        "55P03 lock_not_available (lock_timeout)",
        &error,
        Recovery::Retry,
    );
    let error =
        statement(&mut b, "SELECT v FROM cls WHERE k = 1 FOR UPDATE NOWAIT").expect_err("NOWAIT");
    seen.diesel("55P03 lock_not_available (NOWAIT)", &error, Recovery::Retry);
    a.batch_execute("ROLLBACK").unwrap();
    b.batch_execute("RESET lock_timeout").unwrap();

    // 40P01: a waits for b's row while b waits for a's; b's shorter
    // deadlock_timeout makes b the one that detects it (either result is
    // checked).
    a.batch_execute("BEGIN; UPDATE cls SET v = v + 1 WHERE k = 1")
        .unwrap();
    b.batch_execute("SET deadlock_timeout = '100ms'; BEGIN; UPDATE cls SET v = v + 1 WHERE k = 2")
        .unwrap();
    let a_pid = connection_id::<Postgres>(&mut a);
    let waiter = std::thread::spawn(move || {
        let result = statement(&mut a, "UPDATE cls SET v = v + 1 WHERE k = 2");
        let _ = a.batch_execute("ROLLBACK");
        result
    });
    wait_for_lock(&mut db.connect(), a_pid);
    let b_result = statement(&mut b, "UPDATE cls SET v = v + 1 WHERE k = 1");
    let _ = b.batch_execute("ROLLBACK");
    let a_result = waiter.join().expect("no panic");
    let error = victim(a_result, b_result);
    seen.diesel("40P01 deadlock_detected", &error, Recovery::Retry);

    // 25006: a session whose transactions are read-only, as on a standby.
    read_only_refused(
        &db,
        "SET default_transaction_read_only = on",
        "25006 read_only_sql_transaction (handler)",
        &mut seen,
    );

    // 57P01: the backend terminated; the first statement after it, then
    // the closed connection, then a delivery on it.
    let mut victim = db.connect();
    let victim_pid = connection_id::<Postgres>(&mut victim);
    statement(
        &mut b,
        &format!("SELECT pg_terminate_backend({victim_pid}, 5000)"),
    )
    .unwrap();
    let error = statement(&mut victim, "SELECT 1").expect_err("terminated");
    seen.diesel(
        "57P01 admin_shutdown (first statement)",
        &error,
        Recovery::Reconnect,
    );
    let error = statement(&mut victim, "SELECT 1").expect_err("closed");
    seen.diesel(
        "closed connection (next statement)",
        &error,
        Recovery::Reconnect,
    );
    let error = touch(&mut victim, &msg("closed-1")).expect_err("closed");
    seen.handler("closed connection (handler)", &error, Recovery::Reconnect);

    // Never: an id the inbox cannot store.
    let error = touch(&mut b, &msg("")).expect_err("an empty id");
    seen.handler("invalid message id (handler)", &error, Recovery::Never);

    seen.check("postgres blocking");
}

#[cfg(feature = "async")]
mod asynchronous {
    use diesel::result::Error;
    use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
    use inbox_runtime::Recovery;

    use super::super::{
        read_only_refused_async, touch_async, victim, wait_until_async, with_locks_async,
    };
    use super::{LOCKS_DDL, msg, waiting_sql};
    use inbox_tests::{Postgres, TestBackend, connection_id_async};

    use crate::support::Findings;

    async fn statement(conn: &mut AsyncPgConnection, sql: &str) -> Result<(), Error> {
        diesel::sql_query(sql).execute(conn).await.map(drop)
    }

    async fn wait_for_lock(observer: &mut AsyncPgConnection, pid: i64) {
        wait_until_async::<Postgres>(
            observer,
            &waiting_sql(pid),
            &format!("backend {pid} never waited for the lock"),
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_postgres_errors_classify_by_server_code() {
        let Some((db, mut a, mut b)) = with_locks_async::<Postgres>(LOCKS_DDL).await else {
            return;
        };
        let mut seen = Findings::default();

        // 40001.
        a.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT v FROM cls WHERE k = 1")
            .await
            .unwrap();
        statement(&mut b, "UPDATE cls SET v = v + 1 WHERE k = 1")
            .await
            .unwrap();
        let error = statement(&mut a, "UPDATE cls SET v = v + 1 WHERE k = 1")
            .await
            .expect_err("a serialization failure");
        a.batch_execute("ROLLBACK").await.unwrap();
        seen.diesel("40001 serialization_failure", &error, Recovery::Retry);

        // 55P03.
        a.batch_execute("BEGIN; UPDATE cls SET v = v + 1 WHERE k = 1")
            .await
            .unwrap();
        b.batch_execute("SET lock_timeout = '50ms'").await.unwrap();
        let error = statement(&mut b, "UPDATE cls SET v = v + 1 WHERE k = 1")
            .await
            .expect_err("lock timeout");
        seen.diesel(
            "55P03 lock_not_available (lock_timeout)",
            &error,
            Recovery::Retry,
        );
        let error = statement(&mut b, "SELECT v FROM cls WHERE k = 1 FOR UPDATE NOWAIT")
            .await
            .expect_err("NOWAIT");
        seen.diesel("55P03 lock_not_available (NOWAIT)", &error, Recovery::Retry);
        a.batch_execute("ROLLBACK").await.unwrap();
        b.batch_execute("RESET lock_timeout").await.unwrap();

        // 40P01.
        a.batch_execute("BEGIN; UPDATE cls SET v = v + 1 WHERE k = 1")
            .await
            .unwrap();
        b.batch_execute(
            "SET deadlock_timeout = '100ms'; BEGIN; UPDATE cls SET v = v + 1 WHERE k = 2",
        )
        .await
        .unwrap();
        let a_pid = connection_id_async::<Postgres>(&mut a).await;
        let waiter = tokio::spawn(async move {
            let result = statement(&mut a, "UPDATE cls SET v = v + 1 WHERE k = 2").await;
            let _ = a.batch_execute("ROLLBACK").await;
            result
        });
        wait_for_lock(&mut db.connect_async().await, a_pid).await;
        let b_result = statement(&mut b, "UPDATE cls SET v = v + 1 WHERE k = 1").await;
        let _ = b.batch_execute("ROLLBACK").await;
        let a_result = waiter.await.expect("no panic");
        let error = victim(a_result, b_result);
        seen.diesel("40P01 deadlock_detected", &error, Recovery::Retry);

        // 25006.
        read_only_refused_async(
            &db,
            "SET default_transaction_read_only = on",
            "25006 read_only_sql_transaction (handler)",
            &mut seen,
        )
        .await;

        // 57P01, then the closed connection.
        let mut victim = db.connect_async().await;
        let victim_pid = connection_id_async::<Postgres>(&mut victim).await;
        statement(
            &mut b,
            &format!("SELECT pg_terminate_backend({victim_pid}, 5000)"),
        )
        .await
        .unwrap();
        let error = statement(&mut victim, "SELECT 1")
            .await
            .expect_err("terminated");
        seen.diesel(
            "57P01 admin_shutdown (first statement)",
            &error,
            Recovery::Reconnect,
        );
        let error = statement(&mut victim, "SELECT 1")
            .await
            .expect_err("closed");
        seen.diesel(
            "closed connection (next statement)",
            &error,
            Recovery::Reconnect,
        );
        let error = touch_async(&mut victim, &msg("closed-1"))
            .await
            .expect_err("closed");
        seen.handler("closed connection (handler)", &error, Recovery::Reconnect);

        // Never.
        let error = touch_async(&mut b, &msg(""))
            .await
            .expect_err("an empty id");
        seen.handler("invalid message id (handler)", &error, Recovery::Never);

        seen.check("postgres async");
    }
}
