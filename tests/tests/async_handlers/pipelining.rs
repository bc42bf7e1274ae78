//! A handler whose connection is an `AsyncPgConnection` sends its `BEGIN`
//! in one flight with the claim, and that claim can never commit on its
//! own: counted on the wire through the harness proxy, on the real server.

use diesel::QueryResult;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use inbox_runtime::{ClaimKey, HandlerName, Outcome, PipelinedClaimStatement};
use inbox_tests::proxy::Proxy;
use inbox_tests::{Postgres, ServerBackend, TestBackend};

use crate::handlers::{EFFECTS_DDL, Msg, record_generic, record_pg};
use crate::support::{claims, effects};

/// Round trips of one delivery through `proxy`.
async fn flights<T>(proxy: &Proxy, delivery: impl Future<Output = T>) -> (T, u64) {
    let before = proxy.flights();
    let result = delivery.await;
    (result, proxy.flights() - before)
}

/// The same handler written for `AsyncPgConnection` and for any connection:
/// the first sends one round trip fewer for a processed message and for a
/// duplicate, which costs it two (`BEGIN` + claim, the commit).
async fn an_async_pg_handler_sends_begin_in_one_flight_with_its_claim() {
    let Some((db, mut direct)) = Postgres::open_async_with_effects(EFFECTS_DDL).await else {
        return;
    };
    let (template, upstream) = Proxy::split_url(db.url(), Postgres::DEFAULT_PORT);
    let proxy = Proxy::start(&upstream);
    let mut conn = AsyncPgConnection::establish(&proxy.url(&template))
        .await
        .expect("connect through the proxy");
    // Warm up both handlers: every statement prepared and cached.
    for round in 0..2 {
        let msg = Msg::new(format!("warm-{round}"));
        assert_eq!(
            record_pg(&mut conn, &msg).await.unwrap(),
            Outcome::Processed(0)
        );
        assert_eq!(
            record_pg(&mut conn, &msg).await.unwrap(),
            Outcome::Duplicate
        );
        let msg = Msg::new(format!("warm-generic-{round}"));
        assert_eq!(
            record_generic(&mut conn, &msg).await.unwrap(),
            Outcome::Processed(0)
        );
        assert_eq!(
            record_generic(&mut conn, &msg).await.unwrap(),
            Outcome::Duplicate
        );
    }

    let pipelined = Msg::new("pipelined");
    let (outcome, processed) = flights(&proxy, record_pg(&mut conn, &pipelined)).await;
    assert_eq!(outcome.expect("processed"), Outcome::Processed(0));
    let (outcome, duplicate) = flights(&proxy, record_pg(&mut conn, &pipelined)).await;
    assert_eq!(outcome.expect("duplicate"), Outcome::Duplicate);

    let sequential = Msg::new("sequential");
    let (outcome, generic_processed) =
        flights(&proxy, record_generic(&mut conn, &sequential)).await;
    assert_eq!(outcome.expect("processed"), Outcome::Processed(0));
    let (outcome, generic_duplicate) =
        flights(&proxy, record_generic(&mut conn, &sequential)).await;
    assert_eq!(outcome.expect("duplicate"), Outcome::Duplicate);

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
    for id in ["pipelined", "sequential"] {
        assert_eq!(effects(&mut direct, id).await, 1, "{id}: one effect");
        assert_eq!(
            claims(&mut direct, "async.record", id).await,
            1,
            "{id}: one claim"
        );
    }
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
    for bound in [None, Some(std::time::Duration::from_secs(2))] {
        let outside: QueryResult<usize> = PipelinedClaimStatement::new(&key, bound)
            .execute(&mut conn)
            .await;
        let error = outside
            .expect_err("refused outside a transaction")
            .to_string();
        assert!(
            error.contains("inbox.claim refused: no transaction block"),
            "bound {bound:?}: {error}"
        );
        conn.batch_execute("BEGIN").await.unwrap();
        let inside_another: QueryResult<usize> = PipelinedClaimStatement::new(&key, bound)
            .execute(&mut conn)
            .await;
        conn.batch_execute("ROLLBACK").await.unwrap();
        let error = inside_another
            .expect_err("refused in a block the pipelined begin did not open")
            .to_string();
        assert!(
            error.contains("inbox.claim refused: no transaction block"),
            "bound {bound:?}: {error}"
        );
    }
    assert_eq!(claims(&mut conn, "async.guarded", "m-1").await, 0);
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

/// One test per function above, on a current-thread runtime.
macro_rules! tests {
    ($($test:ident),+ $(,)?) => {
        mod postgres {
            $(
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
);
