//! MariaDB/MySQL: each server error that decides between retry, reconnect
//! and never, produced for real, blocking (`MysqlConnection`: prepared
//! statements map a few error numbers, plain statements none) and async
//! (`AsyncMysqlConnection`: mysql_async's server errors reach Diesel as
//! `Unknown` with the message). Each test prints what the driver said and
//! what `recovery()` answered.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::result::Error;
use inbox_runtime::Recovery;

use inbox_tests::{Mysql, TestBackend, connection_id, terminate};

use super::{msg, read_only_refused, touch, victim, wait_until, with_locks};
use crate::support::Findings;

/// Rows to fight over.
const LOCKS_DDL: &str = "CREATE TABLE cls (k INT PRIMARY KEY, v INT NOT NULL) ENGINE = InnoDB;
                         INSERT INTO cls VALUES (1, 0), (2, 0);";

/// Whether connection `id` is running a statement that starts with `prefix`.
fn running_sql(id: i64, prefix: &str) -> String {
    format!(
        "(SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE id = {id} AND info LIKE '{prefix}%')"
    )
}

/// A prepared statement (the path Diesel maps error numbers on).
fn prepared(conn: &mut MysqlConnection, sql: &str) -> Result<(), Error> {
    diesel::sql_query(sql).execute(conn).map(drop)
}

/// Blocks until connection `id` runs a statement starting with `prefix`.
fn wait_until_running(observer: &mut MysqlConnection, id: i64, prefix: &str) {
    wait_until::<Mysql>(
        observer,
        &running_sql(id, prefix),
        &format!("connection {id} never ran {prefix}"),
    );
}

/// A deadlock between `a` and `b`, each statement run by `run`; the
/// victim's error.
fn deadlock(db: &Mysql, run: fn(&mut MysqlConnection, &str) -> Result<(), Error>) -> Error {
    let (mut a, mut b) = (db.connect(), db.connect());
    let a_id = connection_id::<Mysql>(&mut a);
    a.batch_execute("BEGIN").unwrap();
    run(&mut a, "UPDATE cls SET v = v + 1 WHERE k = 1").unwrap();
    b.batch_execute("BEGIN").unwrap();
    run(&mut b, "UPDATE cls SET v = v + 1 WHERE k = 2").unwrap();
    let waiter = std::thread::spawn(move || {
        let result = run(&mut a, "UPDATE cls SET v = v + 1 WHERE k = 2");
        let _ = a.batch_execute("ROLLBACK");
        result
    });
    wait_until_running(
        &mut db.connect(),
        a_id,
        "UPDATE cls SET v = v + 1 WHERE k = 2",
    );
    let b_result = run(&mut b, "UPDATE cls SET v = v + 1 WHERE k = 1");
    let _ = b.batch_execute("ROLLBACK");
    let a_result = waiter.join().expect("no panic");
    victim(a_result, b_result)
}

#[test]
fn blocking_mysql_errors_classify_by_server_code() {
    let Some((db, mut a, mut b)) = with_locks::<Mysql>(LOCKS_DDL) else {
        return;
    };
    let mut seen = Findings::default();

    // 1213, from a prepared statement (Diesel maps it) and from a plain
    // one (Diesel does not: message only).
    let error = deadlock(&db, prepared);
    seen.diesel("1213 ER_LOCK_DEADLOCK (prepared)", &error, Recovery::Retry);
    let error = deadlock(&db, |conn, sql| conn.batch_execute(sql));
    seen.diesel(
        "1213 ER_LOCK_DEADLOCK (plain statement)",
        &error,
        Recovery::Retry,
    );

    // 1205, with the smallest lock wait timeout (1 s) in b's session.
    a.batch_execute("BEGIN; UPDATE cls SET v = v + 1 WHERE k = 1")
        .unwrap();
    b.batch_execute("SET SESSION innodb_lock_wait_timeout = 1")
        .unwrap();
    let error =
        prepared(&mut b, "UPDATE cls SET v = v + 1 WHERE k = 1").expect_err("a lock wait timeout");
    seen.diesel("1205 ER_LOCK_WAIT_TIMEOUT", &error, Recovery::Retry);
    a.batch_execute("ROLLBACK").unwrap();

    // 1792: a session whose transactions are read-only.
    read_only_refused(
        &db,
        "SET SESSION TRANSACTION READ ONLY",
        "1792 ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION (handler)",
        &mut seen,
    );

    // KILL while the connection is idle: its next statements, then a
    // delivery on it.
    let mut victim = db.connect();
    let victim_id = connection_id::<Mysql>(&mut victim);
    terminate::<Mysql>(&mut b, victim_id);
    let error = prepared(&mut victim, "SELECT 1").expect_err("killed");
    seen.diesel("KILL (idle), first statement", &error, Recovery::Reconnect);
    let error = victim.batch_execute("SELECT 1").expect_err("killed");
    seen.diesel("KILL (idle), next statement", &error, Recovery::Reconnect);
    let error = touch(&mut victim, &msg("killed-1")).expect_err("killed");
    seen.handler("KILL (idle), handler", &error, Recovery::Reconnect);

    // KILL while the connection runs a statement.
    let mut victim = db.connect();
    let victim_id = connection_id::<Mysql>(&mut victim);
    let sleeper = std::thread::spawn(move || prepared(&mut victim, "SELECT SLEEP(20)"));
    wait_until_running(&mut b, victim_id, "SELECT SLEEP");
    terminate::<Mysql>(&mut b, victim_id);
    let error = sleeper.join().expect("no panic").expect_err("killed");
    seen.diesel("KILL (in a statement)", &error, Recovery::Reconnect);

    // Never: an id the inbox cannot store.
    let error = touch(&mut b, &msg("")).expect_err("an empty id");
    seen.handler("invalid message id (handler)", &error, Recovery::Never);

    seen.check("mysql blocking");
}

#[cfg(feature = "async")]
mod asynchronous {
    use diesel::result::Error;
    use diesel_async::{AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
    use inbox_runtime::Recovery;

    use super::super::{
        read_only_refused_async, touch_async, victim, wait_until_async, with_locks_async,
    };
    use super::{LOCKS_DDL, msg, running_sql};
    use inbox_tests::{Mysql, TestBackend, connection_id_async, terminate_async};

    use crate::support::Findings;

    type Conn = AsyncMysqlConnection;

    async fn statement(conn: &mut Conn, sql: &str) -> Result<(), Error> {
        diesel::sql_query(sql).execute(conn).await.map(drop)
    }

    async fn wait_until_running(observer: &mut Conn, id: i64, prefix: &str) {
        wait_until_async::<Mysql>(
            observer,
            &running_sql(id, prefix),
            &format!("connection {id} never ran {prefix}"),
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_mysql_errors_classify_by_server_code() {
        let Some((db, mut a, mut b)) = with_locks_async::<Mysql>(LOCKS_DDL).await else {
            return;
        };
        let mut seen = Findings::default();

        // 1213 (diesel-async does not map it: message only).
        let a_id = connection_id_async::<Mysql>(&mut a).await;
        a.batch_execute("BEGIN; UPDATE cls SET v = v + 1 WHERE k = 1")
            .await
            .unwrap();
        b.batch_execute("BEGIN; UPDATE cls SET v = v + 1 WHERE k = 2")
            .await
            .unwrap();
        let waiter = tokio::spawn(async move {
            let result = statement(&mut a, "UPDATE cls SET v = v + 1 WHERE k = 2").await;
            let _ = a.batch_execute("ROLLBACK").await;
            (a, result)
        });
        wait_until_running(
            &mut db.connect_async().await,
            a_id,
            "UPDATE cls SET v = v + 1 WHERE k = 2",
        )
        .await;
        let b_result = statement(&mut b, "UPDATE cls SET v = v + 1 WHERE k = 1").await;
        let _ = b.batch_execute("ROLLBACK").await;
        let (mut a, a_result) = waiter.await.expect("no panic");
        let error = victim(a_result, b_result);
        seen.diesel("1213 ER_LOCK_DEADLOCK", &error, Recovery::Retry);

        // 1205.
        a.batch_execute("BEGIN; UPDATE cls SET v = v + 1 WHERE k = 1")
            .await
            .unwrap();
        b.batch_execute("SET SESSION innodb_lock_wait_timeout = 1")
            .await
            .unwrap();
        let error = statement(&mut b, "UPDATE cls SET v = v + 1 WHERE k = 1")
            .await
            .expect_err("a lock wait timeout");
        seen.diesel("1205 ER_LOCK_WAIT_TIMEOUT", &error, Recovery::Retry);
        a.batch_execute("ROLLBACK").await.unwrap();

        // 1792.
        read_only_refused_async(
            &db,
            "SET SESSION TRANSACTION READ ONLY",
            "1792 ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION (handler)",
            &mut seen,
        )
        .await;

        // KILL while idle.
        let mut victim = db.connect_async().await;
        let victim_id = connection_id_async::<Mysql>(&mut victim).await;
        terminate_async::<Mysql>(&mut b, victim_id).await;
        let error = statement(&mut victim, "SELECT 1")
            .await
            .expect_err("killed");
        seen.diesel("KILL (idle), first statement", &error, Recovery::Reconnect);
        let error = statement(&mut victim, "SELECT 1")
            .await
            .expect_err("killed");
        seen.diesel("KILL (idle), next statement", &error, Recovery::Reconnect);
        let error = touch_async(&mut victim, &msg("killed-1"))
            .await
            .expect_err("killed");
        seen.handler("KILL (idle), handler", &error, Recovery::Reconnect);

        // KILL in a statement.
        let mut victim = db.connect_async().await;
        let victim_id = connection_id_async::<Mysql>(&mut victim).await;
        let sleeper = tokio::spawn(async move { statement(&mut victim, "SELECT SLEEP(20)").await });
        wait_until_running(&mut b, victim_id, "SELECT SLEEP").await;
        terminate_async::<Mysql>(&mut b, victim_id).await;
        let error = sleeper.await.expect("no panic").expect_err("killed");
        seen.diesel("KILL (in a statement)", &error, Recovery::Reconnect);

        // Never.
        let error = touch_async(&mut b, &msg(""))
            .await
            .expect_err("an empty id");
        seen.handler("invalid message id (handler)", &error, Recovery::Never);

        seen.check("mysql async");
    }
}
