//! The generation layout (PostgreSQL): a claim in an archived generation
//! keeps its fingerprint and result, so a changed payload is a conflict
//! and a retry is answered with the stored result after rotations; new
//! generation tables have the columns; converting back keeps both.

use std::time::Duration;

use diesel::PgConnection;
use inbox_runtime::prune::partitioned;
use inbox_runtime::{InboxError, Outcome, StoredOutcome};
use inbox_tests::{AppError, Postgres};

use crate::handlers::*;
use crate::support::*;

const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

fn partitioned_db() -> Option<(Postgres, PgConnection)> {
    let (db, mut conn) = fresh::<Postgres>()?;
    partitioned::setup(&mut conn).expect("convert to the generation layout");
    partitioned::setup(&mut conn).expect("and again, harmlessly");
    Some((db, conn))
}

fn assert_archived_claims_answer(conn: &mut PgConnection, effects: i64) {
    let changed = transfer(conn, &Transfer::new("p-1", "amount=2"));
    assert!(
        matches!(changed, Err(AppError::Inbox(InboxError::Conflict(_)))),
        "{changed:?}"
    );
    assert_eq!(
        transfer(conn, &Transfer::new("p-1", "amount=1")).unwrap(),
        Outcome::Duplicate
    );
    let retry = Charge::new("p-2", 5);
    let replayed = charge(conn, &retry).unwrap();
    assert!(replayed.is_replayed(), "{replayed:?}");
    assert_eq!(replayed.value().map(|receipt| receipt.amount), Some(5));
    assert_eq!(retry.runs(), 0);
    assert_eq!(all_effects(conn), effects);
}

#[test]
fn archived_claims_keep_their_fingerprint_and_result() {
    let Some((_db, mut conn)) = partitioned_db() else {
        return;
    };
    assert!(
        transfer(&mut conn, &Transfer::new("p-1", "amount=1"))
            .unwrap()
            .is_processed()
    );
    assert!(
        charge(&mut conn, &Charge::new("p-2", 5))
            .unwrap()
            .is_processed()
    );
    // Two rotations: the claims sit in an archived generation, and the
    // current table is one the layout's function created.
    assert_eq!(partitioned::rotate(&mut conn, LOCK_TIMEOUT).unwrap(), 2);
    assert_eq!(partitioned::rotate(&mut conn, LOCK_TIMEOUT).unwrap(), 3);
    assert_eq!(claims(&mut conn, TRANSFER, "p-1"), 0, "no longer current");
    assert_archived_claims_answer(&mut conn, 2);
    // A claim in the new current table stores both columns.
    assert_eq!(
        charge(&mut conn, &Charge::new("p-3", 6)).unwrap(),
        StoredOutcome::Processed(Receipt {
            request_id: "p-3".into(),
            amount: 6,
            note: "nnnn".into()
        })
    );
    assert_eq!(stored_columns(&mut conn, CHARGE, "p-3"), (1, 1));
    // Back to the plain layout: the archived claims come back whole.
    partitioned::teardown(&mut conn).expect("back to the plain layout");
    assert_eq!(stored_columns(&mut conn, TRANSFER, "p-1"), (1, 0));
    assert_eq!(stored_columns(&mut conn, CHARGE, "p-2"), (1, 1));
    assert_archived_claims_answer(&mut conn, 3);
}
