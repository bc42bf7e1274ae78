//! The failure paths of async handlers: a panic inside a nested
//! transaction, a failed statement the body ignores, and a rollback that
//! fails after a panic.

use diesel_async::AsyncConnection;
use futures_util::FutureExt;
use inbox_runtime::{InboxError, Outcome};
use inbox_tests::{AppError, ServerBackend, TestBackend};

use crate::handlers::*;
use crate::support::*;

pub async fn a_panic_inside_a_nested_transaction_rolls_back_the_handler<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>().await else {
        return;
    };
    let doomed = Msg::new("np-1").panicking();
    let caught = std::panic::AssertUnwindSafe(nested_transaction(&mut conn, &doomed))
        .catch_unwind()
        .await;
    assert!(caught.is_err(), "the panic is resumed");
    assert_eq!(depth(&mut conn), 0, "the handler's transaction is closed");
    assert_eq!(effects(&mut conn, "np-1").await, 0);
    assert_eq!(
        claims(&mut conn, "async.nested_transaction", "np-1").await,
        0
    );

    // The next delivery on the same connection commits for real.
    let mut observer = _db.connect_async().await;
    let next = Msg::new("np-2");
    assert_eq!(
        record(&mut conn, &next).await.unwrap(),
        Outcome::Processed(0)
    );
    assert_eq!(effects(&mut observer, "np-2").await, 1, "committed");
    let redelivery = Msg::new("np-1");
    nested_transaction(&mut conn, &redelivery)
        .await
        .expect("the redelivery");
    assert_eq!(
        effects(&mut observer, "np-1").await,
        2,
        "both effects, once"
    );
}

pub async fn a_panic_inside_a_nested_transaction_returns_to_the_callers_level<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>().await else {
        return;
    };
    let doomed = Msg::new("np-3").panicking();
    conn.transaction(async |conn| {
        write_effect(conn, "outer", 0).await?;
        let caught = std::panic::AssertUnwindSafe(nested_transaction(conn, &doomed))
            .catch_unwind()
            .await;
        assert!(caught.is_err(), "the panic is resumed");
        assert_eq!(depth(conn), 1, "back at the caller's transaction");
        write_effect(conn, "outer", 1).await?;
        Ok::<_, AppError>(())
    })
    .await
    .expect("the caller's transaction commits");
    let mut observer = db.connect_async().await;
    assert_eq!(
        effects(&mut observer, "outer").await,
        2,
        "the caller's work committed"
    );
    assert_eq!(
        effects(&mut observer, "np-3").await,
        0,
        "the handler's did not"
    );
    assert_eq!(
        claims(&mut observer, "async.nested_transaction", "np-3").await,
        0
    );
}

pub async fn an_ignored_failed_statement_never_reports_uncommitted_work_as_done<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>().await else {
        return;
    };
    let mut observer = db.connect_async().await;
    let result = swallows_a_failure(&mut conn, &Msg::new("sw-1")).await;
    assert_eq!(depth(&mut conn), 0);
    if B::FAILED_STATEMENT_ABORTS_TRANSACTION {
        let error = result.expect_err("uncommitted work must not be reported as done");
        assert!(
            matches!(
                error.inbox(),
                Some(InboxError::IgnoredStatementFailure { .. })
            ),
            "{error:?}"
        );
        assert_eq!(effects(&mut observer, "sw-1").await, 0);
        assert_eq!(claims(&mut observer, "async.swallow", "sw-1").await, 0);
        let again = swallows_a_failure(&mut conn, &Msg::new("sw-1"))
            .await
            .expect_err("every delivery of this body fails the same way");
        assert!(
            matches!(
                again.inbox(),
                Some(InboxError::IgnoredStatementFailure { .. })
            ),
            "{again:?}"
        );
    } else {
        assert_eq!(result.expect("committed"), Outcome::Processed(()));
        assert_eq!(effects(&mut observer, "sw-1").await, 2);
    }
    // The connection still works.
    assert_eq!(
        record(&mut conn, &Msg::new("sw-2")).await.unwrap(),
        Outcome::Processed(0)
    );
    assert_eq!(effects(&mut observer, "sw-2").await, 1);
}

pub async fn a_panic_is_resumed_even_when_the_rollback_fails<B: ServerBackend>() {
    let Some((db, mut conn)) = fresh::<B>().await else {
        return;
    };
    let doomed = Doomed {
        id: "kp-1".to_owned(),
        kill_sql: B::kill_sql(inbox_tests::connection_id_async::<B>(&mut conn).await),
        killer: tokio::sync::Mutex::new(db.connect_async().await),
    };
    let caught = std::panic::AssertUnwindSafe(killed_then_panics(&mut conn, &doomed))
        .catch_unwind()
        .await;
    assert!(
        caught.is_err(),
        "the panic is resumed, not turned into an error"
    );
    match record(&mut conn, &Msg::new("kp-2")).await {
        Err(AppError::Db(diesel::result::Error::BrokenTransactionManager)) => {}
        other => panic!("the connection must refuse further work, got {other:?}"),
    }
    let mut observer = db.connect_async().await;
    assert_eq!(effects(&mut observer, "kp-1").await, 0);
    assert_eq!(effects(&mut observer, "kp-2").await, 0);
    assert_eq!(
        claims(&mut observer, "async.killed_then_panics", "kp-1").await,
        0
    );
}

inbox_tests::backend_tests!(async only [postgres, mysql]:
    a_panic_inside_a_nested_transaction_rolls_back_the_handler,
    a_panic_inside_a_nested_transaction_returns_to_the_callers_level,
    an_ignored_failed_statement_never_reports_uncommitted_work_as_done,
    a_panic_is_resumed_even_when_the_rollback_fails,
);
