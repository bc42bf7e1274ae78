//! The consumer's diesel-async connection terminated mid-body, between the
//! body and `COMMIT` (the handler's own, and a caller's transaction around
//! the handler), held directly and taken from deadpool and bb8, on each
//! server backend.

use std::sync::atomic::{AtomicU32, Ordering};

use diesel::QueryResult;
use diesel_async::pooled_connection::{PoolableConnection, RecyclingMethod};
use diesel_async::{AsyncConnection, RunQueryDsl};
use inbox_runtime::background::AsyncPool;
use inbox_runtime::{InboxBackend, Outcome, Recovery, idempotent};
use inbox_tests::{
    AsyncSqlRows, ServerBackend, TestBackend, connection_id_async, statement, terminate_async,
};

use crate::support::*;

/// Who kills the handler's connection, and when.
pub struct Kill<B: TestBackend> {
    at: KillAt,
    victim: i64,
    killer: tokio::sync::Mutex<B::AsyncConnection>,
}

/// A delivery; `kill` makes the body terminate its own connection.
pub struct Delivery<B: TestBackend> {
    id: String,
    kill: Option<Kill<B>>,
    runs: AtomicU32,
}

impl<B: ServerBackend> Delivery<B> {
    fn new(id: &str) -> Self {
        Delivery {
            id: id.to_owned(),
            kill: None,
            runs: AtomicU32::new(0),
        }
    }

    fn doomed(id: &str, at: KillAt, victim: i64, killer: B::AsyncConnection) -> Self {
        Delivery {
            kill: Some(Kill {
                at,
                victim,
                killer: tokio::sync::Mutex::new(killer),
            }),
            ..Delivery::new(id)
        }
    }

    fn runs(&self) -> u32 {
        AtomicU32::load(&self.runs, Ordering::Relaxed)
    }

    async fn kill_if(&self, at: KillAt) {
        if let Some(kill) = self.kill.as_ref().filter(|kill| kill.at == at) {
            terminate_async::<B>(&mut *kill.killer.lock().await, kill.victim).await;
        }
    }
}

/// Two effects; the connection is killed between them, or after the
/// second (the body's last statement), as the delivery says.
#[idempotent(id = msg.id, handler = "loss.apply_async")]
async fn apply<B, P>(conn: &mut P, msg: &Delivery<B>) -> Result<Outcome<()>, AppError>
where
    B: ServerBackend,
    P: AsyncConnection<Backend: InboxBackend>,
{
    msg.runs.fetch_add(1, Ordering::Relaxed);
    effect(conn, &msg.id, "step 1").await?;
    msg.kill_if(KillAt::MidBody).await;
    effect(conn, &msg.id, "step 2").await?;
    msg.kill_if(KillAt::BeforeCommit).await;
    Ok(Outcome::Processed(()))
}

/// Delivers `msg`: on its own, or (`KillAt::CallerCommit`) inside a
/// caller's transaction that kills the connection before committing.
async fn deliver<B, P>(conn: &mut P, msg: &Delivery<B>) -> Result<Outcome<()>, AppError>
where
    B: ServerBackend,
    P: AsyncConnection<Backend: InboxBackend>,
{
    if msg
        .kill
        .as_ref()
        .is_some_and(|kill| kill.at == KillAt::CallerCommit)
    {
        conn.transaction(async |conn| {
            let outcome = apply(conn, msg).await?;
            msg.kill_if(KillAt::CallerCommit).await;
            Ok(outcome)
        })
        .await
    } else {
        apply(conn, msg).await
    }
}

async fn effect<C: AsyncConnection>(conn: &mut C, id: &str, note: &str) -> QueryResult<()> {
    statement(effect_sql(id, note))
        .execute(conn)
        .await
        .map(drop)
}

async fn fresh<B: TestBackend>() -> Option<(B, B::AsyncConnection)> {
    B::open_async_with_effects(EFFECTS_DDL).await
}

/// `(inbox rows, effects)` of `id`, read on a connection of its own.
async fn committed<B: TestBackend>(db: &B, id: &str) -> (i64, Vec<String>) {
    let mut conn = db.connect_async().await;
    let claims = conn.bigint(&claims_sql(id)).await;
    let mut notes = conn.texts(&notes_sql(id)).await;
    notes.sort();
    (claims, notes)
}

async fn check_loss<B: TestBackend>(db: &B, how: &str, error: &AppError, id: &str) {
    println!(
        "{} async {how}: {error:?} -> {:?}",
        B::NAME,
        classify(error)
    );
    assert_eq!(classify(error), Recovery::Reconnect, "{how}: {error:?}");
    assert_eq!(
        committed(db, id).await,
        (0, vec![]),
        "{how}: nothing committed"
    );
}

async fn redeliver_once<B, P>(db: &B, next: &mut P, id: &str)
where
    B: ServerBackend,
    P: AsyncConnection<Backend: InboxBackend>,
{
    let redelivery = Delivery::<B>::new(id);
    assert_eq!(
        apply(next, &redelivery).await.expect("the redelivery"),
        Outcome::Processed(())
    );
    assert_eq!(
        apply(next, &redelivery).await.expect("a duplicate"),
        Outcome::Duplicate
    );
    assert_eq!(redelivery.runs(), 1);
    assert_eq!(
        committed(db, id).await,
        (1, vec!["step 1".to_owned(), "step 2".to_owned()]),
        "the redelivery's effects, once"
    );
}

/// A later delivery and a plain transaction on the killed
/// connection fail at once, each with a Reconnect.
async fn later_work_fails_fast<B: ServerBackend>(conn: &mut B::AsyncConnection, how: &str) {
    let later = Delivery::<B>::new("after-the-kill");
    let result = tokio::time::timeout(HANG, apply(conn, &later))
        .await
        .unwrap_or_else(|_| panic!("{how}: a delivery on the killed connection hung"));
    let plain = tokio::time::timeout(
        HANG,
        conn.transaction(async |conn| statement("SELECT 1").execute(conn).await),
    )
    .await
    .unwrap_or_else(|_| panic!("{how}: a transaction on the killed connection hung"));
    let later_error = result.expect_err("the killed connection refuses a delivery");
    let plain = plain.expect_err("the killed connection refuses a transaction");
    println!(
        "{} async {how}: then {later_error:?} and {plain:?}",
        B::NAME
    );
    assert_eq!(
        later.runs(),
        0,
        "{how}: no body ran on the killed connection"
    );
    assert_eq!(
        classify(&later_error),
        Recovery::Reconnect,
        "{how}: {later_error:?}"
    );
    assert_eq!(
        inbox_runtime::recovery(&plain),
        Recovery::Reconnect,
        "{how}: {plain:?}"
    );
}

async fn lose_direct<B: ServerBackend>(at: KillAt) {
    let Some((db, mut conn)) = fresh::<B>().await else {
        return;
    };
    let how = format!("{at:?}");
    let id = format!("direct-{at:?}");
    let victim = connection_id_async::<B>(&mut conn).await;
    let doomed = Delivery::<B>::doomed(&id, at, victim, db.connect_async().await);
    let error = deliver(&mut conn, &doomed)
        .await
        .expect_err("the connection was killed");
    assert_eq!(doomed.runs(), 1);
    check_loss(&db, &how, &error, &id).await;
    later_work_fails_fast::<B>(&mut conn, &how).await;
    redeliver_once(&db, &mut db.connect_async().await, &id).await;
}

pub async fn killed_mid_body_says_reconnect_and_the_connection_fails_fast<B: ServerBackend>() {
    lose_direct::<B>(KillAt::MidBody).await;
}

pub async fn killed_between_body_and_commit_says_reconnect_and_the_connection_fails_fast<
    B: ServerBackend,
>() {
    lose_direct::<B>(KillAt::BeforeCommit).await;
}

pub async fn killed_before_the_callers_commit_says_reconnect_and_the_connection_fails_fast<
    B: ServerBackend,
>() {
    lose_direct::<B>(KillAt::CallerCommit).await;
}

/// Whether the pool's own checks let the dead connection back in
/// (then shown, and the caller told to go on): `broken` is what the
/// pool's `is_broken` check answered when the connection came back,
/// `verifies` whether the pool also runs `SELECT 1`.
///
/// The inbox marks the transaction manager broken whenever its own
/// transaction is lost, so `is_broken` catches every failure of the
/// handler's transaction. A failure of the *caller's* COMMIT is
/// diesel-async's: on PostgreSQL `is_broken` still sees the closed
/// socket, but `AsyncMysqlConnection` has no such check and
/// diesel-async leaves its transaction manager valid, so a pool that
/// does not verify (`RecyclingMethod::Fast`, bb8 with
/// `test_on_check_out(false)`) hands the dead connection back, for
/// ever: every delivery on it fails with Reconnect. The defaults
/// (`Verified`, `test_on_check_out(true)`) discard it.
async fn handed_back<B, P, F, E>(
    how: &str,
    at: KillAt,
    broken: bool,
    verifies: bool,
    checkout: impl FnOnce() -> F,
) -> bool
where
    F: std::future::Future<Output = Result<P, E>>,
    B: ServerBackend,
    P: std::ops::DerefMut<Target = B::AsyncConnection> + Send,
    E: std::fmt::Debug,
{
    if at != KillAt::CallerCommit {
        assert!(
            broken,
            "{how}: the inbox marks a lost transaction's connection broken"
        );
    }
    if broken || verifies {
        return false;
    }
    assert!(
        B::NAME == "mysql" && at == KillAt::CallerCommit,
        "{how}: the pool cannot see the dead connection"
    );
    let mut again = tokio::time::timeout(HANG, checkout())
        .await
        .unwrap_or_else(|_| panic!("{how}: the checkout hung"))
        .expect("a checkout");
    let error = apply(&mut *again, &Delivery::<B>::new("handed-back"))
        .await
        .expect_err("the dead connection, handed back");
    println!(
        "{} async {how}: KNOWN GAP: the pool handed the dead connection back: {error:?}",
        B::NAME
    );
    assert_eq!(classify(&error), Recovery::Reconnect, "{how}: {error:?}");
    true
}

/// A deadpool pool of one, with each recycling method: `Fast`
/// checks only `PoolableConnection::is_broken` (the transaction
/// manager; on PostgreSQL also whether the socket is closed),
/// `Verified` also runs `SELECT 1`.
async fn lose_deadpool<B: ServerBackend>(at: KillAt) {
    let Some((db, _conn)) = fresh::<B>().await else {
        return;
    };
    for (method_name, method, verifies) in [
        ("Fast", RecyclingMethod::Fast, false),
        ("Verified", RecyclingMethod::Verified, true),
    ] {
        let pool = B::deadpool_recycling(db.url(), 1, method);
        let how = format!("{at:?} deadpool {method_name}");
        let id = format!("deadpool-{at:?}-{method_name}");
        let mut object = pool.checkout().await.expect("a connection");
        let victim = connection_id_async::<B>(&mut object).await;
        let doomed = Delivery::<B>::doomed(&id, at, victim, db.connect_async().await);
        let error = deliver(&mut *object, &doomed)
            .await
            .expect_err("the connection was killed");
        check_loss(&db, &how, &error, &id).await;
        let broken = PoolableConnection::is_broken(&mut *object);
        drop(object);
        if handed_back::<B, _, _, _>(&how, at, broken, verifies, || pool.checkout()).await {
            continue;
        }

        let mut next = tokio::time::timeout(HANG, pool.checkout())
            .await
            .unwrap_or_else(|_| panic!("{how}: the next checkout hung"))
            .expect("the pool hands out a working connection");
        let replacement = connection_id_async::<B>(&mut next).await;
        println!(
            "{} async {how}: connection {victim} discarded by recycle, \
             connection {replacement} handed out",
            B::NAME
        );
        assert_ne!(replacement, victim, "{how}: a new connection");
        redeliver_once(&db, &mut *next, &id).await;
    }
}

/// A bb8 pool of one: `has_broken` (the transaction manager; on
/// PostgreSQL also whether the socket is closed) runs when the
/// connection comes back; `test_on_check_out` adds `SELECT 1`.
async fn lose_bb8<B: ServerBackend>(at: KillAt) {
    let Some((db, _conn)) = fresh::<B>().await else {
        return;
    };
    for test_on_check_out in [false, true] {
        let pool = B::bb8_checked(db.url(), 1, test_on_check_out, HANG).await;
        let how = format!("{at:?} bb8 test_on_check_out={test_on_check_out}");
        let id = format!("bb8-{at:?}-{test_on_check_out}");
        let mut pooled = pool.checkout().await.expect("a connection");
        let victim = connection_id_async::<B>(&mut pooled).await;
        let doomed = Delivery::<B>::doomed(&id, at, victim, db.connect_async().await);
        let error = deliver(&mut *pooled, &doomed)
            .await
            .expect_err("the connection was killed");
        check_loss(&db, &how, &error, &id).await;
        let broken = PoolableConnection::is_broken(&mut *pooled);
        drop(pooled);
        if handed_back::<B, _, _, _>(&how, at, broken, test_on_check_out, || pool.checkout()).await
        {
            continue;
        }

        let mut next = pool
            .checkout()
            .await
            .expect("the pool hands out a working connection");
        let replacement = connection_id_async::<B>(&mut next).await;
        println!(
            "{} async {how}: connection {victim} discarded by has_broken, \
             connection {replacement} handed out",
            B::NAME
        );
        assert_ne!(replacement, victim, "{how}: a new connection");
        redeliver_once(&db, &mut *next, &id).await;
    }
}

pub async fn deadpool_never_hands_back_a_connection_killed_mid_body<B: ServerBackend>() {
    lose_deadpool::<B>(KillAt::MidBody).await;
}

pub async fn deadpool_never_hands_back_a_connection_killed_before_commit<B: ServerBackend>() {
    lose_deadpool::<B>(KillAt::BeforeCommit).await;
}

pub async fn deadpool_never_hands_back_a_connection_killed_before_the_callers_commit<
    B: ServerBackend,
>() {
    lose_deadpool::<B>(KillAt::CallerCommit).await;
}

pub async fn bb8_never_hands_back_a_connection_killed_before_the_callers_commit<
    B: ServerBackend,
>() {
    lose_bb8::<B>(KillAt::CallerCommit).await;
}

pub async fn bb8_never_hands_back_a_connection_killed_mid_body<B: ServerBackend>() {
    lose_bb8::<B>(KillAt::MidBody).await;
}

pub async fn bb8_never_hands_back_a_connection_killed_before_commit<B: ServerBackend>() {
    lose_bb8::<B>(KillAt::BeforeCommit).await;
}

/// Prepared statements the server dropped (PostgreSQL only).
mod dropped_statements {
    use super::*;

    /// PostgreSQL: the server no longer has the connection's prepared
    /// statements (see the blocking test of the same name): the delivery says
    /// Reconnect and leaves the connection broken, so that deadpool (whose
    /// `Verified` recycling still passes) replaces it.
    pub async fn deadpool_replaces_a_connection_whose_prepared_statements_the_server_dropped<
        B: ServerBackend,
    >() {
        use diesel_async::SimpleAsyncConnection as _;

        let Some((db, _conn)) = fresh::<B>().await else {
            return;
        };
        let pool = B::deadpool_recycling(db.url(), 1, RecyclingMethod::Verified);
        let mut object = pool.checkout().await.expect("a connection");
        let first = Delivery::<B>::new("statements-async-1");
        assert_eq!(
            apply(&mut *object, &first).await.unwrap(),
            Outcome::Processed(())
        );
        object.batch_execute("DEALLOCATE ALL").await.unwrap();
        let victim = connection_id_async::<B>(&mut object).await;
        let error = apply(&mut *object, &Delivery::<B>::new("statements-async-2"))
            .await
            .expect_err("the claim's prepared statement is gone");
        println!("{} async statements dropped: {error:?}", B::NAME);
        assert_eq!(classify(&error), Recovery::Reconnect, "{error:?}");
        assert!(
            PoolableConnection::is_broken(&mut *object),
            "the pool must see the connection whose statements are gone"
        );
        drop(object);
        let mut next = tokio::time::timeout(HANG, pool.checkout())
            .await
            .expect("the checkout")
            .expect("a working connection");
        assert_ne!(
            connection_id_async::<B>(&mut next).await,
            victim,
            "a new connection"
        );
        redeliver_once(&db, &mut *next, "statements-async-2").await;
    }

    inbox_tests::backend_tests!(async only [postgres]:
        deadpool_replaces_a_connection_whose_prepared_statements_the_server_dropped,
    );
}

inbox_tests::backend_tests!(async only [postgres, mysql]:
    killed_mid_body_says_reconnect_and_the_connection_fails_fast,
    killed_between_body_and_commit_says_reconnect_and_the_connection_fails_fast,
    killed_before_the_callers_commit_says_reconnect_and_the_connection_fails_fast,
    deadpool_never_hands_back_a_connection_killed_mid_body,
    deadpool_never_hands_back_a_connection_killed_before_commit,
    deadpool_never_hands_back_a_connection_killed_before_the_callers_commit,
    bb8_never_hands_back_a_connection_killed_before_the_callers_commit,
    bb8_never_hands_back_a_connection_killed_mid_body,
    bb8_never_hands_back_a_connection_killed_before_commit,
);
