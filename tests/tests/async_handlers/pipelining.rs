//! A handler whose connection is an `AsyncPgConnection` sends its `BEGIN`
//! in one flight with the claim, and that claim can never commit on its
//! own: counted on the wire through the harness proxy, on the real server.

use diesel::QueryResult;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use inbox_runtime::{ClaimKey, HandlerName, Outcome, PipelinedClaimStatement};
use inbox_tests::{Postgres, TestBackend};

use crate::handlers::{EFFECTS_DDL, Msg, record_generic, record_pg};
use crate::support::{claims, counted, effects, effects_and_claims, flights};
use inbox_tests::AppError;
use inbox_tests::CancelAfter;

/// The same handler written for `AsyncPgConnection` and for any connection:
/// the first sends one round trip fewer for a processed message and for a
/// duplicate, which costs it two (`BEGIN` + claim, the commit).
async fn an_async_pg_handler_sends_begin_in_one_flight_with_its_claim() {
    let Some(mut counted) = counted::<Postgres>().await else {
        return;
    };
    let both = [Written::ForTheType, Written::Generic];
    // Warm up both handlers: every statement prepared and cached.
    for round in 0..2 {
        for written in both {
            let msg = Msg::new(format!("warm-{written:?}-{round}"));
            let processed = written.deliver(&mut counted.conn, &msg).await;
            assert_eq!(processed.unwrap(), Outcome::Processed(0));
            let duplicate = written.deliver(&mut counted.conn, &msg).await;
            assert_eq!(duplicate.unwrap(), Outcome::Duplicate);
        }
    }
    let mut trips = Vec::new();
    for written in both {
        let msg = Msg::new(format!("{written:?}"));
        let delivery = written.deliver(&mut counted.conn, &msg);
        let (outcome, processed) = flights(&counted.proxy, delivery).await;
        assert_eq!(outcome.expect("processed"), Outcome::Processed(0));
        let delivery = written.deliver(&mut counted.conn, &msg);
        let (outcome, duplicate) = flights(&counted.proxy, delivery).await;
        assert_eq!(outcome.expect("duplicate"), Outcome::Duplicate);
        trips.push((processed, duplicate));
        assert_eq!(
            effects(&mut counted.direct, &msg.id).await,
            1,
            "{written:?}: one effect"
        );
        let claims = claims(&mut counted.direct, "async.record", &msg.id).await;
        assert_eq!(claims, 1, "{written:?}: one claim");
    }
    let [
        (processed, duplicate),
        (generic_processed, generic_duplicate),
    ] = trips[..]
    else {
        unreachable!("two ways of writing the handler")
    };
    println!(
        "round trips, processed / duplicate: AsyncPgConnection {processed} / {duplicate}, \
         generic {generic_processed} / {generic_duplicate}"
    );
    assert_eq!(
        (duplicate, generic_duplicate),
        (2, 3),
        "a duplicate: BEGIN + claim and the commit, against BEGIN, the claim, the commit"
    );
    assert_eq!(
        processed + 1,
        generic_processed,
        "a processed message: one round trip fewer ({processed} against {generic_processed})"
    );
}

/// The claim sent with the `BEGIN` refuses to run outside the transaction
/// block that `BEGIN` opens (had it failed, a claim that ran anyway would
/// commit on its own, without the effects): outside any transaction, and
/// inside one another `BEGIN` opened, it fails and writes nothing, bounded
/// or not.
async fn the_pipelined_claim_refuses_to_run_outside_its_transaction_block() {
    let Some((_db, mut conn)) = Postgres::open_async_with_effects(EFFECTS_DDL).await else {
        return;
    };
    let key = ClaimKey::new(HandlerName::new("async.guarded").unwrap(), "m-1").unwrap();
    // The mark of a transaction that ended does not outlive it, and the
    // guard holds in the generic plans of a prepared statement run often.
    conn.batch_execute(
        "BEGIN; SET LOCAL inbox.claiming = 'on'; COMMIT; \
         SET plan_cache_mode = force_generic_plan",
    )
    .await
    .unwrap();
    for bound in [None, Some(std::time::Duration::from_secs(2))] {
        for _ in 0..6 {
            let refused: QueryResult<usize> = PipelinedClaimStatement::new(&key, bound)
                .execute(&mut conn)
                .await;
            assert!(refused.is_err(), "bound {bound:?}, generic plan: refused");
        }
    }
    conn.batch_execute("RESET plan_cache_mode").await.unwrap();
    for bound in [None, Some(std::time::Duration::from_secs(2))] {
        let outside: QueryResult<usize> = PipelinedClaimStatement::new(&key, bound)
            .execute(&mut conn)
            .await;
        assert_refused(outside, &format!("outside a transaction, bound {bound:?}"));
        conn.batch_execute("BEGIN").await.unwrap();
        let inside_another: QueryResult<usize> = PipelinedClaimStatement::new(&key, bound)
            .execute(&mut conn)
            .await;
        conn.batch_execute("ROLLBACK").await.unwrap();
        assert_refused(
            inside_another,
            &format!("in a block the pipelined begin did not open, bound {bound:?}"),
        );
    }
    assert_eq!(claims(&mut conn, "async.guarded", "m-1").await, 0);
}

/// Asserts that the guarded claim was refused by its guard, `where`.
fn assert_refused(claim: QueryResult<usize>, context: &str) {
    let error = claim.expect_err(context).to_string();
    assert!(
        error.contains("inbox.claim refused: no transaction block"),
        "{context}: {error}"
    );
}

/// A `BEGIN` that fails (here: the session is in an aborted transaction
/// Diesel does not know of, so the server refuses it) fails the delivery
/// with that error: nothing is claimed or written, the connection is
/// usable, and the redelivery is processed.
async fn a_failed_pipelined_begin_fails_the_delivery_and_claims_nothing() {
    let Some((_db, mut conn)) = Postgres::open_async_with_effects(EFFECTS_DDL).await else {
        return;
    };
    conn.batch_execute("BEGIN; SELECT 1 / 0")
        .await
        .expect_err("division by zero aborts the stray transaction");
    let msg = Msg::new("begin-fails");
    let error = record_pg(&mut conn, &msg)
        .await
        .expect_err("the BEGIN failed")
        .to_string();
    assert!(error.contains("current transaction is aborted"), "{error}");
    assert_eq!(claims(&mut conn, "async.record", "begin-fails").await, 0);
    assert_eq!(effects(&mut conn, "begin-fails").await, 0);
    assert_eq!(
        record_pg(&mut conn, &msg).await.expect("redelivered"),
        Outcome::Processed(0)
    );
    assert_eq!(effects(&mut conn, "begin-fails").await, 1);
}

/// The hazard the guard exists for: a `BEGIN` the server refuses while it
/// stays outside any transaction block (the proxy corrupts it into a
/// syntax error on its way), so the claim sent in the same flight runs on
/// its own. The claim must refuse, writing nothing; the delivery fails with
/// the `BEGIN`'s error, and the redelivery is processed once.
async fn a_claim_sent_with_a_begin_the_server_refused_writes_nothing() {
    let Some(mut counted) = counted::<Postgres>().await else {
        return;
    };
    let warm = Msg::new("warm");
    assert_eq!(
        record_pg(&mut counted.conn, &warm).await.unwrap(),
        Outcome::Processed(0)
    );
    let msg = Msg::new("begin-refused");
    counted
        .proxy
        .corrupt_next(b"BEGIN; SET LOCAL idle", b"BEGIX; SET LOCAL idle");
    let error = record_pg(&mut counted.conn, &msg)
        .await
        .expect_err("the BEGIN was refused")
        .to_string();
    assert!(
        !counted.proxy.corruption_pending(),
        "the BEGIN went through the proxy"
    );
    assert!(
        error.contains("\"BEGIX\""),
        "the BEGIN's own error: {error}"
    );
    assert_eq!(
        claims(&mut counted.direct, "async.record", "begin-refused").await,
        0
    );
    assert_eq!(effects(&mut counted.direct, "begin-refused").await, 0);
    assert_eq!(
        record_pg(&mut counted.conn, &msg)
            .await
            .expect("redelivered"),
        Outcome::Processed(0)
    );
    assert_eq!(
        claims(&mut counted.direct, "async.record", "begin-refused").await,
        1
    );
    assert_eq!(effects(&mut counted.direct, "begin-refused").await, 1);
}

/// How a handler on a directly held `AsyncPgConnection` is written: for
/// that type (its `BEGIN` travels with the claim) or generic over its
/// connection (`BEGIN`, then the claim).
#[derive(Debug, Clone, Copy)]
enum Written {
    ForTheType,
    Generic,
}

impl Written {
    async fn deliver(
        self,
        conn: &mut AsyncPgConnection,
        msg: &Msg,
    ) -> Result<Outcome<i32>, AppError> {
        match self {
            Written::ForTheType => record_pg(conn, msg).await,
            Written::Generic => record_generic(conn, msg).await,
        }
    }
}

/// Drops a delivery's future after each number of waits in turn, on a
/// connection whose statements are prepared (written for the type: the
/// `BEGIN` and the claim in one flight): claim and effect commit together
/// or not at all, the connection refuses further work once cancelled, and
/// the redelivery processes the message once.
async fn cancelling_at_every_await_point_leaves_nothing_half_done(written: Written) {
    let Some((db, mut observer)) = Postgres::open_async_with_effects(EFFECTS_DDL).await else {
        return;
    };
    for polls in 0.. {
        assert!(polls < 100, "{written:?}: the handler never completed");
        let mut conn = AsyncPgConnection::establish(db.url()).await.unwrap();
        for round in 0..2 {
            let warm = Msg::new(format!("warm-{polls}-{round}"));
            let outcome = written.deliver(&mut conn, &warm).await.unwrap();
            assert_eq!(outcome, Outcome::Processed(0));
        }
        let id = format!("cancel-{polls}");
        let msg = Msg::new(id.clone());
        let attempt = CancelAfter::new(written.deliver(&mut conn, &msg), polls).await;
        let finished = attempt.is_some();
        if !finished {
            match written.deliver(&mut conn, &Msg::new("after-cancel")).await {
                Err(AppError::Db(diesel::result::Error::BrokenTransactionManager)) => {}
                other => panic!("a cancelled connection must refuse new work, got {other:?}"),
            }
        }
        drop(conn);
        let (effect, claim) = effects_and_claims(&mut observer, "async.record", &id).await;
        assert_eq!(
            effect, claim,
            "{written:?}: claim and effect together (after {polls} waits)"
        );
        let mut conn = AsyncPgConnection::establish(db.url()).await.unwrap();
        let redelivered = written.deliver(&mut conn, &msg).await.expect("redelivered");
        assert!(
            matches!(redelivered, Outcome::Processed(0) | Outcome::Duplicate),
            "{redelivered:?}"
        );
        assert_eq!(
            effects(&mut observer, &id).await,
            1,
            "{written:?}: once (after {polls} waits)"
        );
        if finished {
            assert!(polls > 1, "cancelled at the claim's flight at least");
            break;
        }
    }
}

async fn cancelling_a_pipelined_delivery_at_every_await_point_leaves_nothing_half_done() {
    cancelling_at_every_await_point_leaves_nothing_half_done(Written::ForTheType).await;
}

async fn cancelling_a_generic_handlers_delivery_at_every_await_point_leaves_nothing_half_done() {
    cancelling_at_every_await_point_leaves_nothing_half_done(Written::Generic).await;
}

/// A body's error and a body's panic roll back the claim with the effect,
/// written either way, and a delivery nested in a transaction of the
/// caller's becomes a savepoint that the caller's rollback undoes: the
/// message is then processed once.
async fn failures_and_nesting_roll_back_written_either_way() {
    use futures_util::FutureExt;

    let Some((_db, mut conn)) = Postgres::open_async_with_effects(EFFECTS_DDL).await else {
        return;
    };
    for written in [Written::ForTheType, Written::Generic] {
        let failing = Msg::new(format!("fails-{written:?}")).failing();
        let error = written.deliver(&mut conn, &failing).await;
        assert!(matches!(error, Err(AppError::Failed(_))), "{error:?}");
        let panicking = Msg::new(format!("panics-{written:?}")).panicking();
        let caught = std::panic::AssertUnwindSafe(written.deliver(&mut conn, &panicking))
            .catch_unwind()
            .await;
        assert!(caught.is_err(), "{written:?}: the panic is resumed");
        let nested = Msg::new(format!("nested-{written:?}"));
        let outer = conn
            .transaction(async |conn| {
                assert_eq!(written.deliver(conn, &nested).await?, Outcome::Processed(0));
                Err::<(), AppError>(AppError::Failed("the caller rolls back"))
            })
            .await;
        assert!(outer.is_err());
        for id in ["fails", "panics", "nested"] {
            let id = format!("{id}-{written:?}");
            let msg = Msg::new(id.clone());
            assert_eq!(claims(&mut conn, "async.record", &id).await, 0, "{id}");
            assert_eq!(effects(&mut conn, &id).await, 0, "{id}");
            let outcome = written.deliver(&mut conn, &msg).await.expect("redelivered");
            assert_eq!(outcome, Outcome::Processed(0), "{id}");
            assert_eq!(effects(&mut conn, &id).await, 1, "{id}");
        }
    }
}

/// A charge with its payload, answered with a stored receipt.
#[cfg(feature = "serde")]
struct Charge {
    key: String,
    body: Vec<u8>,
}

#[cfg(feature = "serde")]
#[inbox_runtime::idempotent(
    id = req.key,
    handler = "async.pipelined_charge",
    fingerprint = req.body,
    store_result
)]
async fn charge(
    conn: &mut AsyncPgConnection,
    req: &Charge,
) -> Result<inbox_runtime::StoredOutcome<String>, inbox_runtime::InboxError> {
    crate::handlers::write_effect(conn, &req.key, 0).await?;
    Ok(inbox_runtime::StoredOutcome::Processed(format!(
        "receipt of {} bytes",
        req.body.len()
    )))
}

/// A fingerprinted handler that stores its result: its claim, sent with
/// the `BEGIN`, reads what the claim it meets stored, so a duplicate gets
/// the stored receipt in the same two round trips as a plain duplicate,
/// and a copy with another payload the typed conflict.
#[cfg(feature = "serde")]
async fn a_pipelined_duplicate_reads_its_stored_result_with_the_claim() {
    let Some(mut counted) = counted::<Postgres>().await else {
        return;
    };
    let request = |key: &str, body: &[u8]| Charge {
        key: key.to_owned(),
        body: body.to_vec(),
    };
    // Warm up: every statement prepared and cached.
    for round in 0..2 {
        let req = request(&format!("warm-{round}"), b"abc");
        let processed = charge(&mut counted.conn, &req).await.expect("processed");
        let duplicate = charge(&mut counted.conn, &req).await.expect("duplicate");
        assert_eq!(processed.value(), duplicate.value());
    }
    let req = request("charge-1", b"abc");
    let (processed, _) = flights(&counted.proxy, charge(&mut counted.conn, &req)).await;
    assert_eq!(
        processed.expect("processed"),
        inbox_runtime::StoredOutcome::Processed("receipt of 3 bytes".to_owned())
    );
    let (duplicate, duplicate_flights) =
        flights(&counted.proxy, charge(&mut counted.conn, &req)).await;
    assert_eq!(
        duplicate.expect("duplicate").value().as_deref(),
        Some("receipt of 3 bytes"),
        "the stored receipt"
    );
    assert_eq!(
        duplicate_flights, 2,
        "BEGIN + the reading claim, the commit"
    );
    let (conflict, _) = flights(
        &counted.proxy,
        charge(&mut counted.conn, &request("charge-1", b"xyz")),
    )
    .await;
    match conflict {
        Err(inbox_runtime::InboxError::Conflict(_)) => {}
        other => panic!("another payload under the same key: {other:?}"),
    }
    assert_eq!(effects(&mut counted.direct, "charge-1").await, 1);
}

/// One test per function above, on a current-thread runtime.
macro_rules! tests {
    ($($(#[$attribute:meta])* $test:ident),+ $(,)?) => {
        mod postgres {
            $(
                $(#[$attribute])*
                #[test]
                fn $test() {
                    inbox_tests::runtime::current_thread().block_on(super::$test())
                }
            )+
        }
    };
}

tests!(
    an_async_pg_handler_sends_begin_in_one_flight_with_its_claim,
    the_pipelined_claim_refuses_to_run_outside_its_transaction_block,
    a_failed_pipelined_begin_fails_the_delivery_and_claims_nothing,
    a_claim_sent_with_a_begin_the_server_refused_writes_nothing,
    cancelling_a_pipelined_delivery_at_every_await_point_leaves_nothing_half_done,
    cancelling_a_generic_handlers_delivery_at_every_await_point_leaves_nothing_half_done,
    failures_and_nesting_roll_back_written_either_way,
    #[cfg(feature = "serde")]
    a_pipelined_duplicate_reads_its_stored_result_with_the_claim,
);
