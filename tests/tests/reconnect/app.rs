//! The application under test, as the guide has a user write it: a
//! payment handler whose effects are one row in `effects` and one balance
//! update, an error type with a variant for Diesel's errors and one for the
//! inbox's, and the classification the consumer asks.

use std::collections::BTreeMap;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;

pub use inbox_runtime::Recovery;

diesel::table! {
    effects (seq) {
        seq -> BigInt,
        message_id -> Text,
        amount -> BigInt,
    }
}

diesel::table! {
    accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

/// The effects' tables. `effects` has no unique key on the message id:
/// only the inbox stands between a redelivery and a second row.
const SCHEMA_SQL: &str = "
    CREATE TABLE effects (seq BIGSERIAL PRIMARY KEY, message_id TEXT NOT NULL, amount BIGINT NOT NULL);
    CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
    INSERT INTO accounts VALUES (1, 0);
";

/// A message; `id` is the producer's, the same on every delivery.
#[derive(Debug, Clone)]
pub struct Payment {
    pub id: String,
    pub amount: i64,
}

/// `messages` payments (`amount` = position + 1) as an at-least-once broker
/// delivers them: every fifth one is delivered a second time after it was
/// acknowledged.
pub fn deliveries(messages: usize) -> Vec<Payment> {
    let mut out = Vec::new();
    for (i, payment) in payments(messages).into_iter().enumerate() {
        if i % 5 == 4 {
            out.push(payment.clone());
        }
        out.push(payment);
    }
    out
}

/// `messages` payments, each delivered once (`amount` = position + 1).
pub fn payments(messages: usize) -> Vec<Payment> {
    (0..messages)
        .map(|i| Payment {
            id: format!("pay-{i}"),
            amount: i as i64 + 1,
        })
        .collect()
}

/// Creates the inbox and the effects' tables on the server at `url`.
pub fn prepare(url: &str) {
    let mut conn = PgConnection::establish(url).expect("connect to prepare");
    inbox_runtime::setup(&mut conn).expect("create the inbox table");
    conn.batch_execute(SCHEMA_SQL)
        .expect("create the effects' tables");
}

/// How many effect rows each message id has.
pub fn effect_counts(conn: &mut PgConnection) -> BTreeMap<String, i64> {
    effects::table
        .group_by(effects::message_id)
        .select((effects::message_id, diesel::dsl::count_star()))
        .load::<(String, i64)>(conn)
        .expect("count the effects")
        .into_iter()
        .collect()
}

/// Asserts that each of the `messages` payments took effect exactly once,
/// summed over the servers at `urls` (none lost, none doubled): one effect
/// row and one inbox row per message, and the balance their sum.
pub fn assert_exactly_once(urls: &[String], messages: usize) {
    let mut rows: BTreeMap<String, i64> = BTreeMap::new();
    let mut balance = 0;
    let mut inbox = 0;
    for url in urls {
        let mut conn = PgConnection::establish(url).expect("connect to check");
        for (id, count) in effect_counts(&mut conn) {
            *rows.entry(id).or_default() += count;
        }
        balance += accounts::table
            .find(1)
            .select(accounts::balance)
            .first::<i64>(&mut conn)
            .expect("read the balance");
        inbox += inbox_runtime::schema::postgres::inbox_messages::table
            .count()
            .get_result::<i64>(&mut conn)
            .expect("count the inbox");
    }
    let lost: Vec<String> = (0..messages)
        .map(|i| format!("pay-{i}"))
        .filter(|id| !rows.contains_key(id))
        .collect();
    let doubled: Vec<(&String, &i64)> = rows.iter().filter(|&(_, &n)| n != 1).collect();
    assert!(lost.is_empty(), "messages lost: {lost:?}");
    assert!(doubled.is_empty(), "effects not exactly once: {doubled:?}");
    assert_eq!(
        rows.len(),
        messages,
        "effects of unknown messages: {rows:?}"
    );
    let expected: i64 = (1..=messages as i64).sum();
    assert_eq!(
        balance, expected,
        "the balance is the sum of the payments, once each"
    );
    assert_eq!(inbox, messages as i64, "one inbox row per message");
}

/// The application's error type, as in the guide (with `recovery()`).
pub use inbox_tests::AppError;

/// The handler on a blocking `PgConnection` (r2d2's pooled connections
/// dereference to one).
pub mod blocking {
    use diesel::prelude::*;
    use inbox_runtime::{Outcome, idempotent};

    use super::{AppError, Payment, accounts, effects};
    use crate::consumer::{Progress, Report, consume};

    #[idempotent(id = msg.id, handler = "reconnect.apply_payment", shared_scope)]
    pub fn apply_payment(conn: &mut PgConnection, msg: &Payment) -> Result<Outcome<()>, AppError> {
        diesel::insert_into(effects::table)
            .values((
                effects::message_id.eq(&msg.id),
                effects::amount.eq(msg.amount),
            ))
            .execute(conn)?;
        diesel::update(accounts::table.find(1))
            .set(accounts::balance.eq(accounts::balance + msg.amount))
            .execute(conn)?;
        Ok(Outcome::Processed(()))
    }

    /// The guide's consumer delivering `deliveries` with [`apply_payment`]
    /// on connections it opens to `url` (again after each `Reconnect`).
    pub fn consume_at(
        url: &str,
        deliveries: &[Payment],
        progress: &Progress,
    ) -> Result<Report, String> {
        consume(
            deliveries,
            progress,
            || PgConnection::establish(url).map_err(|e| e.to_string()),
            apply_payment,
            AppError::recovery,
        )
    }
}

/// The same handler on diesel-async (deadpool's and bb8's pooled
/// connections dereference to an `AsyncPgConnection`).
#[cfg(feature = "async")]
pub mod nonblocking {
    use diesel::prelude::*;
    use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
    use inbox_runtime::{Outcome, idempotent};

    use super::{AppError, Payment, accounts, effects};
    use crate::consumer::{Progress, Report, consume_async};

    #[idempotent(id = msg.id, handler = "reconnect.apply_payment", shared_scope)]
    pub async fn apply_payment(
        conn: &mut AsyncPgConnection,
        msg: &Payment,
    ) -> Result<Outcome<()>, AppError> {
        diesel::insert_into(effects::table)
            .values((
                effects::message_id.eq(&msg.id),
                effects::amount.eq(msg.amount),
            ))
            .execute(conn)
            .await?;
        diesel::update(accounts::table.find(1))
            .set(accounts::balance.eq(accounts::balance + msg.amount))
            .execute(conn)
            .await?;
        Ok(Outcome::Processed(()))
    }

    /// [`blocking::consume_at`](super::blocking::consume_at) on
    /// `AsyncPgConnection`s.
    pub async fn consume_at(
        url: &str,
        deliveries: &[Payment],
        progress: &Progress,
    ) -> Result<Report, String> {
        consume_async(
            deliveries,
            progress,
            async || {
                AsyncPgConnection::establish(url)
                    .await
                    .map_err(|e| e.to_string())
            },
            async |conn: &mut AsyncPgConnection, msg| apply_payment(conn, msg).await,
            AppError::recovery,
        )
        .await
    }
}
