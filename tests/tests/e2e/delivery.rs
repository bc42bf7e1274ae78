//! One handler, one message: first delivery, redelivery, failures, panics,
//! early returns, `?`, two handlers, the default handler name.

use inbox_runtime::Outcome;

use crate::handlers::*;
use crate::support::*;

use std::panic::{AssertUnwindSafe, catch_unwind};

pub fn processed_then_duplicate<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let first = Msg::new("order-1");
    apply(&mut conn, &first).expect("first delivery");
    assert_eq!(first.runs.get(), 1, "the body ran on the first delivery");

    let again = Msg::new("order-1");
    apply(&mut conn, &again).expect("redelivery");
    assert_eq!(again.runs.get(), 0, "a duplicate skips the body");

    // A redelivery to another consumer instance (another connection).
    let mut other = db.connect();
    let elsewhere = Msg::new("order-1");
    apply(&mut other, &elsewhere).expect("redelivery elsewhere");
    assert_eq!(elsewhere.runs.get(), 0);

    assert_eq!(conn.effects_for("order-1"), 1, "the effect applied once");
    assert_eq!(
        other.inbox_rows(),
        vec![(APPLY.to_owned(), "order-1".to_owned())],
        "exactly one inbox row, with the handler and the id"
    );
    let age = received_age_micros::<B>(&mut conn, APPLY, "order-1");
    assert!(
        (-1_000_000..300_000_000).contains(&age),
        "received_at is set by the database clock, just now (age {age} µs)"
    );
    assert_connection_usable(&mut conn);
}

pub fn outcome_handler_returns_processed_then_duplicate<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let first = Msg::new("abcde");
    assert_eq!(
        valued(&mut conn, &first).expect("first"),
        Outcome::Processed(5)
    );
    let again = Msg::new("abcde");
    assert_eq!(
        valued(&mut conn, &again).expect("again"),
        Outcome::Duplicate
    );
    assert_eq!((first.runs.get(), again.runs.get()), (1, 0));
    assert_eq!(conn.effects_for("abcde"), 1);
    assert_eq!(conn.inbox_count("e2e.valued", "abcde"), 1);
}

pub fn error_in_body_rolls_back_claim_and_effects<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let failing = Msg::with_mode("pay-7", Mode::Fail);
    let err = apply(&mut conn, &failing).expect_err("the body fails");
    assert!(
        matches!(err, AppError::Failed("the body failed")),
        "{err:?}"
    );
    assert_eq!(failing.runs.get(), 1);
    assert_eq!(conn.inbox_rows(), NO_ROWS, "the claim rolled back");
    assert_eq!(conn.effects_for("pay-7"), 0, "the effect rolled back");
    assert_connection_usable(&mut conn);

    let redelivery = Msg::new("pay-7");
    apply(&mut conn, &redelivery).expect("redelivery");
    assert_eq!(redelivery.runs.get(), 1, "a redelivery processes again");
    let third = Msg::new("pay-7");
    apply(&mut conn, &third).expect("third delivery");
    assert_eq!(third.runs.get(), 0);
    assert_eq!(conn.effects_for("pay-7"), 1);
    assert_eq!(conn.inbox_count(APPLY, "pay-7"), 1);
}

pub fn panic_in_body_rolls_back_and_leaves_connection_usable<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let panicking = Msg::with_mode("boom-1", Mode::Panic);
    let payload = catch_unwind(AssertUnwindSafe(|| apply(&mut conn, &panicking)))
        .expect_err("the panic is resumed after the rollback");
    assert_eq!(
        payload.downcast_ref::<DeliberatePanic>(),
        Some(&DeliberatePanic("apply")),
        "the original panic payload comes out"
    );
    assert_eq!(panicking.runs.get(), 1);
    assert_connection_usable(&mut conn);
    assert_eq!(conn.inbox_rows(), NO_ROWS);
    assert_eq!(conn.effects_for("boom-1"), 0);

    // Same with an `Outcome` handler.
    let panicking = Msg::with_mode("boom-1", Mode::Panic);
    let payload = catch_unwind(AssertUnwindSafe(|| valued(&mut conn, &panicking)))
        .expect_err("the panic is resumed");
    assert_eq!(
        payload.downcast_ref::<DeliberatePanic>(),
        Some(&DeliberatePanic("valued"))
    );
    assert_connection_usable(&mut conn);
    assert_eq!(conn.inbox_rows(), NO_ROWS);

    let redelivery = Msg::new("boom-1");
    apply(&mut conn, &redelivery).expect("redelivery");
    assert_eq!(redelivery.runs.get(), 1);
    assert_eq!(
        valued(&mut conn, &Msg::new("boom-1")).unwrap(),
        Outcome::Processed(6)
    );
    apply(&mut conn, &Msg::new("boom-1")).expect("duplicate");
    assert_eq!(conn.effects_by(APPLY, "boom-1"), 1);
    assert_eq!(conn.effects_by("e2e.valued", "boom-1"), 1);
}

pub fn early_return_commits_the_claim<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let early = Msg::with_mode("early-1", Mode::EarlyReturn);
    apply(&mut conn, &early).expect("early return is a success");
    assert_eq!(early.runs.get(), 1);
    assert_eq!(conn.inbox_count(APPLY, "early-1"), 1, "the claim committed");
    assert_eq!(conn.effects_for("early-1"), 0, "no effect was written");

    let redelivery = Msg::new("early-1");
    apply(&mut conn, &redelivery).expect("redelivery");
    assert_eq!(redelivery.runs.get(), 0, "the message counts as processed");
    assert_eq!(conn.effects_for("early-1"), 0);

    let early = Msg::with_mode("early-2", Mode::EarlyReturn);
    assert_eq!(valued(&mut conn, &early).unwrap(), Outcome::Processed(0));
    assert_eq!(
        valued(&mut conn, &Msg::new("early-2")).unwrap(),
        Outcome::Duplicate
    );
    assert_connection_usable(&mut conn);
}

pub fn question_mark_error_rolls_back<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    // `?` on an application error.
    let rejected = Msg::with_mode("q-1", Mode::RejectWithQuestionMark);
    let err = apply(&mut conn, &rejected).expect_err("the check fails");
    assert!(matches!(err, AppError::Failed(_)), "{err:?}");
    let err = valued(
        &mut conn,
        &Msg::with_mode("q-1", Mode::RejectWithQuestionMark),
    )
    .expect_err("the check fails");
    assert!(matches!(err, AppError::Failed(_)), "{err:?}");
    // `?` on a failing statement (on PostgreSQL this aborts the
    // transaction, which must still roll back cleanly).
    let broken = Msg::with_mode("q-2", Mode::DbErrorWithQuestionMark);
    let err = apply(&mut conn, &broken).expect_err("the statement fails");
    assert!(matches!(err, AppError::Db(_)), "{err:?}");
    assert_connection_usable(&mut conn);
    assert_eq!(conn.inbox_rows(), NO_ROWS);
    assert_eq!(conn.all_effects(), NO_EFFECTS);

    for id in ["q-1", "q-2"] {
        let redelivery = Msg::new(id);
        apply(&mut conn, &redelivery).expect("redelivery");
        assert_eq!(redelivery.runs.get(), 1, "{id} is processed on redelivery");
        assert_eq!(conn.effects_for(id), 1);
    }
    assert_eq!(
        valued(&mut conn, &Msg::new("q-1")).unwrap(),
        Outcome::Processed(3)
    );
}

pub fn two_handlers_each_process_the_same_message_once<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    for _ in 0..3 {
        apply(&mut conn, &Msg::new("evt-1")).expect("apply");
        audit(&mut conn, &Msg::new("evt-1")).expect("audit");
    }
    assert_eq!(conn.effects_by(APPLY, "evt-1"), 1);
    assert_eq!(conn.effects_by(AUDIT, "evt-1"), 1);
    let mut expected = vec![
        (APPLY.to_owned(), "evt-1".to_owned()),
        (AUDIT.to_owned(), "evt-1".to_owned()),
    ];
    expected.sort();
    assert_eq!(conn.inbox_rows(), expected);
}

pub fn default_handler_name_is_the_function_path<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let first = Msg::new("d-1");
    default_named(&mut conn, &first).expect("first");
    default_named(&mut conn, &Msg::new("d-1")).expect("again");
    assert_eq!(first.runs.get(), 1);
    assert!(
        DEFAULT_NAMED.ends_with("::default_named"),
        "{DEFAULT_NAMED}"
    );
    assert_eq!(
        conn.inbox_rows(),
        vec![(DEFAULT_NAMED.to_owned(), "d-1".to_owned())]
    );
    assert_eq!(conn.effects_for("d-1"), 1);
}

inbox_tests::backend_tests!(
    processed_then_duplicate,
    outcome_handler_returns_processed_then_duplicate,
    error_in_body_rolls_back_claim_and_effects,
    panic_in_body_rolls_back_and_leaves_connection_usable,
    early_return_commits_the_claim,
    question_mark_error_rolls_back,
    two_handlers_each_process_the_same_message_once,
    default_handler_name_is_the_function_path,
);
