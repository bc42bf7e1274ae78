//! The async handlers (diesel-async): conflicts, replays and the bound of
//! stored results, as the blocking ones. Read back on a blocking observer
//! connection.

use diesel::connection::SimpleConnection;
use inbox_runtime::{
    AckDecision, InboxError, MAX_STORED_RESULT_BYTES, Outcome, StoredResultProblem, ack_decision,
};
use inbox_tests::{AppError, SqlRows, TestBackend};

use crate::handlers::*;
use crate::handlers_async::*;
use crate::support::*;

pub async fn async_conflicts_and_replays<B: TestBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect_async().await;
    assert_eq!(
        transfer_async(&mut conn, &Transfer::new("a-1", "x"))
            .await
            .unwrap(),
        Outcome::Processed(())
    );
    let same = Transfer::new("a-1", "x");
    assert_eq!(
        transfer_async(&mut conn, &same).await.unwrap(),
        Outcome::Duplicate
    );
    let changed = Transfer::new("a-1", "y");
    let result = transfer_async(&mut conn, &changed).await;
    assert!(
        matches!(result, Err(AppError::Inbox(InboxError::Conflict(_)))),
        "{result:?}"
    );
    assert_eq!(ack_decision(&result), AckDecision::DeadLetter);
    assert_eq!(same.runs() + changed.runs(), 0);

    let first = charge_async(&mut conn, &Charge::new("a-2", 3))
        .await
        .unwrap();
    let retry = Charge::new("a-2", 3);
    let replayed = charge_async(&mut conn, &retry).await.unwrap();
    assert!(first.is_processed() && replayed.is_replayed());
    assert_eq!(first.value(), replayed.value());
    assert_eq!(retry.runs(), 0);
    // The async handler reads what the blocking one stored, and back.
    assert!(
        charge(&mut observer, &Charge::new("a-2", 3))
            .unwrap()
            .is_replayed()
    );
    assert!(
        charge(&mut observer, &Charge::new("a-3", 4))
            .unwrap()
            .is_processed()
    );
    assert!(
        charge_async(&mut conn, &Charge::new("a-3", 4))
            .await
            .unwrap()
            .is_replayed()
    );

    let mut big = Charge::new("a-4", 1);
    big.note_len = MAX_STORED_RESULT_BYTES;
    let result = charge_async(&mut conn, &big).await;
    assert!(
        matches!(
            &result,
            Err(AppError::Inbox(InboxError::StoredResult {
                problem: StoredResultProblem::TooLarge { .. },
                ..
            }))
        ),
        "{result:?}"
    );
    assert_eq!(big.runs(), 1);
    assert_eq!(claims(&mut observer, CHARGE, "a-4"), 0);
    assert_eq!(applied(&mut observer, "a-4"), Vec::<String>::new());
    assert_eq!(all_effects(&mut observer), 3);
    assert_eq!(
        observer.bigint("SELECT COUNT(*) AS value FROM inbox_failures"),
        0,
        "a result the inbox cannot store is no failed attempt of the body"
    );
}

/// The async twin of `a_panicking_result_encoder_is_a_panicking_delivery`:
/// rolled back, counted and resumed, and the connection delivers the next
/// message (it is not left refused as a dropped delivery's is).
pub async fn async_panicking_result_encoder_is_a_panicking_delivery<B: TestBackend>() {
    use futures_util::FutureExt;
    use inbox_tests::failure_rows::failure_row;
    use std::panic::AssertUnwindSafe;

    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect_async().await;
    for attempt in 1..=2 {
        let req = Charge::new("a-6", 6);
        let delivered = AssertUnwindSafe(panicking_receipt_async(&mut conn, &req))
            .catch_unwind()
            .await;
        assert!(delivered.is_err(), "the encoder's panic is resumed");
        assert_eq!(req.runs(), 1);
        assert_eq!(all_effects(&mut observer), 0, "its effect rolled back");
        let row = failure_row::<B>(&mut observer, PANICKING_RECEIPT, "a-6").expect("counted");
        assert_eq!(row.attempts, attempt, "{row:?}");
        assert!(row.last_error.contains("encoder panicked"), "{row:?}");
        // Dead at the limit: its claim is kept (no effect) and the message
        // is a duplicate from then on.
        assert_eq!(row.dead, attempt == 2, "{row:?}");
        let claimed = i64::from(attempt == 2);
        assert_eq!(claims(&mut observer, PANICKING_RECEIPT, "a-6"), claimed);
    }
    let late = Charge::new("a-6", 6);
    let result = panicking_receipt_async(&mut conn, &late).await;
    assert_eq!(ack_decision(&result), AckDecision::Ack, "{result:?}");
    assert_eq!(late.runs(), 0, "dead: its body no longer runs");
    assert!(
        charge_async(&mut conn, &Charge::new("a-7", 7))
            .await
            .unwrap()
            .is_processed()
    );
    assert_eq!(applied(&mut observer, "a-7"), ["7"]);
}

/// On diesel-async connections MariaDB's claim reads what the claim it
/// met stored (`INSERT … ON DUPLICATE KEY UPDATE … RETURNING`, whose
/// columns the server describes once it has run it: diesel-async reads
/// them then, Diesel's blocking connection before): a fingerprinted
/// duplicate and a stored result's execute one statement, the claim, as a
/// plain duplicate does, between the begin and the commit (texts, one
/// `SET` each: the idle bound is set and restored in them).
pub async fn async_a_duplicate_reads_the_stored_claim_in_its_claim<B: TestBackend>() {
    let Some((db, _observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect_async().await;
    let [fingerprinted, stored] = async_duplicates_cost(&mut conn).await;
    assert_eq!(fingerprinted, [2, 0, 1], "a fingerprinted duplicate");
    assert_eq!(stored, [2, 0, 1], "a stored result's duplicate");
}

/// On an inbox whose claim-token migration has not run, the async reading
/// claim is refused when prepared; the duplicate claims without the token
/// and reads the stored claim with a statement of its own.
pub async fn async_without_claim_tokens_a_duplicate_reads_the_stored_claim_on_its_own<
    B: TestBackend,
>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    observer
        .batch_execute("ALTER TABLE inbox_messages DROP COLUMN claim_token")
        .expect("an inbox from before the claim token");
    let mut conn = db.connect_async().await;
    let [fingerprinted, stored] = async_duplicates_cost(&mut conn).await;
    assert_eq!(fingerprinted, [2, 1, 2], "a fingerprinted duplicate");
    assert_eq!(stored, [2, 1, 2], "a stored result's duplicate");
}

/// What a duplicate of a fingerprinted message and one of a stored
/// result's request cost an async connection, once each was delivered
/// and redelivered: `[set option, prepare, execute]`.
async fn async_duplicates_cost<C>(conn: &mut C) -> [[i64; 3]; 2]
where
    C: diesel_async::AsyncConnection<Backend: inbox_runtime::InboxBackend>
        + inbox_tests::AsyncSqlRows,
{
    let first = Transfer::new("tpa-1", "amount=1");
    assert_eq!(
        transfer_async(conn, &first).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(
        transfer_async(conn, &first).await.unwrap(),
        Outcome::Duplicate
    );
    let charge = Charge::new("tpa-2", 5);
    assert!(charge_async(conn, &charge).await.unwrap().is_processed());
    assert!(charge_async(conn, &charge).await.unwrap().is_replayed());
    let fingerprinted = inbox_tests::mysql_commands_of_async(conn, async |conn| {
        assert_eq!(
            transfer_async(conn, &first).await.unwrap(),
            Outcome::Duplicate
        );
    })
    .await;
    let stored = inbox_tests::mysql_commands_of_async(conn, async |conn| {
        assert!(charge_async(conn, &charge).await.unwrap().is_replayed());
    })
    .await;
    assert_eq!(first.runs() + charge.runs(), 2, "one body each");
    [fingerprinted, stored]
}

inbox_tests::backend_tests! {
    async async_conflicts_and_replays, async_panicking_result_encoder_is_a_panicking_delivery;
    async only [mysql]: async_a_duplicate_reads_the_stored_claim_in_its_claim,
        async_without_claim_tokens_a_duplicate_reads_the_stored_claim_on_its_own;
}
