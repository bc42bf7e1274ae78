//! The suite's tables and the handlers (and non-handlers) it checks,
//! generic over the connection: one correct handler, and one of each
//! mistake `inbox_runtime::testing` must catch.

use diesel::RunQueryDsl;
use inbox_runtime::{InboxBackend, Outcome, idempotent};
use inbox_tests::{AppError, statement};

/// The account the handlers credit (one row, id 1), with a note the
/// in-place mistake toggles between `NULL` and `''`, and an audit log with
/// no key (a row written twice shows twice).
pub const TABLES_DDL: &str = "CREATE TABLE testing_accounts \
         (id INTEGER NOT NULL PRIMARY KEY, balance BIGINT NOT NULL, note VARCHAR(20)); \
     CREATE TABLE testing_audit (message_id VARCHAR(255) NOT NULL); \
     INSERT INTO testing_accounts (id, balance, note) VALUES (1, 0, NULL)";

/// A payment to account 1.
#[derive(Debug, Clone)]
pub struct Payment {
    pub id: String,
    pub cents: i64,
}

impl Payment {
    pub fn new(id: &str, cents: i64) -> Self {
        Payment {
            id: id.to_owned(),
            cents,
        }
    }
}

fn credit_sql(msg: &Payment) -> String {
    format!(
        "UPDATE testing_accounts SET balance = balance + {} WHERE id = 1",
        msg.cents
    )
}

fn audit_sql(msg: &Payment) -> String {
    format!(
        "INSERT INTO testing_audit (message_id) VALUES ('{}')",
        msg.id.replace('\'', "''")
    )
}

/// Correct: credits the account and audits, both through its connection.
#[idempotent(id = msg.id, handler = "testing.credit")]
pub fn credit<C>(conn: &mut C, msg: &Payment) -> Result<(), AppError>
where
    C: diesel::connection::LoadConnection<Backend: InboxBackend>,
{
    statement(credit_sql(msg)).execute(conn)?;
    statement(audit_sql(msg)).execute(conn)?;
    Ok(())
}

/// Correct, with an `Outcome<T>` result: the new balance.
#[idempotent(id = msg.id, handler = "testing.credit_valued")]
pub fn credit_valued<C>(conn: &mut C, msg: &Payment) -> Result<Outcome<i64>, AppError>
where
    C: diesel::connection::LoadConnection<Backend: InboxBackend>,
{
    statement(credit_sql(msg)).execute(conn)?;
    Ok(Outcome::Processed(msg.cents))
}

/// Wrong: audits through a second connection, outside its transaction
/// (declared, so the attribute lets it compile).
#[idempotent(id = msg.id, handler = "testing.audit_outside", outside_transaction = outside)]
pub fn credit_auditing_outside<C>(
    conn: &mut C,
    outside: &mut C,
    msg: &Payment,
) -> Result<(), AppError>
where
    C: diesel::connection::LoadConnection<Backend: InboxBackend>,
{
    statement(credit_sql(msg)).execute(conn)?;
    statement(audit_sql(msg)).execute(outside)?;
    Ok(())
}

/// Wrong: not annotated, so every delivery credits and audits again.
pub fn credit_unguarded<C>(conn: &mut C, msg: &Payment) -> Result<(), AppError>
where
    C: diesel::connection::LoadConnection<Backend: InboxBackend>,
{
    statement(credit_sql(msg)).execute(conn)?;
    statement(audit_sql(msg)).execute(conn)?;
    Ok(())
}

/// Wrong: calls the correct handler, then audits whether the message was
/// new or not.
pub fn credit_then_audit<C>(conn: &mut C, msg: &Payment) -> Result<(), AppError>
where
    C: diesel::connection::LoadConnection<Backend: InboxBackend>,
{
    credit(conn, msg)?;
    statement(audit_sql(msg)).execute(conn)?;
    Ok(())
}

/// Wrong, with no row added or removed: calls the correct handler, then
/// toggles the account's note between `NULL` and `''` on every delivery.
pub fn credit_then_toggle_note<C>(conn: &mut C, msg: &Payment) -> Result<(), AppError>
where
    C: diesel::connection::LoadConnection<Backend: InboxBackend>,
{
    credit(conn, msg)?;
    statement(
        "UPDATE testing_accounts SET note = CASE WHEN note IS NULL THEN '' ELSE NULL END \
         WHERE id = 1",
    )
    .execute(conn)?;
    Ok(())
}

/// A table whose first column is named `t`, as a digest's table alias
/// might be.
pub const TALLY_DDL: &str = "CREATE TABLE testing_tally (t INTEGER NOT NULL, n INTEGER NOT NULL); \
     INSERT INTO testing_tally (t, n) VALUES (1, 0)";

/// Wrong, in a table with a column named `t`: calls the correct handler,
/// then counts the delivery in `testing_tally.n` (never in `t`).
pub fn credit_then_tally<C>(conn: &mut C, msg: &Payment) -> Result<(), AppError>
where
    C: diesel::connection::LoadConnection<Backend: InboxBackend>,
{
    credit(conn, msg)?;
    statement("UPDATE testing_tally SET n = n + 1").execute(conn)?;
    Ok(())
}
