//! A failure whose text the database's encoding cannot store (a PostgreSQL
//! database in LATIN1, an error text with a euro sign): the failure is
//! still recorded, its text with every character the encoding may lack
//! written as `\u{…}`, so a rejection is dead at once and attempts count
//! towards the limit instead of being lost on every delivery.

use diesel::connection::SimpleConnection;
use inbox_runtime::{AckDecision, InboxError, ack_decision};
use inbox_tests::failure_rows::failure_row;
use inbox_tests::{PgEncodedDatabase, Postgres};

use crate::handlers::*;
use crate::support::*;

#[test]
fn a_failure_text_the_encoding_cannot_store_is_recorded_escaped() {
    let Some(db) = PgEncodedDatabase::create("LATIN1") else {
        return;
    };
    let mut conn = db.connect();
    conn.batch_execute(EFFECTS_DDL).expect("the effects table");

    let rejected = three(
        &mut conn,
        &Msg::rejecting("enc-1", "a price in € is refused"),
    );
    assert!(
        matches!(rejected, Err(AppError::Inbox(InboxError::Rejected { .. }))),
        "{rejected:?}"
    );
    assert_eq!(ack_decision(&rejected), AckDecision::DeadLetter);
    let row = failure_row::<Postgres>(&mut conn, THREE, "enc-1").expect("recorded");
    assert!(row.rejected && row.dead, "{row:?}");
    assert!(
        row.last_error.contains("a price in \\u{20ac} is refused"),
        "{row:?}"
    );

    for attempt in 1..=3 {
        let failed = three(&mut conn, &Msg::failing("enc-2", "no € today"));
        assert!(failed.is_err(), "{failed:?}");
        let row = failure_row::<Postgres>(&mut conn, THREE, "enc-2").expect("counted");
        assert_eq!(row.attempts, attempt, "{row:?}");
        assert!(row.last_error.contains("no \\u{20ac} today"), "{row:?}");
        assert_eq!(row.dead, attempt == 3, "{row:?}");
    }
    let late = Msg::succeeding("enc-2");
    three(&mut conn, &late).expect("dead: a duplicate");
    assert_eq!(late.runs(), 0);
}

/// The async runner records the same way.
#[cfg(feature = "async")]
#[test]
fn an_async_failure_text_the_encoding_cannot_store_is_recorded_escaped() {
    use crate::handlers_async::three_async;

    let Some(db) = PgEncodedDatabase::create("LATIN1") else {
        return;
    };
    let mut observer = db.connect();
    observer
        .batch_execute(EFFECTS_DDL)
        .expect("the effects table");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(async {
            let mut conn = db.connect_async().await;
            let rejected = three_async(&mut conn, &Msg::rejecting("aenc-1", "€ refused")).await;
            assert_eq!(
                ack_decision(&rejected),
                AckDecision::DeadLetter,
                "{rejected:?}"
            );
            for attempt in 1..=2 {
                let failed = three_async(&mut conn, &Msg::failing("aenc-2", "no €")).await;
                assert!(failed.is_err(), "{failed:?}");
                let row = failure_row::<Postgres>(&mut observer, THREE, "aenc-2").expect("counted");
                assert_eq!(row.attempts, attempt, "{row:?}");
            }
        });
    let row = failure_row::<Postgres>(&mut observer, THREE, "aenc-1").expect("recorded");
    assert!(
        row.rejected && row.last_error.contains("\\u{20ac} refused"),
        "{row:?}"
    );
}
