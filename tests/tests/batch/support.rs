//! What the batch tests share: a fresh database with the effects, counters
//! and locks tables, a batch run that records how often each body ran,
//! reads of effects, claims and `inbox_failures`, the statements a batch
//! sends, a std-only shuffle, and quiet deliberate panics.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use diesel::connection::{InstrumentationEvent, SimpleConnection};
use diesel::prelude::*;
use inbox_runtime::{
    AckDecision, BatchReport, HandlerName, InboxBackend, MaxAttempts, Outcome, ack_decision,
    run_idempotent_batch_with,
};
use inbox_tests::{SqlRows, TestBackend, statement};

pub use inbox_tests::AppError;

/// The handler every batch of these tests runs as.
pub const HANDLER: &str = "batch.apply";

/// What bodies write: one row per effect, no unique key, so an effect
/// committed twice shows up twice. The name contains `effects`, which is
/// how [`shape`] recognises a body's statement.
pub const EFFECTS_DDL: &str = "CREATE TABLE batch_effects \
     (message_id VARCHAR(255) NOT NULL, note VARCHAR(255) NOT NULL)";

/// One counter row per id, incremented by the bodies of the races.
pub const COUNTERS_DDL: &str =
    "CREATE TABLE batch_counters (id VARCHAR(255) NOT NULL PRIMARY KEY, n INTEGER NOT NULL)";

/// One row the lock tests hold and fight over.
pub const LOCKS_DDL: &str =
    "CREATE TABLE batch_locks (id INTEGER NOT NULL PRIMARY KEY, n INTEGER NOT NULL)";

/// A fresh database (inbox, effects, counters and locks tables) and a
/// connection to it, or `None` after the harness's `skipped:` line.
pub fn fresh<B: TestBackend>() -> Option<(B, B::Connection)> {
    quiet_deliberate_panics();
    let (db, mut conn) = B::open_with_effects(EFFECTS_DDL)?;
    conn.batch_execute(COUNTERS_DDL)
        .expect("create batch_counters");
    conn.batch_execute(LOCKS_DDL).expect("create batch_locks");
    conn.batch_execute("INSERT INTO batch_locks (id, n) VALUES (1, 0), (2, 0)")
        .expect("seed batch_locks");
    Some((db, conn))
}

/// The handler name.
pub fn handler() -> HandlerName {
    HandlerName::new(HANDLER).expect("a valid handler name")
}

/// `n` ids `prefix-0000`, `prefix-0001`, …
pub fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:04}")).collect()
}

/// `text` as an SQL string literal (the ids of these tests are plain words).
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Runs `sql` on any backend's connection.
pub fn exec<C: Connection>(conn: &mut C, sql: impl Into<String>) -> QueryResult<usize> {
    statement(sql).execute(conn)
}

/// The body's effect for message `id`: one row in `batch_effects`.
pub fn apply<C: Connection>(conn: &mut C, id: &str) -> Result<(), AppError> {
    exec(
        conn,
        format!(
            "INSERT INTO batch_effects (message_id, note) VALUES ({}, 'applied')",
            literal(id)
        ),
    )?;
    Ok(())
}

/// The effects committed for message `id`.
pub fn effects(conn: &mut impl SqlRows, id: &str) -> i64 {
    conn.bigint(&format!(
        "SELECT COUNT(*) AS value FROM batch_effects WHERE message_id = {}",
        literal(id)
    ))
}

/// Every effect committed.
pub fn all_effects(conn: &mut impl SqlRows) -> i64 {
    conn.bigint("SELECT COUNT(*) AS value FROM batch_effects")
}

/// The claims of `id` by [`HANDLER`]: 0 or 1.
pub fn claims(conn: &mut impl SqlRows, id: &str) -> i64 {
    conn.bigint(&format!(
        "SELECT COUNT(*) AS value FROM inbox_messages WHERE handler = {} AND message_id = {}",
        literal(HANDLER),
        literal(id)
    ))
}

/// The effects and the claims of `id` (see [`effects`], [`claims`]) read by
/// one statement, so in one snapshot: a `COMMIT` the server finishes after
/// its client dropped the connection cannot land between the two reads.
pub fn effects_and_claims(conn: &mut impl SqlRows, id: &str) -> (i64, i64) {
    let both = conn.bigint(&format!(
        "SELECT (SELECT COUNT(*) FROM batch_effects WHERE message_id = {id}) * 1000 \
         + (SELECT COUNT(*) FROM inbox_messages WHERE handler = {handler} AND message_id = {id}) \
         AS value",
        id = literal(id),
        handler = literal(HANDLER),
    ));
    (both / 1000, both % 1000)
}

/// Every claim in the inbox.
pub fn all_claims(conn: &mut impl SqlRows) -> i64 {
    conn.bigint("SELECT COUNT(*) AS value FROM inbox_messages")
}

pub use inbox_tests::failure_rows::{FailureRow, all_failure_rows, counted, exhausted, rejected};

/// The `inbox_failures` row of `id` (handler [`HANDLER`]), if any.
pub fn failure_row<B: TestBackend>(conn: &mut B::Connection, id: &str) -> Option<FailureRow> {
    inbox_tests::failure_rows::failure_row::<B>(conn, HANDLER, id)
}

/// The report of a batch whose bodies return their message's id.
pub type Report = BatchReport<String, AppError>;

/// How often the body ran per id during one batch.
pub type Runs = BTreeMap<String, u32>;

/// Runs `ids` as one batch of [`HANDLER`] (at most `max_attempts` failed
/// attempts per message); `act` is the body (it gets the id), and each
/// processed message's value is its id. Returns the report and how often
/// each body ran.
pub fn run_batch<C>(
    conn: &mut C,
    ids: &[String],
    options: impl Into<inbox_runtime::Options>,
    mut act: impl FnMut(&mut C, &str) -> Result<(), AppError>,
) -> (Report, Runs)
where
    C: diesel::connection::LoadConnection<Backend: InboxBackend>,
{
    let mut runs = Runs::new();
    let report = run_idempotent_batch_with(
        conn,
        &handler(),
        ids,
        |id| id,
        options,
        |conn, id: &String| {
            *runs.entry(id.clone()).or_default() += 1;
            act(conn, id)?;
            Ok(id.clone())
        },
    );
    (report, runs)
}

/// [`run_batch`] with a body that applies the effect and never fails.
pub fn apply_batch<C>(conn: &mut C, ids: &[String]) -> (Report, Runs)
where
    C: diesel::connection::LoadConnection<Backend: InboxBackend>,
{
    run_batch(conn, ids, MaxAttempts::limit(3), |conn, id| apply(conn, id))
}

/// How each message ended, for comparing reports: `processed`,
/// `duplicate`, or the error's text.
pub fn endings<T>(report: &BatchReport<T, AppError>) -> Vec<String> {
    report
        .results()
        .iter()
        .map(|result| match result {
            Ok(Outcome::Processed(_)) => "processed".to_owned(),
            Ok(Outcome::Duplicate) => "duplicate".to_owned(),
            Err(error) => format!("error: {error}"),
        })
        .collect()
}

/// The broker decision of every message.
pub fn decisions(report: &Report) -> Vec<AckDecision> {
    report.results().iter().map(ack_decision).collect()
}

/// Asserts that every message was processed with its own id as the value,
/// in the order given.
pub fn assert_all_processed(report: &Report, ids: &[String]) {
    assert_eq!(report.len(), ids.len());
    for (position, (result, id)) in report.results().iter().zip(ids).enumerate() {
        match result {
            Ok(Outcome::Processed(value)) => assert_eq!(value, id, "position {position}"),
            other => panic!("position {position} ({id}): {other:?}"),
        }
    }
}

/// Asserts that every message was a duplicate.
pub fn assert_all_duplicates(report: &Report) {
    for (position, result) in report.results().iter().enumerate() {
        assert!(
            matches!(result, Ok(Outcome::Duplicate)),
            "position {position}: {result:?}"
        );
    }
}

pub use inbox_tests::transaction_depth as depth;

pub use inbox_tests::{statement_shapes as shape, statements_of};

/// Counts the transactions (and savepoints) begun on a connection, so a
/// body can tell whether another body ran in the same transaction as it.
#[derive(Clone, Default)]
pub struct TransactionClock(Arc<AtomicU64>);

impl TransactionClock {
    /// Starts counting the transactions begun on `conn` (replacing its
    /// instrumentation).
    pub fn install<C: Connection>(conn: &mut C) -> TransactionClock {
        let clock = TransactionClock::default();
        let ticks = Arc::clone(&clock.0);
        conn.set_instrumentation(move |event: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::StartQuery { query, .. } = event {
                let sql = query.to_string();
                // MySQL/MariaDB's outermost begin turns `autocommit` off.
                if sql.starts_with("BEGIN")
                    || sql.starts_with("SAVEPOINT")
                    || sql.starts_with("SET @inbox_saved_autocommit")
                {
                    ticks.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        clock
    }

    /// The number of the transaction running now.
    pub fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A small std-only generator (xorshift), seeded per thread.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: usize, high: usize) -> usize {
        low + (self.next() % (high - low + 1) as u64) as usize
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

pub use inbox_tests::{panic_text, quiet_deliberate_panics};
