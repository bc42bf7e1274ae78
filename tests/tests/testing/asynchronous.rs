//! The check on diesel-async connections (PostgreSQL, MariaDB/MySQL): a
//! correct `async` handler passes, and the probe, the claim count and the
//! digest catch the same mistakes as on blocking connections.

use diesel_async::{AsyncConnection, RunQueryDsl};
use inbox_runtime::testing::{
    DigestBackend, IdempotenceViolation, TableChange, assert_idempotent_async,
    check_idempotent_async,
};
use inbox_runtime::{InboxBackend, idempotent};
use inbox_tests::{AppError, AsyncSqlRows, DieselBackend, TestBackend, statement};

use crate::handlers::{Payment, TABLES_DDL};

fn credit_sql(msg: &Payment) -> String {
    format!(
        "UPDATE testing_accounts SET balance = balance + {} WHERE id = 1",
        msg.cents
    )
}

fn audit_sql(msg: &Payment) -> String {
    format!(
        "INSERT INTO testing_audit (message_id) VALUES ('{}')",
        msg.id
    )
}

#[idempotent(id = msg.id, handler = "testing.credit_async")]
async fn credit<C>(conn: &mut C, msg: &Payment) -> Result<(), AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    statement(credit_sql(msg)).execute(conn).await?;
    statement(audit_sql(msg)).execute(conn).await?;
    Ok(())
}

#[idempotent(
    id = msg.id,
    handler = "testing.audit_outside_async",
    outside_transaction = outside
)]
async fn credit_auditing_outside<C>(
    conn: &mut C,
    outside: &mut C,
    msg: &Payment,
) -> Result<(), AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    statement(credit_sql(msg)).execute(conn).await?;
    statement(audit_sql(msg)).execute(outside).await?;
    Ok(())
}

async fn credit_unguarded<C>(conn: &mut C, msg: &Payment) -> Result<(), AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    statement(credit_sql(msg)).execute(conn).await?;
    Ok(())
}

async fn credit_then_audit<C>(conn: &mut C, msg: &Payment) -> Result<(), AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    credit(conn, msg).await?;
    statement(audit_sql(msg)).execute(conn).await?;
    Ok(())
}

fn change(table: &str, before: i64, after: i64) -> TableChange {
    TableChange {
        table: table.to_owned(),
        rows_before: Some(before),
        rows_after: Some(after),
    }
}

async fn an_async_handler_passes<B: TestBackend>()
where
    DieselBackend<B>: DigestBackend,
{
    let Some((_db, mut conn)) = B::open_async_with_effects(TABLES_DDL).await else {
        return;
    };
    let msg = Payment::new("pay-1", 250);
    let report = assert_idempotent_async(&mut conn, async |conn| credit(conn, &msg).await).await;
    assert_eq!(report.claims, 1);
    let balance = conn
        .bigint("SELECT balance AS value FROM testing_accounts WHERE id = 1")
        .await;
    assert_eq!(balance, 250, "processed once, probe rolled back");
}

async fn an_async_second_connection_is_caught<B: TestBackend>()
where
    DieselBackend<B>: DigestBackend,
{
    let Some((db, mut conn)) = B::open_async_with_effects(TABLES_DDL).await else {
        return;
    };
    let mut outside = db.connect_async().await;
    let msg = Payment::new("pay-1", 250);
    let violation = check_idempotent_async(&mut conn, async |conn| {
        credit_auditing_outside(conn, &mut outside, &msg).await
    })
    .await
    .expect_err("a write through a second connection must be caught");
    match &violation {
        IdempotenceViolation::WroteOutsideTransaction { tables } => {
            assert_eq!(tables, &[change("testing_audit", 0, 1)]);
        }
        other => panic!("expected WroteOutsideTransaction, got {other:?}"),
    }
}

async fn an_async_unannotated_handler_is_caught<B: TestBackend>()
where
    DieselBackend<B>: DigestBackend,
{
    let Some((_db, mut conn)) = B::open_async_with_effects(TABLES_DDL).await else {
        return;
    };
    let msg = Payment::new("pay-1", 250);
    let violation =
        check_idempotent_async(&mut conn, async |conn| credit_unguarded(conn, &msg).await)
            .await
            .expect_err("a handler without the inbox must be caught");
    assert!(
        matches!(
            violation,
            IdempotenceViolation::NotProcessed { new_claims: 0 }
        ),
        "{violation:?}"
    );
}

async fn an_async_write_on_the_duplicate_path_is_caught<B: TestBackend>()
where
    DieselBackend<B>: DigestBackend,
{
    let Some((_db, mut conn)) = B::open_async_with_effects(TABLES_DDL).await else {
        return;
    };
    let msg = Payment::new("pay-1", 250);
    let violation =
        check_idempotent_async(&mut conn, async |conn| credit_then_audit(conn, &msg).await)
            .await
            .expect_err("a write on the duplicate path must be caught");
    match &violation {
        IdempotenceViolation::ChangedOnDuplicate { tables } => {
            assert_eq!(tables, &[change("testing_audit", 2, 3)]);
        }
        other => panic!("expected ChangedOnDuplicate, got {other:?}"),
    }
}

inbox_tests::backend_tests!(
    async only [postgres, mysql]:
    an_async_handler_passes,
    an_async_second_connection_is_caught,
    an_async_unannotated_handler_is_caught,
    an_async_write_on_the_duplicate_path_is_caught,
);
