//! One delivery at a time: the same payload is a duplicate, another payload
//! a conflict that runs nothing, writes nothing and dead-letters; claims
//! without a fingerprint match any; a serde payload's fingerprint does not
//! depend on a map's order.

use inbox_runtime::{
    AckDecision, Claim, ClaimKey, Fingerprint, HandlerName, InboxError, Outcome, PayloadConflict,
    ack_decision, claim, run_idempotent_batch,
};
use inbox_tests::{AppError, SqlRows, TestBackend, statement_shapes as shape, statements_of};

use crate::handlers::*;
use crate::support::*;

pub fn the_same_payload_is_a_duplicate_and_another_a_conflict<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let first = Transfer::new("t-1", "amount=250");
    assert_eq!(transfer(&mut conn, &first).unwrap(), Outcome::Processed(()));
    assert_eq!(stored_columns(&mut conn, TRANSFER, "t-1"), (1, 0));

    let again = Transfer::new("t-1", "amount=250");
    assert_eq!(transfer(&mut conn, &again).unwrap(), Outcome::Duplicate);
    assert_eq!(again.runs(), 0);

    let changed = Transfer::new("t-1", "amount=9999");
    let result = transfer(&mut conn, &changed);
    let Err(AppError::Inbox(InboxError::Conflict(conflict))) = &result else {
        panic!("a conflict expected: {result:?}");
    };
    assert_eq!(
        **conflict,
        PayloadConflict {
            handler: TRANSFER.to_owned(),
            message_id: "t-1".to_owned(),
            stored: Some(Fingerprint::of("amount=250".as_bytes()).unwrap()),
            delivered: Fingerprint::of("amount=9999".as_bytes()).unwrap(),
        }
    );
    let text = result.as_ref().unwrap_err().to_string();
    assert!(text.contains("different payload"), "{text}");
    assert_eq!(ack_decision(&result), AckDecision::DeadLetter);
    assert!(!result.as_ref().unwrap_err().recovery().is_retryable());
    assert_eq!(changed.runs(), 0, "the body did not run");
    assert_eq!(applied(&mut conn, "t-1"), ["amount=250"]);
    assert_eq!(claims(&mut conn, TRANSFER, "t-1"), 1);
    assert_eq!(
        conn.bigint("SELECT COUNT(*) AS value FROM inbox_failures"),
        0,
        "a conflict is not a failed attempt"
    );
    if B::NAME == "mysql" {
        // The refused commit that found the conflict left the session as
        // it was: no transaction open, `autocommit` on.
        assert_eq!(
            conn.bigint("SELECT @@in_transaction * 10 + @@autocommit AS value"),
            1,
            "no transaction (tens), autocommit (units)"
        );
        // Also a session whose `autocommit` is off: the conflict is read
        // before the transaction rolls back, and nothing opens another.
        diesel::connection::SimpleConnection::batch_execute(
            &mut conn,
            "SET SESSION autocommit = 0",
        )
        .unwrap();
        let again = transfer(&mut conn, &Transfer::new("t-1", "amount=9999"));
        assert!(
            matches!(again, Err(AppError::Inbox(InboxError::Conflict(_)))),
            "{again:?}"
        );
        assert_eq!(
            conn.bigint("SELECT @@in_transaction * 10 + @@autocommit AS value"),
            0,
            "no transaction (tens), autocommit off as it was (units)"
        );
        diesel::connection::SimpleConnection::batch_execute(
            &mut conn,
            "SET SESSION autocommit = 1",
        )
        .unwrap();
    }
    // The conflict changed nothing: the original payload is still a duplicate.
    assert_eq!(
        transfer(&mut conn, &Transfer::new("t-1", "amount=250")).unwrap(),
        Outcome::Duplicate
    );
}

pub fn a_claim_without_a_fingerprint_matches_any_payload<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let old = Transfer::new("t-2", "amount=1");
    assert_eq!(
        transfer_unfingerprinted(&mut conn, &old).unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(stored_columns(&mut conn, TRANSFER, "t-2"), (0, 0));
    for body in ["amount=1", "amount=2"] {
        let later = Transfer::new("t-2", body);
        assert_eq!(transfer(&mut conn, &later).unwrap(), Outcome::Duplicate);
        assert_eq!(later.runs(), 0);
    }
    // And a handler without a fingerprint never checks one.
    assert!(
        transfer(&mut conn, &Transfer::new("t-3", "amount=3"))
            .unwrap()
            .is_processed()
    );
    // Stored, though the connection ran claims without a fingerprint before
    // (a prepared statement of the other shape must not be reused).
    assert_eq!(stored_columns(&mut conn, TRANSFER, "t-3"), (1, 0));
    let unchecked = Transfer::new("t-3", "amount=4");
    assert_eq!(
        transfer_unfingerprinted(&mut conn, &unchecked).unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(applied(&mut conn, "t-2"), ["amount=1"]);
    assert_eq!(applied(&mut conn, "t-3"), ["amount=3"]);
}

pub fn a_serde_payload_is_fingerprinted_whatever_its_map_order<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let lines: Vec<(String, u32)> = (0..40).map(|n| (format!("sku-{n}"), n)).collect();
    let forward: Vec<(&str, u32)> = lines.iter().map(|(s, q)| (s.as_str(), *q)).collect();
    let backward: Vec<(&str, u32)> = forward.iter().rev().copied().collect();
    let first = Order::new("o-1", &forward);
    let again = Order::new("o-1", &backward);
    let orders: Vec<&String> = first.lines.keys().collect();
    let agains: Vec<&String> = again.lines.keys().collect();
    assert_ne!(orders, agains, "two maps that iterate in different orders");
    assert_eq!(place(&mut conn, &first).unwrap(), Outcome::Processed(()));
    assert_eq!(place(&mut conn, &again).unwrap(), Outcome::Duplicate);

    let mut changed_lines = backward.clone();
    changed_lines[0].1 += 1;
    let changed = Order::new("o-1", &changed_lines);
    let result = place(&mut conn, &changed);
    assert!(
        matches!(result, Err(AppError::Inbox(InboxError::Conflict(_)))),
        "{result:?}"
    );
    assert_eq!(changed.runs(), 0);
    assert_eq!(all_effects(&mut conn), 1);
}

/// A fingerprinted handler as a batch's body: the batch claims the id, the
/// handler inside finds it claimed for this very message and runs; its
/// fingerprint is stored with the batch's claim all the same, so a later
/// delivery with another payload is a conflict, not a duplicate.
pub fn a_fingerprinted_batch_body_stores_its_fingerprint<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let handler = HandlerName::new(TRANSFER).unwrap();
    let batch = [
        Transfer::new("tb-1", "amount=1"),
        Transfer::new("tb-2", "amount=2"),
    ];
    let report = run_idempotent_batch(&mut conn, &handler, &batch, |m| &m.id, transfer);
    assert_eq!(report.processed(), 2, "{:?}", report.results());
    assert_eq!(stored_columns(&mut conn, TRANSFER, "tb-1"), (1, 0));
    assert_eq!(stored_columns(&mut conn, TRANSFER, "tb-2"), (1, 0));

    let same = Transfer::new("tb-1", "amount=1");
    assert_eq!(transfer(&mut conn, &same).unwrap(), Outcome::Duplicate);
    let changed = Transfer::new("tb-2", "amount=9999");
    let result = transfer(&mut conn, &changed);
    assert!(
        matches!(result, Err(AppError::Inbox(InboxError::Conflict(_)))),
        "{result:?}"
    );
    assert_eq!(same.runs() + changed.runs(), 0);
    assert_eq!(all_effects(&mut conn), 2);
}

/// `claim` with a fingerprinted key, in a transaction of the caller's:
/// the same fingerprint is a duplicate, another one the conflict (as a
/// Diesel error carrying the inbox's, which `recovery` and `ack_decision`
/// read as dead-letter), and nothing changes.
pub fn claim_refuses_another_fingerprint<B: TestBackend>() {
    use diesel::Connection;

    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let key = |body: &str| {
        ClaimKey::new(HandlerName::new(TRANSFER).unwrap(), "tc-1")
            .unwrap()
            .with_fingerprint(Fingerprint::of(body).unwrap())
    };
    let first = conn.transaction(|conn| claim(conn, &key("amount=1")));
    assert_eq!(first.unwrap(), Claim::Claimed);
    let same = conn.transaction(|conn| claim(conn, &key("amount=1")));
    assert_eq!(same.unwrap(), Claim::Duplicate);
    let changed = conn.transaction(|conn| claim(conn, &key("amount=2")));
    let Err(diesel::result::Error::QueryBuilderError(inner)) = &changed else {
        panic!("the conflict expected: {changed:?}");
    };
    assert!(
        matches!(
            inner.downcast_ref::<InboxError>(),
            Some(InboxError::Conflict(_))
        ),
        "{inner:?}"
    );
    assert_eq!(ack_decision(&changed), AckDecision::DeadLetter);
    assert_eq!(claims(&mut conn, TRANSFER, "tc-1"), 1);
}

/// A conflict met by `claim` in a transaction of the caller's fails that
/// claim alone: what the transaction did before stays, the caller can go
/// on and commit, and the claim it met keeps its fingerprint (SQLite's
/// claim compares the fingerprint in the statement that fails).
pub fn a_conflict_leaves_the_caller_s_transaction_going<B: TestBackend>() {
    use diesel::Connection;

    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let key = |id: &str, body: &str| {
        ClaimKey::new(HandlerName::new(TRANSFER).unwrap(), id)
            .unwrap()
            .with_fingerprint(Fingerprint::of(body).unwrap())
    };
    let is_conflict = |answer: &diesel::QueryResult<Claim>| {
        matches!(answer, Err(diesel::result::Error::QueryBuilderError(inner))
            if matches!(inner.downcast_ref::<InboxError>(), Some(InboxError::Conflict(_))))
    };
    let first = conn.transaction(|conn| claim(conn, &key("tk-1", "amount=1")));
    assert_eq!(first.unwrap(), Claim::Claimed);
    let committed = conn.transaction(|conn| {
        assert_eq!(claim(conn, &key("tk-2", "amount=1"))?, Claim::Claimed);
        let changed = claim(conn, &key("tk-1", "amount=2"));
        assert!(is_conflict(&changed), "{changed:?}");
        assert_eq!(claims(conn, TRANSFER, "tk-2"), 1, "the earlier claim stays");
        assert_eq!(claim(conn, &key("tk-1", "amount=1"))?, Claim::Duplicate);
        assert_eq!(claim(conn, &key("tk-3", "amount=3"))?, Claim::Claimed);
        diesel::QueryResult::Ok(())
    });
    committed.unwrap();
    for id in ["tk-1", "tk-2", "tk-3"] {
        assert_eq!(claims(&mut conn, TRANSFER, id), 1, "{id}");
    }
    let again = conn.transaction(|conn| claim(conn, &key("tk-1", "amount=1")));
    assert_eq!(again.unwrap(), Claim::Duplicate);
    let changed = conn.transaction(|conn| claim(conn, &key("tk-1", "amount=2")));
    assert!(is_conflict(&changed), "{changed:?}");
}

/// A new connection's first delivery of each kind meets a claim another
/// connection made: a stored result's duplicate gets the stored receipt, a
/// fingerprinted duplicate is a duplicate, another payload a conflict, and
/// no body runs. (On MariaDB's blocking connection a new connection's first
/// claim that reads what it met runs without reading, and its row is read
/// apart: the path every first delivery of these takes.)
pub fn a_new_connection_s_first_claims_read_what_they_met<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let receipt = charge(&mut conn, &Charge::new("tn-1", 5)).unwrap();
    assert!(receipt.is_processed());
    let first = Transfer::new("tn-2", "amount=1");
    assert_eq!(transfer(&mut conn, &first).unwrap(), Outcome::Processed(()));

    let retry = Charge::new("tn-1", 5);
    let replayed = charge(&mut db.connect(), &retry).unwrap();
    assert!(replayed.is_replayed(), "{replayed:?}");
    assert_eq!(replayed.value(), receipt.value());
    assert_eq!(retry.runs(), 0);

    let again = Transfer::new("tn-2", "amount=1");
    assert_eq!(
        transfer(&mut db.connect(), &again).unwrap(),
        Outcome::Duplicate
    );
    let changed = Transfer::new("tn-2", "amount=2");
    let answer = transfer(&mut db.connect(), &changed);
    assert!(
        matches!(answer, Err(AppError::Inbox(InboxError::Conflict(_)))),
        "{answer:?}"
    );
    let changed_charge = Charge::new("tn-1", 6);
    let answer = charge(&mut db.connect(), &changed_charge);
    assert!(
        matches!(answer, Err(AppError::Inbox(InboxError::Conflict(_)))),
        "{answer:?}"
    );
    assert_eq!(again.runs() + changed.runs() + changed_charge.runs(), 0);
    assert_eq!(applied(&mut conn, "tn-2"), ["amount=1"]);
}

/// What a fingerprinted delivery sends. A duplicate's claim meets the
/// stored claim and compares fingerprints: on PostgreSQL the claim
/// statement reads the stored fingerprint itself, so a duplicate and a
/// conflict send what a plain duplicate does (`BEGIN`, the claim, the
/// commit; a conflict rolls back), and so does MariaDB's (`INSERT …
/// RETURNING`; a blocking connection's first such claim runs without
/// reading, its row read apart, as the first delivery shows); on SQLite the
/// claim compares it, so a duplicate sends what a plain one does and only a
/// conflict reads the stored claim (for its error).
pub fn a_fingerprinted_duplicate_reads_the_stored_claim_in_its_claim<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    // PostgreSQL's and MariaDB's claims read what they met. SQLite's claim
    // fails, changing nothing, where it meets another fingerprint (the
    // stored claim is read then, for the conflict's error), and a stored
    // result is read apart.
    let (duplicate, conflict, stored): (&[&str], &[&str], &[&str]) = match B::NAME {
        "postgres" => (
            &["BEGIN", "claim", "COMMIT"],
            &["BEGIN", "claim", "ROLLBACK"],
            &["BEGIN", "claim", "COMMIT"],
        ),
        "mysql" => (
            &["BEGIN", "claim", "COMMIT"],
            &["BEGIN", "claim", "ROLLBACK"],
            &["BEGIN", "claim", "COMMIT"],
        ),
        _ => (
            &["BEGIN", "claim", "COMMIT"],
            &["BEGIN", "claim", "read stored", "ROLLBACK"],
            &["BEGIN", "claim", "read stored", "COMMIT"],
        ),
    };
    let first = Transfer::new("ts-1", "amount=1");
    let (processed, sent) = statements_of(&mut conn, |conn| transfer(conn, &first));
    assert_eq!(processed.unwrap(), Outcome::Processed(()));
    let first_claim: &[&str] = match B::NAME {
        // The connection's first reading claim: its load fails before the
        // server runs it (its columns unknown), then it runs, and its row
        // is read apart.
        "mysql" => &["BEGIN", "claim", "claim", "read claim", "effect", "COMMIT"],
        _ => &["BEGIN", "claim", "effect", "COMMIT"],
    };
    assert_eq!(shape(&sent), first_claim, "{sent:#?}");

    let again = Transfer::new("ts-1", "amount=1");
    let (answer, sent) = statements_of(&mut conn, |conn| transfer(conn, &again));
    assert_eq!(answer.unwrap(), Outcome::Duplicate);
    assert_eq!(shape(&sent), duplicate, "a duplicate: {sent:#?}");

    let changed = Transfer::new("ts-1", "amount=2");
    let (answer, sent) = statements_of(&mut conn, |conn| transfer(conn, &changed));
    assert!(
        matches!(answer, Err(AppError::Inbox(InboxError::Conflict(_)))),
        "{answer:?}"
    );
    assert_eq!(
        shape(&sent),
        conflict,
        "a conflict (rolled back): {sent:#?}"
    );
    assert_eq!(changed.runs(), 0);
    assert_eq!(applied(&mut conn, "ts-1"), ["amount=1"]);

    // A stored result is read the same way.
    assert!(
        charge(&mut conn, &Charge::new("ts-2", 5))
            .unwrap()
            .is_processed()
    );
    let retry = Charge::new("ts-2", 5);
    let (replayed, sent) = statements_of(&mut conn, |conn| charge(conn, &retry));
    assert!(replayed.unwrap().is_replayed());
    assert_eq!(retry.runs(), 0);
    assert_eq!(shape(&sent), stored, "a stored result: {sent:#?}");
}

inbox_tests::backend_tests!(
    a_fingerprinted_duplicate_reads_the_stored_claim_in_its_claim,
    a_fingerprinted_batch_body_stores_its_fingerprint,
    claim_refuses_another_fingerprint,
    a_conflict_leaves_the_caller_s_transaction_going,
    a_new_connection_s_first_claims_read_what_they_met,
    the_same_payload_is_a_duplicate_and_another_a_conflict,
    a_claim_without_a_fingerprint_matches_any_payload,
    a_serde_payload_is_fingerprinted_whatever_its_map_order,
);
