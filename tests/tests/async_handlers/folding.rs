//! A handler on a diesel-async MySQL/MariaDB connection sends its claim in
//! one text with the begin (diesel-async sends a text of several statements
//! in one round trip, where the prepared claim costs one of its own):
//! counted on the wire through the harness proxy, on the real server, with
//! the failures of that text (a begin the server refused, a claim that
//! failed after the begin ran) and keys no quoting could carry.

use diesel_async::{AsyncMysqlConnection, SimpleAsyncConnection};
use inbox_runtime::Outcome;
use inbox_tests::{AsyncSqlRows, Mysql, TestBackend};

use crate::handlers::{EFFECTS_DDL, Msg, record, write_effect};
use crate::support::{Counted, claims, counted, effects, flights};

/// A duplicate costs two round trips (the begin and claim, the commit), a
/// processed message those two and its body's.
async fn the_claim_travels_in_one_text_with_the_begin() {
    let Some(mut counted) = counted::<Mysql>().await else {
        return;
    };
    for round in 0..2 {
        let warm = Msg::new(format!("warm-{round}"));
        assert_eq!(
            record(&mut counted.conn, &warm).await.unwrap(),
            Outcome::Processed(0)
        );
        assert_eq!(
            record(&mut counted.conn, &warm).await.unwrap(),
            Outcome::Duplicate
        );
    }
    let (written, body) = flights(
        &counted.proxy,
        write_effect(&mut counted.conn, "body-alone", 0),
    )
    .await;
    written.expect("the body's statement alone");
    let msg = Msg::new("counted");
    let (outcome, processed) = flights(&counted.proxy, record(&mut counted.conn, &msg)).await;
    assert_eq!(outcome.unwrap(), Outcome::Processed(0));
    let (outcome, duplicate) = flights(&counted.proxy, record(&mut counted.conn, &msg)).await;
    assert_eq!(outcome.unwrap(), Outcome::Duplicate);
    println!("round trips: body {body}, processed {processed}, duplicate {duplicate}");
    assert_eq!(duplicate, 2, "a duplicate: the begin and claim, the commit");
    assert_eq!(
        processed,
        2 + body,
        "a processed message: the begin and claim, the body's {body}, the commit"
    );
    assert_eq!(effects(&mut counted.direct, "counted").await, 1);
    assert_eq!(
        claims(&mut counted.direct, "async.record", "counted").await,
        1
    );
}

/// The key travels as hex literals: quotes, backslashes (read literally
/// where the session says `NO_BACKSLASH_ESCAPES`, escapes otherwise), a
/// statement's end and characters beyond ASCII are claimed as they are,
/// once. (The suite's own statements quote ids by doubling `'` only, so
/// backslashes are delivered where the session reads them literally.)
async fn a_key_no_quoting_could_carry_is_claimed_as_it_is() {
    let Some((_db, mut conn)) = Mysql::open_async_with_effects(EFFECTS_DDL).await else {
        return;
    };
    let ids = [
        "it's",
        "\"double\"",
        "x'); DROP TABLE inbox_messages; --",
        "naïve—ünïcødé ✓",
        "0x41",
    ];
    let literal_backslashes = ["back\\slash\\", "\\'); --"];
    let mut delivered = 0;
    for (sql_mode, backslashes) in [
        ("", &[][..]),
        ("NO_BACKSLASH_ESCAPES,ANSI_QUOTES", &literal_backslashes[..]),
    ] {
        conn.batch_execute(&format!("SET SESSION sql_mode = '{sql_mode}'"))
            .await
            .unwrap();
        for id in ids.iter().chain(backslashes) {
            let id = format!("{sql_mode}:{id}");
            let msg = Msg::new(id.clone());
            assert_eq!(
                record(&mut conn, &msg).await.unwrap(),
                Outcome::Processed(0),
                "{id}"
            );
            assert_eq!(
                record(&mut conn, &msg).await.unwrap(),
                Outcome::Duplicate,
                "{id}"
            );
            assert_eq!(claims(&mut conn, "async.record", &id).await, 1, "{id}");
            assert_eq!(effects(&mut conn, &id).await, 1, "{id}");
            delivered += 1;
        }
    }
    conn.batch_execute("SET SESSION sql_mode = DEFAULT")
        .await
        .unwrap();
    let all: i64 = conn
        .bigint("SELECT COUNT(*) AS value FROM inbox_messages")
        .await;
    assert_eq!(all, delivered, "no other row");
}

/// A begin the server refuses (the proxy corrupts the savepoint into a
/// syntax error: the `SET` before it ran, turning `autocommit` off) stops
/// the text before the claim: the delivery fails with the begin's error,
/// nothing is claimed or written, the session is as it was, and the
/// redelivery is processed once.
async fn a_refused_begin_stops_the_text_before_its_claim() {
    let Some(mut counted) = counted::<Mysql>().await else {
        return;
    };
    let warm = Msg::new("warm");
    assert_eq!(
        record(&mut counted.conn, &warm).await.unwrap(),
        Outcome::Processed(0)
    );
    refused_begin_is_retried_cleanly(
        &mut counted,
        "begin-refused",
        (
            b"SAVEPOINT inbox_transaction; ",
            b"SAVEPOINX inbox_transaction; ",
        ),
        "SAVEPOINX",
    )
    .await;
}

/// A claim that fails after its begin ran (the id's row is held by a
/// transaction that does not end, past the claim's wait): the level is
/// rolled back, the session restored, and the delivery answers that a copy
/// is in flight, without a trace.
async fn a_claim_that_fails_after_its_begin_leaves_the_session_as_it_was() {
    let Some((db, mut conn)) = Mysql::open_async_with_effects(EFFECTS_DDL).await else {
        return;
    };
    let mut holder = db.connect_async().await;
    holder
        .batch_execute(
            "SET SESSION autocommit = 0; \
             INSERT INTO inbox_messages (handler, message_id) VALUES ('async.record', 'held')",
        )
        .await
        .unwrap();
    let error = record(&mut conn, &Msg::new("held"))
        .await
        .expect_err("the claim waited past its bound")
        .to_string();
    assert!(error.contains("still in flight"), "{error}");
    assert_session_restored(&mut conn).await;
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        record(&mut conn, &Msg::new("held")).await.unwrap(),
        Outcome::Processed(0)
    );
    assert_eq!(claims(&mut conn, "async.record", "held").await, 1);
    assert_eq!(effects(&mut conn, "held").await, 1);
}

/// The claim sent with the begin writes no claim token: an inbox whose
/// claim-token migration has not run takes it as it is, in the same round
/// trips (a claim that wrote the token would be refused there and claim
/// again, one round trip more).
async fn an_inbox_without_the_claim_token_column_takes_the_claim_sent_with_the_begin() {
    let Some(mut counted) = counted::<Mysql>().await else {
        return;
    };
    counted
        .direct
        .batch_execute("ALTER TABLE inbox_messages DROP COLUMN claim_token")
        .await
        .unwrap();
    let warm = Msg::new("warm");
    assert_eq!(
        record(&mut counted.conn, &warm).await.unwrap(),
        Outcome::Processed(0)
    );
    let (written, body) = flights(
        &counted.proxy,
        write_effect(&mut counted.conn, "body-alone", 0),
    )
    .await;
    written.expect("the body's statement alone");
    let msg = Msg::new("no-token");
    let (outcome, processed) = flights(&counted.proxy, record(&mut counted.conn, &msg)).await;
    assert_eq!(outcome.unwrap(), Outcome::Processed(0));
    let (outcome, duplicate) = flights(&counted.proxy, record(&mut counted.conn, &msg)).await;
    assert_eq!(outcome.unwrap(), Outcome::Duplicate);
    assert_eq!(duplicate, 2, "the begin and claim, the commit");
    assert_eq!(
        processed,
        2 + body,
        "the begin and claim, the body's {body}, the commit"
    );
    assert_eq!(
        claims(&mut counted.direct, "async.record", "no-token").await,
        1
    );
    assert_eq!(effects(&mut counted.direct, "no-token").await, 1);
    assert_session_restored(&mut counted.conn).await;
}

/// A text whose first statement the server refuses (the proxy corrupts the
/// `SET` that begins it, on a new session, which never saved a value of
/// its own yet) ran nothing: the rollback restores nothing it did not
/// save, the connection goes on, and the redelivery is processed once.
async fn a_text_refused_at_its_first_statement_leaves_a_new_session_usable() {
    let Some(mut counted) = counted::<Mysql>().await else {
        return;
    };
    refused_begin_is_retried_cleanly(
        &mut counted,
        "set-refused",
        (
            b"SET @inbox_saved_wait_timeout",
            b"SEX @inbox_saved_wait_timeout",
        ),
        "SEX",
    )
    .await;
}

/// Delivers message `id` with its begin corrupted on the way by `from` →
/// `to` (the next text holding `from`): the delivery fails with the
/// server's error, which quotes `marker`; nothing is claimed or written,
/// the session is as it was, and the redelivery on the same connection is
/// processed once.
async fn refused_begin_is_retried_cleanly(
    counted: &mut Counted<Mysql>,
    id: &str,
    (from, to): (&[u8], &[u8]),
    marker: &str,
) {
    let msg = Msg::new(id);
    counted.proxy.corrupt_next(from, to);
    let error = record(&mut counted.conn, &msg)
        .await
        .expect_err("the begin was refused")
        .to_string();
    assert!(
        !counted.proxy.corruption_pending(),
        "the begin went through the proxy"
    );
    assert!(error.contains(marker), "the begin's own error: {error}");
    assert_eq!(claims(&mut counted.direct, "async.record", id).await, 0);
    assert_eq!(effects(&mut counted.direct, id).await, 0);
    assert_session_restored(&mut counted.conn).await;
    assert_eq!(
        record(&mut counted.conn, &msg).await.expect("redelivered"),
        Outcome::Processed(0)
    );
    assert_eq!(claims(&mut counted.direct, "async.record", id).await, 1);
    assert_eq!(effects(&mut counted.direct, id).await, 1);
}

/// No transaction open, `autocommit` on and the idle bound the session had.
async fn assert_session_restored(conn: &mut AsyncMysqlConnection) {
    let state: i64 = conn
        .bigint(
            "SELECT @@in_transaction * 100 + @@autocommit * 10 \
             + (@@wait_timeout = @@GLOBAL.wait_timeout) AS value",
        )
        .await;
    assert_eq!(
        state, 11,
        "no transaction (hundreds), autocommit (tens), wait_timeout (units)"
    );
}

/// One test per function above, on a current-thread runtime.
macro_rules! tests {
    ($($test:ident),+ $(,)?) => {
        mod mysql {
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
    the_claim_travels_in_one_text_with_the_begin,
    a_key_no_quoting_could_carry_is_claimed_as_it_is,
    a_refused_begin_stops_the_text_before_its_claim,
    a_claim_that_fails_after_its_begin_leaves_the_session_as_it_was,
    an_inbox_without_the_claim_token_column_takes_the_claim_sent_with_the_begin,
    a_text_refused_at_its_first_statement_leaves_a_new_session_usable,
);
