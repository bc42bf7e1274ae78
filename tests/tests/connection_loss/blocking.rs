//! The consumer's blocking connection terminated mid-body and between the
//! body and `COMMIT`, held directly and taken from r2d2, on each server
//! backend.

use std::cell::{Cell, RefCell};

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool, R2D2Connection};
use inbox_runtime::{Outcome, Recovery, idempotent};
use inbox_tests::{ServerBackend, SqlRows, TestBackend, connection_id, statement, terminate};

use crate::support::*;

/// Who kills the handler's connection, and when.
pub struct Kill<B: TestBackend> {
    at: KillAt,
    victim: i64,
    killer: RefCell<B::Connection>,
}

/// A delivery; `kill` makes the body terminate its own connection.
pub struct Delivery<B: TestBackend> {
    id: String,
    kill: Option<Kill<B>>,
    runs: Cell<u32>,
}

impl<B: ServerBackend> Delivery<B> {
    fn new(id: &str) -> Self {
        Delivery {
            id: id.to_owned(),
            kill: None,
            runs: Cell::new(0),
        }
    }

    fn doomed(id: &str, at: KillAt, victim: i64, killer: B::Connection) -> Self {
        Delivery {
            kill: Some(Kill {
                at,
                victim,
                killer: RefCell::new(killer),
            }),
            ..Delivery::new(id)
        }
    }

    fn kill_if(&self, at: KillAt) {
        if let Some(kill) = self.kill.as_ref().filter(|kill| kill.at == at) {
            terminate::<B>(&mut kill.killer.borrow_mut(), kill.victim);
        }
    }
}

/// Two effects; the connection is killed between them, or after the
/// second (the body's last statement), as the delivery says.
#[idempotent(id = msg.id, handler = "loss.apply")]
fn apply<B: ServerBackend>(
    conn: &mut B::Connection,
    msg: &Delivery<B>,
) -> Result<Outcome<()>, AppError> {
    msg.runs.set(msg.runs.get() + 1);
    effect(conn, &msg.id, "step 1")?;
    msg.kill_if(KillAt::MidBody);
    effect(conn, &msg.id, "step 2")?;
    msg.kill_if(KillAt::BeforeCommit);
    Ok(Outcome::Processed(()))
}

/// Delivers `msg`: on its own, or (`KillAt::CallerCommit`) inside a
/// caller's transaction that kills the connection before committing.
fn deliver<B: ServerBackend>(
    conn: &mut B::Connection,
    msg: &Delivery<B>,
) -> Result<Outcome<()>, AppError> {
    if msg
        .kill
        .as_ref()
        .is_some_and(|kill| kill.at == KillAt::CallerCommit)
    {
        conn.transaction(|conn| {
            let outcome = apply(conn, msg)?;
            msg.kill_if(KillAt::CallerCommit);
            Ok(outcome)
        })
    } else {
        apply(conn, msg)
    }
}

fn effect<C: Connection>(conn: &mut C, id: &str, note: &str) -> QueryResult<()> {
    statement(effect_sql(id, note)).execute(conn).map(drop)
}

fn fresh<B: TestBackend>() -> Option<(B, B::Connection)> {
    B::open_with_effects(EFFECTS_DDL)
}

/// `(inbox rows, effects)` of `id`, read on a connection of its own.
fn committed<B: TestBackend>(db: &B, id: &str) -> (i64, Vec<String>) {
    let mut conn = db.connect();
    let claims = conn.bigint(&claims_sql(id));
    let mut notes = conn.texts(&notes_sql(id));
    notes.sort();
    (claims, notes)
}

/// The first error, then: nothing committed, the error says
/// Reconnect, and the redelivery on `next` processes once.
fn check_loss<B: TestBackend>(db: &B, how: &str, error: &AppError, id: &str) {
    println!(
        "{} blocking {how}: {error:?} -> {:?}",
        B::NAME,
        classify(error)
    );
    assert_eq!(classify(error), Recovery::Reconnect, "{how}: {error:?}");
    assert_eq!(committed(db, id), (0, vec![]), "{how}: nothing committed");
}

fn redeliver_once<B: ServerBackend>(db: &B, next: &mut B::Connection, id: &str) {
    let redelivery = Delivery::<B>::new(id);
    assert_eq!(
        apply(next, &redelivery).expect("the redelivery"),
        Outcome::Processed(())
    );
    assert_eq!(
        apply(next, &redelivery).expect("a duplicate"),
        Outcome::Duplicate
    );
    assert_eq!(redelivery.runs.get(), 1);
    assert_eq!(
        committed(db, id),
        (1, vec!["step 1".to_owned(), "step 2".to_owned()]),
        "the redelivery's effects, once"
    );
}

/// The connection held directly: the error, then a later delivery
/// and a plain transaction on the same connection fail at once with
/// a Reconnect, then the redelivery on a new connection.
fn lose_direct<B: ServerBackend>(at: KillAt) {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let how = format!("{at:?}");
    let id = format!("direct-{at:?}");
    let doomed = Delivery::<B>::doomed(&id, at, connection_id::<B>(&mut conn), db.connect());
    let error = deliver(&mut conn, &doomed).expect_err("the connection was killed");
    assert_eq!(doomed.runs.get(), 1);
    check_loss(&db, &how, &error, &id);

    let (later, plain, body_ran) = within("work on the killed connection", move || {
        let later = Delivery::<B>::new("after-the-kill");
        let result = apply(&mut conn, &later);
        let plain = conn.transaction(|conn| statement("SELECT 1").execute(conn));
        (result, plain, later.runs.get())
    });
    let later = later.expect_err("the killed connection refuses a delivery");
    let plain = plain.expect_err("the killed connection refuses a transaction");
    println!("{} blocking {how}: then {later:?} and {plain:?}", B::NAME);
    assert_eq!(body_ran, 0, "no body ran on the killed connection");
    assert_eq!(classify(&later), Recovery::Reconnect, "{later:?}");
    assert_eq!(
        inbox_runtime::recovery(&plain),
        Recovery::Reconnect,
        "{plain:?}"
    );

    redeliver_once(&db, &mut db.connect(), &id);
}

/// An r2d2 pool of one: after the failure, the next checkout is a
/// new, working connection. With `test_on_check_out(false)` only
/// `has_broken` (Diesel's `R2D2Connection::is_broken`, the
/// transaction manager's state) stands between the dead connection
/// and the next caller.
fn lose_pooled<B: ServerBackend>(at: KillAt) {
    let Some((db, _conn)) = fresh::<B>() else {
        return;
    };
    for test_on_check_out in [false, true] {
        let pool = Pool::builder()
            .max_size(1)
            .test_on_check_out(test_on_check_out)
            .connection_timeout(HANG)
            .build(ConnectionManager::<B::Connection>::new(db.url()))
            .expect("build a pool");
        let how = format!("{at:?} r2d2 test_on_check_out={test_on_check_out}");
        let id = format!("r2d2-{at:?}-{test_on_check_out}");
        let mut pooled = pool.get().expect("a connection");
        let victim = connection_id::<B>(&mut pooled);
        let doomed = Delivery::<B>::doomed(&id, at, victim, db.connect());
        let error = deliver::<B>(&mut pooled, &doomed).expect_err("the connection was killed");
        check_loss(&db, &how, &error, &id);
        assert!(
            R2D2Connection::is_broken(&mut *pooled),
            "{how}: has_broken must see the dead connection"
        );
        drop(pooled);

        let pool = pool.clone();
        let (mut next, state) = within("the next checkout", move || {
            let next = pool.get().expect("the pool hands out a working connection");
            (next, pool.state())
        });
        let replacement = connection_id::<B>(&mut next);
        println!(
            "{} blocking {how}: connection {victim} discarded, \
             connection {replacement} handed out ({state:?})",
            B::NAME
        );
        assert_ne!(replacement, victim, "{how}: a new connection");
        redeliver_once(&db, &mut next, &id);
    }
}

pub fn killed_mid_body_says_reconnect_and_the_connection_fails_fast<B: ServerBackend>() {
    lose_direct::<B>(KillAt::MidBody);
}

pub fn killed_between_body_and_commit_says_reconnect_and_the_connection_fails_fast<
    B: ServerBackend,
>() {
    lose_direct::<B>(KillAt::BeforeCommit);
}

pub fn killed_before_the_callers_commit_the_connection_fails_fast<B: ServerBackend>() {
    lose_direct::<B>(KillAt::CallerCommit);
}

pub fn r2d2_never_hands_back_a_connection_killed_before_the_callers_commit<B: ServerBackend>() {
    lose_pooled::<B>(KillAt::CallerCommit);
}

pub fn r2d2_never_hands_back_a_connection_killed_mid_body<B: ServerBackend>() {
    lose_pooled::<B>(KillAt::MidBody);
}

pub fn r2d2_never_hands_back_a_connection_killed_before_commit<B: ServerBackend>() {
    lose_pooled::<B>(KillAt::BeforeCommit);
}

/// Prepared statements the server dropped (PostgreSQL only).
mod dropped_statements {
    use super::*;

    /// PostgreSQL: the server no longer has the connection's prepared
    /// statements (`DEALLOCATE ALL`; through PgBouncer's transaction pooling,
    /// a server connection that never prepared them): every statement Diesel
    /// cached fails on that connection for ever ("prepared statement
    /// \"__diesel_stmt_N\" does not exist"). The delivery says Reconnect and
    /// leaves the connection broken, so that r2d2 (whose `SELECT 1` on checkout
    /// still passes) replaces it.
    pub fn r2d2_replaces_a_connection_whose_prepared_statements_the_server_dropped<
        B: ServerBackend,
    >() {
        use diesel::connection::SimpleConnection as _;

        let Some((db, _conn)) = fresh::<B>() else {
            return;
        };
        let pool = Pool::builder()
            .max_size(1)
            .connection_timeout(HANG)
            .build(ConnectionManager::<B::Connection>::new(db.url()))
            .expect("build a pool");
        let mut pooled = pool.get().expect("a connection");
        let first = Delivery::<B>::new("statements-1");
        assert_eq!(
            apply::<B>(&mut pooled, &first).unwrap(),
            Outcome::Processed(())
        );
        pooled.batch_execute("DEALLOCATE ALL").unwrap();
        let victim = connection_id::<B>(&mut pooled);
        let error = apply::<B>(&mut pooled, &Delivery::<B>::new("statements-2"))
            .expect_err("the claim's prepared statement is gone");
        println!("{} blocking statements dropped: {error:?}", B::NAME);
        assert_eq!(classify(&error), Recovery::Reconnect, "{error:?}");
        assert_eq!(committed(&db, "statements-2"), (0, vec![]));
        assert!(
            R2D2Connection::is_broken(&mut *pooled),
            "has_broken must see the connection whose statements are gone"
        );
        drop(pooled);
        let mut next = pool.get().expect("a working connection");
        assert_ne!(connection_id::<B>(&mut next), victim, "a new connection");
        redeliver_once(&db, &mut next, "statements-2");
    }

    inbox_tests::backend_tests!(only [postgres]:
        r2d2_replaces_a_connection_whose_prepared_statements_the_server_dropped,
    );
}

inbox_tests::backend_tests!(only [postgres, mysql]:
    killed_mid_body_says_reconnect_and_the_connection_fails_fast,
    killed_between_body_and_commit_says_reconnect_and_the_connection_fails_fast,
    killed_before_the_callers_commit_the_connection_fails_fast,
    r2d2_never_hands_back_a_connection_killed_before_the_callers_commit,
    r2d2_never_hands_back_a_connection_killed_mid_body,
    r2d2_never_hands_back_a_connection_killed_before_commit,
);
