//! Handlers called inside a transaction the caller already opened: the
//! handler's work becomes a savepoint of the outer transaction.

use diesel::prelude::*;

use crate::handlers::*;
use crate::support::*;

pub fn nested_outer_rollback_discards_the_claim<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let first = Msg::new("n-1");
    let again = Msg::new("n-1");
    let result: Result<(), AppError> = conn.transaction(|conn| {
        apply(conn, &first)?;
        // Visible to the outer transaction, which sees its own claim.
        assert_eq!(conn.inbox_count(APPLY, "n-1"), 1);
        apply(conn, &again)?;
        Err(AppError::Failed("the outer transaction rolls back"))
    });
    assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
    assert_eq!(
        (first.runs.get(), again.runs.get()),
        (1, 0),
        "duplicate inside the outer"
    );
    assert_connection_usable(&mut conn);
    let mut other = db.connect();
    assert_eq!(
        other.inbox_rows(),
        NO_ROWS,
        "the claim vanished with the outer"
    );
    assert_eq!(other.effects_for("n-1"), 0);

    let redelivery = Msg::new("n-1");
    apply(&mut conn, &redelivery).expect("redelivery");
    assert_eq!(redelivery.runs.get(), 1, "a redelivery processes");
    assert_eq!(other.effects_for("n-1"), 1);
}

pub fn nested_outer_commit_makes_the_claim_durable<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let first = Msg::new("n-2");
    conn.transaction(|conn| {
        apply(conn, &first)?;
        conn.record_effect("outer", "n-2", 0, "outer work")?;
        Ok::<_, AppError>(())
    })
    .expect("the outer commits");
    assert_eq!(first.runs.get(), 1);
    assert_connection_usable(&mut conn);

    let mut other = db.connect();
    let redelivery = Msg::new("n-2");
    apply(&mut other, &redelivery).expect("redelivery");
    assert_eq!(
        redelivery.runs.get(),
        0,
        "duplicate after the outer committed"
    );
    assert_eq!(other.effects_by(APPLY, "n-2"), 1);
    assert_eq!(other.effects_by("outer", "n-2"), 1);
    assert_eq!(other.inbox_count(APPLY, "n-2"), 1);
}

pub fn nested_handler_failure_rolls_back_only_its_savepoint<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let failing = Msg::with_mode("n-3", Mode::Fail);
    let broken = Msg::with_mode("n-4", Mode::DbErrorWithQuestionMark);
    let panicking = Msg::with_mode("n-5", Mode::Panic);
    let fine = Msg::new("n-6");
    conn.transaction(|conn| {
        conn.record_effect("outer", "outer", 0, "before")?;
        assert!(matches!(apply(conn, &failing), Err(AppError::Failed(_))));
        assert!(matches!(apply(conn, &broken), Err(AppError::Db(_))));
        let caught =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| apply(conn, &panicking)));
        assert!(caught.is_err(), "the panic is resumed");
        // The outer transaction is still alive and usable.
        apply(conn, &fine)?;
        conn.record_effect("outer", "outer", 0, "after")?;
        Ok::<_, AppError>(())
    })
    .expect("the outer commits");
    assert_connection_usable(&mut conn);

    let mut other = db.connect();
    assert_eq!(
        other.inbox_rows(),
        vec![(APPLY.to_owned(), "n-6".to_owned())]
    );
    assert_eq!(
        other.all_effects(),
        vec![
            (APPLY.to_owned(), "n-6".to_owned(), "apply".to_owned()),
            ("outer".to_owned(), "outer".to_owned(), "after".to_owned()),
            ("outer".to_owned(), "outer".to_owned(), "before".to_owned()),
        ]
    );
    for id in ["n-3", "n-4", "n-5"] {
        let redelivery = Msg::new(id);
        apply(&mut other, &redelivery).expect("redelivery");
        assert_eq!(redelivery.runs.get(), 1, "{id} is processed on redelivery");
    }
}

inbox_tests::backend_tests!(
    nested_outer_rollback_discards_the_claim,
    nested_outer_commit_makes_the_claim_durable,
    nested_handler_failure_rolls_back_only_its_savepoint,
);
