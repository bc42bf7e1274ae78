//! Failure paths that need a server: the handler's connection killed under
//! it (PostgreSQL and MariaDB/MySQL), and, on MariaDB/MySQL, a deadlock that
//! makes the server roll back the caller's whole transaction.

use std::cell::RefCell;

use diesel::prelude::*;
use inbox_runtime::{Outcome, idempotent};
use inbox_tests::{ServerBackend, connection_id, statement};

use crate::handlers::*;
use crate::support::*;

/// A delivery whose body has its own connection killed by `killer`
/// (running `kill_sql`), then panics: the rollback after the panic fails
/// too.
pub struct Doomed<C> {
    pub id: String,
    pub kill_sql: String,
    pub killer: RefCell<C>,
}

#[idempotent(id = msg.id, handler = "e2e.killed_then_panics")]
fn killed_then_panics<C: Effects>(conn: &mut C, msg: &Doomed<C>) -> Result<(), AppError> {
    conn.record_effect("e2e.killed_then_panics", &msg.id, 0, "before the kill")?;
    statement(msg.kill_sql.as_str()).execute(&mut *msg.killer.borrow_mut())?;
    std::panic::panic_any(DeliberatePanic("after the connection was killed"))
}

pub fn a_panic_is_resumed_even_when_the_rollback_fails<B: E2e + ServerBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let doomed = Doomed {
        id: "kp-1".to_owned(),
        kill_sql: B::kill_sql(connection_id::<B>(&mut conn)),
        killer: RefCell::new(db.connect()),
    };
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        killed_then_panics(&mut conn, &doomed)
    }));
    match caught {
        Err(payload) => assert!(payload.downcast_ref::<DeliberatePanic>().is_some()),
        Ok(returned) => panic!("the panic became a return value: {returned:?}"),
    }
    // The connection refuses further transactions rather than
    // running anything outside one.
    let next = Msg::new("kp-2");
    let refused = apply(&mut conn, &next).expect_err("the connection is broken");
    assert_eq!(next.runs.get(), 0, "the body did not run");
    assert!(
        matches!(
            refused,
            AppError::Db(diesel::result::Error::BrokenTransactionManager)
        ),
        "{refused:?}"
    );
    drop(conn);
    let mut other = db.connect();
    assert_eq!(other.inbox_rows(), NO_ROWS);
    assert_eq!(other.all_effects(), NO_EFFECTS);
}

pub fn a_connection_killed_before_commit_commits_nothing_and_says_reconnect<
    B: E2e + ServerBackend,
>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let victim = connection_id::<B>(&mut conn);
    let mut killer = db.connect();
    let msg = Msg::new("kc-1");
    let result = conn.transaction(|conn| {
        let outcome = valued(conn, &msg);
        // Killed between the handler's savepoint release and the
        // caller's COMMIT.
        statement(B::kill_sql(victim)).execute(&mut killer)?;
        outcome
    });
    let error = result.expect_err("the COMMIT cannot reach the server");
    assert_eq!(
        error.recovery(),
        inbox_runtime::Recovery::Reconnect,
        "{error:?}"
    );
    drop(conn);
    let mut other = db.connect();
    assert_eq!(other.inbox_rows(), NO_ROWS);
    assert_eq!(other.all_effects(), NO_EFFECTS);
    let redelivery = Msg::new("kc-1");
    assert_eq!(
        valued(&mut other, &redelivery).expect("redelivery"),
        Outcome::Processed(4)
    );
}

inbox_tests::backend_tests!(only [postgres, mysql]:
    a_panic_is_resumed_even_when_the_rollback_fails,
    a_connection_killed_before_commit_commits_nothing_and_says_reconnect,
);

/// MariaDB/MySQL: a deadlock rolls back the whole transaction, the caller's
/// outer one included, while Diesel still counts it open.
#[cfg(feature = "mysql")]
pub mod mysql_deadlock {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use diesel::connection::SimpleConnection;
    use diesel::prelude::*;
    use inbox_runtime::{InboxError, idempotent};
    use inbox_tests::{Mysql, TestBackend};

    use crate::handlers::*;
    use crate::support::*;
    use inbox_tests::connection_id;

    type Conn = <Mysql as TestBackend>::Connection;

    /// Waits for `UPDATE locks … WHERE k = 2`, which the other transaction
    /// holds while it waits for the caller: a deadlock.
    #[idempotent(id = msg.id, handler = "e2e.deadlock")]
    fn takes_the_other_row(conn: &mut Conn, msg: &Msg) -> Result<(), AppError> {
        msg.ran();
        conn.record_effect("e2e.deadlock", &msg.id, 0, "before the deadlock")?;
        diesel::sql_query("UPDATE locks SET v = v + 1 WHERE k = 2").execute(conn)?;
        Ok(())
    }

    /// Blocks until connection `id` is inside its `UPDATE locks …` (at most
    /// 30 s): behind the caller's row lock, which it cannot pass before the
    /// caller ends. (InnoDB's `INNODB_TRX` does not reliably list every
    /// waiting transaction as `LOCK WAIT`.)
    fn wait_for_lock_wait(observer: &mut Conn, id: i64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let waiting: i64 =
                diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!(
                    "(SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                     WHERE id = {id} AND info LIKE 'UPDATE locks%')"
                )))
                .get_result(observer)
                .expect("read the server's process list");
            if waiting > 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "connection {id} never waited for the lock"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_deadlock_in_a_nested_handler_breaks_the_connection_instead_of_autocommitting() {
        let Some((db, mut conn)) = fresh::<Mysql>() else {
            return;
        };
        conn.batch_execute(
            "CREATE TABLE locks (k INT PRIMARY KEY, v INT NOT NULL) ENGINE = InnoDB;
             INSERT INTO locks VALUES (1, 0), (2, 0);
             CREATE TABLE ballast (n INT NOT NULL) ENGINE = InnoDB;",
        )
        .expect("create the lock table");
        let mut observer = db.connect();
        let deadlocked = Msg::new("dl-1");
        let next = Msg::with_mode("dl-2", Mode::Fail);
        let url = db.url().to_owned();

        let outer: Result<(), AppError> = conn.transaction(|conn| {
            diesel::sql_query("UPDATE locks SET v = v + 1 WHERE k = 1").execute(conn)?;
            let (ready, holding) = mpsc::channel();
            // The other transaction: holds row 2, is heavier (so InnoDB picks
            // the caller as the victim), then waits for row 1.
            let other = std::thread::spawn(move || {
                let mut other = diesel::MysqlConnection::establish(&url).expect("connect");
                let id = connection_id::<Mysql>(&mut other);
                other.transaction(|other| {
                    diesel::sql_query("UPDATE locks SET v = v + 1 WHERE k = 2").execute(other)?;
                    diesel::sql_query(
                        "INSERT INTO ballast WITH RECURSIVE s (n) AS \
                         (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 200) SELECT n FROM s",
                    )
                    .execute(other)?;
                    ready.send(id).expect("the test listens");
                    diesel::sql_query("UPDATE locks SET v = v + 1 WHERE k = 1").execute(other)?;
                    diesel::QueryResult::Ok(())
                })
            });
            let other_id = holding.recv().expect("the other transaction holds row 2");
            wait_for_lock_wait(&mut observer, other_id);

            let error = takes_the_other_row(conn, &deadlocked).expect_err("a deadlock victim");
            assert!(
                matches!(
                    error.inbox(),
                    Some(InboxError::TransactionLost { nested: true, .. })
                ),
                "the handler says the caller's transaction is gone: {error:?}"
            );
            assert_eq!(
                error.inbox().map(InboxError::recovery),
                Some(inbox_runtime::Recovery::Reconnect)
            );
            other
                .join()
                .expect("no panic")
                .expect("the other transaction commits");

            // A caller that ignores the error and goes on: nothing may run
            // in autocommit.
            let refused = apply(conn, &next).expect_err("the connection refuses");
            assert!(
                matches!(
                    refused,
                    AppError::Db(diesel::result::Error::BrokenTransactionManager)
                ),
                "{refused:?}"
            );
            Ok(())
        });
        assert!(outer.is_err(), "the caller's commit is refused: {outer:?}");
        assert_eq!(deadlocked.runs.get(), 1);
        assert_eq!(next.runs.get(), 0, "no body ran outside a transaction");
        drop(conn);

        let mut other = db.connect();
        assert_eq!(other.inbox_rows(), NO_ROWS, "no claim committed");
        assert_eq!(other.all_effects(), NO_EFFECTS, "no effect committed");
        let row_one: i32 = diesel::select(diesel::dsl::sql::<diesel::sql_types::Integer>(
            "(SELECT v FROM locks WHERE k = 1)",
        ))
        .get_result(&mut other)
        .expect("read row 1");
        assert_eq!(
            row_one, 1,
            "only the other transaction's update of row 1 committed"
        );

        // Redelivered on a new connection, both messages are processed.
        let redelivery = Msg::new("dl-2");
        apply(&mut other, &redelivery).expect("redelivery");
        assert_eq!(other.inbox_count(APPLY, "dl-2"), 1);
    }
}
