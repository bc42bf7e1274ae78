//! What is not a failed attempt: database trouble in the body (a lock wait
//! that timed out, a serialization failure, a connection killed mid-body),
//! provoked for real, and failures of handlers nested in a transaction the
//! caller opened.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

use diesel::Connection;
use diesel::connection::SimpleConnection;
use diesel::result::{DatabaseErrorKind, Error};
use inbox_runtime::{AckDecision, InboxError, Recovery, ack_decision, is_lock_conflict, recovery};
use inbox_tests::{ServerBackend, SqlRows, TestBackend, connection_id, terminate};

use crate::handlers::*;
use crate::support::*;

const BUMP: &str = "UPDATE poison_locks SET n = n + 10 WHERE id = 1";

fn recovery_of(error: &AppError) -> Recovery {
    match error {
        AppError::Db(error) => recovery(error),
        AppError::Inbox(error) => error.recovery(),
        AppError::Failed(text) => panic!("the application's own error, not the database's: {text}"),
    }
}

/// A lock held by another transaction; the body waits for it until the
/// server gives up (PostgreSQL's `lock_timeout`, InnoDB's lock wait
/// timeout): four deliveries, more than the limit, none counted.
pub fn a_lock_timeout_in_the_body_is_not_counted<B: ServerBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let mut holder = db.connect();
    holder.batch_execute("BEGIN").unwrap();
    holder
        .batch_execute("UPDATE poison_locks SET n = n + 1 WHERE id = 1")
        .unwrap();
    conn.batch_execute(short_lock_wait_sql::<B>()).unwrap();
    for _ in 1..=4 {
        let msg = Scripted::new("lt-1", vec![Step::Sql(BUMP.to_owned())]);
        let result = scripted(&mut conn, &msg);
        match &result {
            Err(AppError::Db(error)) => assert!(is_lock_conflict(error), "{error:?}"),
            other => panic!("expected the lock wait to fail, got {other:?}"),
        }
        assert_eq!(ack_decision(&result), AckDecision::Retry);
        assert_eq!(msg.runs(), 1);
    }
    assert_eq!(
        failure_row::<B>(&mut observer, SCRIPTED, "lt-1"),
        None,
        "not counted"
    );
    assert_eq!(claims(&mut observer, SCRIPTED, "lt-1"), 0);
    assert_eq!(effects(&mut observer, "lt-1"), 0);

    holder.batch_execute("ROLLBACK").unwrap();
    let msg = Scripted::new("lt-1", vec![Step::Sql(BUMP.to_owned())]);
    scripted(&mut conn, &msg).expect("processed once the lock is free");
    assert_eq!(effects(&mut observer, "lt-1"), 1);
    assert_eq!(
        observer.bigint("SELECT COUNT(*) AS value FROM poison_locks WHERE n = 10"),
        1
    );
    assert_eq!(all_failure_rows(&mut observer), 0);
}

/// PostgreSQL, `REPEATABLE READ`: another transaction commits a change to
/// the row the body then updates, after the body's snapshot was taken
/// (40001 `could not serialize access`). Not counted.
pub fn a_serialization_failure_in_the_body_is_not_counted<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    conn.batch_execute(
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ",
    )
    .unwrap();
    let interferer = Mutex::new(db.connect());
    for _ in 1..=4 {
        let msg = Scripted::new(
            "sf-1",
            vec![
                Step::Call(Box::new(|| {
                    interferer
                        .lock()
                        .unwrap()
                        .batch_execute("UPDATE poison_locks SET n = n + 1 WHERE id = 1")
                        .expect("the interfering update commits");
                })),
                Step::Sql(BUMP.to_owned()),
            ],
        );
        let result = scripted(&mut conn, &msg);
        assert!(
            matches!(
                &result,
                Err(AppError::Db(Error::DatabaseError(
                    DatabaseErrorKind::SerializationFailure,
                    _
                )))
            ),
            "{result:?}"
        );
        assert_eq!(ack_decision(&result), AckDecision::Retry);
    }
    assert_eq!(failure_row::<B>(&mut observer, SCRIPTED, "sf-1"), None);
    assert_eq!(claims(&mut observer, SCRIPTED, "sf-1"), 0);
    assert_eq!(effects(&mut observer, "sf-1"), 0);
    assert_eq!(
        observer.bigint("SELECT COUNT(*) AS value FROM poison_locks WHERE n = 4"),
        1,
        "only the interfering updates committed"
    );
}

/// The handler's own connection is terminated mid-body (by the harness's
/// `terminate`, from another connection): the body's next statement fails,
/// or the body returns its own error and the rollback fails. Either way the
/// delivery says reconnect and retry, and nothing is counted, four times
/// over (more than the limit).
pub fn a_connection_killed_mid_body_is_not_counted<B: ServerBackend>() {
    if B::skipped_without_sessions("it kills its connection's server session by id") {
        return;
    }
    let Some((db, _conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    for delivery in 1..=4 {
        let mut conn = db.connect();
        let victim = connection_id::<B>(&mut conn);
        let killer = Mutex::new(db.connect());
        let after_the_kill = if delivery % 2 == 0 {
            Step::Sql(BUMP.to_owned())
        } else {
            Step::Fail("failed after the kill".to_owned())
        };
        let msg = Scripted::new(
            "kill-1",
            vec![
                Step::Call(Box::new(|| {
                    terminate::<B>(&mut killer.lock().unwrap(), victim);
                })),
                after_the_kill,
            ],
        );
        let result = scripted(&mut conn, &msg);
        let error = result.as_ref().expect_err("the connection is gone");
        assert_eq!(recovery_of(error), Recovery::Reconnect, "{error:?}");
        assert_eq!(ack_decision(&result), AckDecision::Retry);
        assert_eq!(
            failure_row::<B>(&mut observer, SCRIPTED, "kill-1"),
            None,
            "delivery {delivery}: not counted"
        );
    }
    assert_eq!(claims(&mut observer, SCRIPTED, "kill-1"), 0);
    assert_eq!(effects(&mut observer, "kill-1"), 0);
    let mut conn = db.connect();
    scripted(&mut conn, &Scripted::new("kill-1", vec![])).expect("processed");
    assert_eq!(effects(&mut observer, "kill-1"), 1);
    assert_eq!(all_failure_rows(&mut observer), 0);
}

/// Handlers called inside the caller's transaction: their failures,
/// rejections and panics roll back their savepoint and count nothing, even
/// past the limit; the caller's work commits. Top-level deliveries of the
/// same ids afterwards start from nothing.
pub fn nested_handler_failures_are_not_counted<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    conn.transaction(|conn| {
        write_effect(conn, "caller", "caller")?;
        for _ in 1..=4 {
            let result = three(conn, &Msg::failing("n-1", "boom"));
            assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
        }
        let result = three(conn, &Msg::rejecting("n-2", "bad"));
        assert!(
            matches!(result, Err(AppError::Inbox(InboxError::Rejected { .. }))),
            "{result:?}"
        );
        let caught = catch_unwind(AssertUnwindSafe(|| {
            three(conn, &Msg::panicking("n-3", "nested"))
        }));
        assert!(caught.is_err(), "the panic is resumed");
        Ok::<_, AppError>(())
    })
    .expect("the caller's transaction commits");
    assert_eq!(all_failure_rows(&mut observer), 0, "nothing counted");
    assert_eq!(all_claims(&mut observer), 0);
    assert_eq!(effects(&mut observer, "caller"), 1);
    for id in ["n-1", "n-2", "n-3"] {
        assert_eq!(effects(&mut observer, id), 0, "{id}");
    }

    let result = three(&mut conn, &Msg::failing("n-1", "top level"));
    assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "n-1"),
        counted(1, "top level")
    );
    let fine = Msg::succeeding("n-2");
    three(&mut conn, &fine).expect("not dead: processed");
    assert_eq!(fine.runs(), 1);
    assert_eq!(effects(&mut observer, "n-2"), 1);
}

/// A real deadlock between the body and another transaction, which the
/// server resolves by rolling the body's transaction back: PostgreSQL's
/// detector runs in the session that waited `deadlock_timeout` first (10 ms
/// for the handler's, 1 s for the other), InnoDB rolls back the smaller
/// transaction (the other one writes ten rows first). Four times, none
/// counted.
pub fn a_deadlock_in_the_body_is_not_counted<B: ServerBackend>() {
    deadlock_in_the_body::<B>(|| {
        Step::Sql("UPDATE poison_locks SET n = n + 1 WHERE id = 2".to_owned())
    });
}

/// The same deadlock met inside a `conn.transaction` of the body's own:
/// InnoDB's rollback of the whole transaction takes Diesel's savepoint with
/// it, so the body's error is Diesel's failed `ROLLBACK TO SAVEPOINT`
/// (1305), not the deadlock; still a lock conflict, and never counted.
pub fn a_deadlock_inside_a_savepoint_of_the_body_is_not_counted<B: ServerBackend>() {
    deadlock_in_the_body::<B>(|| {
        Step::InTransaction("UPDATE poison_locks SET n = n + 1 WHERE id = 2".to_owned())
    });
}

/// A deadlock whose error the body ignores, then goes on writing and
/// returns `Ok`. InnoDB rolls the whole transaction back, claim and earlier
/// effect included, and runs the body's later statements in a new one
/// (PostgreSQL aborts it instead: the next statement fails, and an ignored
/// failure is caught at `COMMIT`, tested in `e2e`). Nothing may commit and
/// the delivery must fail (`IgnoredStatementFailure`, retried, not counted):
/// an `Ok` here would acknowledge a message whose claim and first effect are
/// gone.
pub fn a_deadlock_the_body_ignores_commits_nothing<B: ServerBackend>() {
    deadlock_the_body_ignores::<B>("dl-ignored", Around::Nothing);
}

/// As [`a_deadlock_the_body_ignores_commits_nothing`], on an inbox whose
/// claim-token migration has not run: the claim that writes the token is
/// refused, and the delivery claims again with a savepoint as its
/// tripwire, which catches the deadlock as well.
pub fn a_deadlock_the_body_ignores_commits_nothing_without_claim_tokens<B: ServerBackend>() {
    deadlock_the_body_ignores::<B>("dl-no-token", Around::NoTokenColumn);
}

/// As [`a_deadlock_the_body_ignores_commits_nothing`], and before the body
/// writes on, another delivery of the same id claims it and commits: the
/// claim the commit finds is that delivery's, not this one's, which the
/// deadlock took away. A commit that checked only that the id is claimed
/// would commit the body's later statements: nothing of the body may
/// commit, and the other's claim stays.
pub fn a_claim_taken_over_after_a_deadlock_the_body_ignores_commits_nothing<B: ServerBackend>() {
    deadlock_the_body_ignores::<B>("dl-taken-over", Around::TakenOver);
}

/// What happens around the deadlock of [`deadlock_the_body_ignores`].
#[derive(PartialEq)]
enum Around {
    Nothing,
    /// Another delivery claims the id and commits after the deadlock.
    TakenOver,
    /// The inbox has no `claim_token` column (MySQL/MariaDB).
    NoTokenColumn,
}

/// A delivery of `id` whose body deadlocks, ignores the error, writes on
/// and returns `Ok`, with `around` happening: it must fail with
/// `IgnoredStatementFailure` (retried, not counted), with nothing of it
/// committed. Then the redelivery, without the interference, is processed
/// once, or is a duplicate of the other delivery's.
fn deadlock_the_body_ignores<B: ServerBackend>(id: &str, around: Around) {
    if B::skipped_without_sessions("it watches its connections' server sessions by id") {
        return;
    }
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    if around == Around::NoTokenColumn {
        observer
            .batch_execute("ALTER TABLE inbox_messages DROP COLUMN claim_token")
            .expect("an inbox from before the claim token");
    }
    let taken_over = around == Around::TakenOver;
    let partners = DeadlockPartners::new(&db, &mut observer);
    let interfere = || partners.start();
    let take_over = || {
        if taken_over {
            db.connect()
                .batch_execute(&format!(
                    "INSERT INTO inbox_messages (handler, message_id) VALUES ({}, {})",
                    literal(SCRIPTED),
                    literal(id)
                ))
                .expect("the other delivery claims the id and commits");
        }
    };
    let msg = Scripted::new(
        id,
        vec![
            Step::Sql("UPDATE poison_locks SET n = n + 1 WHERE id = 1".to_owned()),
            Step::Call(Box::new(interfere)),
            Step::Ignored("UPDATE poison_locks SET n = n + 1 WHERE id = 2".to_owned()),
            Step::Call(Box::new(take_over)),
            Step::Sql(format!(
                "INSERT INTO poison_effects (message_id, note) VALUES ({}, 'after')",
                literal(id)
            )),
        ],
    );
    let result = scripted(&mut conn, &msg);
    partners.join();
    let Err(AppError::Inbox(InboxError::IgnoredStatementFailure { source })) = &result else {
        panic!("{result:?}");
    };
    // Which guard caught it: the commit's check of the claim token, or the
    // savepoint's release.
    let guard = match around {
        Around::NoTokenColumn => "SAVEPOINT inbox_transaction does not exist",
        Around::Nothing | Around::TakenOver => "'inbox_transaction lost'",
    };
    assert!(source.to_string().contains(guard), "{guard}: {source}");
    assert_eq!(ack_decision(&result), AckDecision::Retry);
    assert_eq!(
        all_effects(&mut observer),
        0,
        "nothing of the body committed"
    );
    assert_eq!(failure_row::<B>(&mut observer, SCRIPTED, id), None);
    assert_eq!(
        claims(&mut observer, SCRIPTED, id),
        i64::from(taken_over),
        "only the other delivery's claim"
    );

    // The redelivery, without the interference.
    let again = Scripted::new(id, vec![]);
    scripted(&mut conn, &again).expect("processed, or a duplicate");
    assert_eq!(again.runs(), u32::from(!taken_over));
    assert_eq!(claims(&mut observer, SCRIPTED, id), 1);
    assert_eq!(effects(&mut observer, id), i64::from(!taken_over));
}

/// The other side of the deadlock tests: transactions on connections of
/// their own that deadlock with the body, started while it runs and joined
/// after each delivery.
struct DeadlockPartners<'db, B: ServerBackend> {
    db: &'db B,
    /// Watches a partner until it waits for the body's lock.
    watcher: Mutex<B::Connection>,
    started: Mutex<Vec<std::thread::JoinHandle<diesel::QueryResult<()>>>>,
}

impl<'db, B: ServerBackend> DeadlockPartners<'db, B> {
    /// Adds row 2 of `poison_locks`, which the partners lock first.
    fn new(db: &'db B, observer: &mut B::Connection) -> Self {
        observer
            .batch_execute("INSERT INTO poison_locks (id, n) VALUES (2, 0)")
            .unwrap();
        DeadlockPartners {
            db,
            watcher: Mutex::new(db.connect()),
            started: Mutex::new(Vec::new()),
        }
    }

    /// Starts a partner and returns once it waits for the body's lock on
    /// row 1: it wrote ten rows and locked row 2 first, so InnoDB picks the
    /// body as the victim.
    fn start(&self) {
        let mut other = self.db.connect();
        let other_id = connection_id::<B>(&mut other);
        self.started
            .lock()
            .unwrap()
            .push(std::thread::spawn(move || {
                other.batch_execute("BEGIN").unwrap();
                for i in 0..10 {
                    other
                        .batch_execute(&format!(
                            "INSERT INTO poison_effects (message_id, note) VALUES ('other', '{i}')"
                        ))
                        .unwrap();
                }
                other
                    .batch_execute("UPDATE poison_locks SET n = n + 100 WHERE id = 2")
                    .unwrap();
                // Waits for the body's lock, until the body is rolled back.
                let waited =
                    other.batch_execute("UPDATE poison_locks SET n = n + 100 WHERE id = 1");
                other.batch_execute("ROLLBACK").unwrap();
                waited
            }));
        wait_until(
            &mut *self.watcher.lock().unwrap(),
            &waits_in_sql::<B>(other_id, "UPDATE poison_locks SET n = n + 100 WHERE id = 1"),
        );
    }

    /// Joins the partners started so far: each got its lock once the body
    /// was rolled back.
    fn join(&self) {
        for other in self.started.lock().unwrap().drain(..) {
            other
                .join()
                .expect("the other transaction")
                .expect("it got the lock once the body was rolled back");
        }
    }
}

/// Four deliveries whose body deadlocks at `second_lock` (row 2) against
/// [`DeadlockPartners`]; none counted.
fn deadlock_in_the_body<B: ServerBackend>(second_lock: impl Fn() -> Step<'static>) {
    if B::skipped_without_sessions("it watches its connections' server sessions by id") {
        return;
    }
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let partners = DeadlockPartners::new(&db, &mut observer);
    if B::NAME == "postgres" {
        conn.batch_execute("SET deadlock_timeout = '10ms'").unwrap();
    }
    let interfere = || partners.start();
    for _ in 1..=4 {
        let msg = Scripted::new(
            "dl-1",
            vec![
                Step::Sql("UPDATE poison_locks SET n = n + 1 WHERE id = 1".to_owned()),
                Step::Call(Box::new(interfere)),
                second_lock(),
            ],
        );
        let result = scripted(&mut conn, &msg);
        match &result {
            Err(AppError::Db(error)) => assert!(is_lock_conflict(error), "{error:?}"),
            other => panic!("expected the body to lose the deadlock, got {other:?}"),
        }
        assert_eq!(ack_decision(&result), AckDecision::Retry);
        partners.join();
    }
    assert_eq!(failure_row::<B>(&mut observer, SCRIPTED, "dl-1"), None);
    assert_eq!(claims(&mut observer, SCRIPTED, "dl-1"), 0);
    assert_eq!(all_effects(&mut observer), 0);
}

inbox_tests::backend_tests! {
    nested_handler_failures_are_not_counted;
    only [postgres, mysql]: a_lock_timeout_in_the_body_is_not_counted, a_deadlock_in_the_body_is_not_counted, a_deadlock_inside_a_savepoint_of_the_body_is_not_counted, a_connection_killed_mid_body_is_not_counted;
    only [mysql]: a_deadlock_the_body_ignores_commits_nothing, a_claim_taken_over_after_a_deadlock_the_body_ignores_commits_nothing, a_deadlock_the_body_ignores_commits_nothing_without_claim_tokens;
    only [postgres]: a_serialization_failure_in_the_body_is_not_counted;
}
