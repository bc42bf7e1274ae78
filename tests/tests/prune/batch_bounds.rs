//! A batch reads and locks no more rows than it deletes, whatever its scope:
//! checked with EXPLAIN (ANALYZE on PostgreSQL: no row read and filtered
//! out) and by probing, from a second connection, which rows the open batch
//! holds.
//!
//! - `one_handler_batch`: many handlers' expired ids, so that a one-handler
//!   scope is selective. Left to itself, MariaDB's optimizer reads it through
//!   the primary key (`handler = ?`) and sorts, which locks every expired row
//!   of the handler in every batch; walked through the `received_at` index
//!   it locks every other handler's row it passes. The batch walks
//!   `(handler, received_at)`.
//! - `override_backlog`: a handler with a longer window of its own holds a
//!   large backlog that the default window has expired (1,000,000 rows on
//!   PostgreSQL; 200,000 on MariaDB, see `BatchProbe::BACKLOG`). The default pass
//!   used to walk `received_at` past all of it in every batch (PostgreSQL:
//!   "Rows Removed by Filter: 1000000" per batch; MariaDB: every backlog row
//!   locked). Every batch of a real run is examined while it runs, through
//!   Diesel's instrumentation on the pruning connection: its plan just
//!   before it executes, and the rows it holds just before it commits.

#![cfg(any(feature = "postgres", feature = "mysql"))]

use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};

use diesel::connection::{Instrumentation, InstrumentationEvent, SimpleConnection};
use diesel::prelude::*;
use inbox_runtime::Prune;
use inbox_runtime::prune::{PruneBatchStatement, PrunedTable};

use crate::support::*;

const HANDLERS: usize = 100;
const PER_HANDLER: usize = 60;
const LIMIT: u32 = 10;

inbox_tests::backend_tests!(
    only [postgres, mysql]:
    one_handler_batch_reads_the_index_and_locks_its_limit,
    override_backlog_is_neither_read_nor_locked,
);

/// What differs between the two servers in how a batch is examined.
pub trait BatchProbe: ServerBackend {
    /// The rows of the backlog of `override_backlog_is_neither_read_nor_locked`.
    const BACKLOG: i64;
    /// Refreshes the planner's statistics.
    const ANALYZE: &'static str;
    /// Makes the next transaction READ COMMITTED.
    const READ_COMMITTED: &'static str;
    /// How the lock probe reads the inbox: MariaDB through its primary key
    /// (`FORCE INDEX (PRIMARY)`); PostgreSQL as its planner likes.
    const PROBE_INDEX_HINT: &'static str;
    /// The SQL of `statement` as Diesel writes it, with its binds.
    fn debug(statement: &PruneBatchStatement<'_>) -> String;
    /// A statement as Diesel shows it (`SQL -- binds: [..]`) with its bind
    /// parameters written in, to EXPLAIN.
    fn inline(debug: &str) -> String;
    /// The index the batch's row picking reads, and whether it sorts.
    fn plan(conn: &mut Self::Connection, sql: &str) -> (String, bool);
    /// Inserts `rows` ids of `handler` received `days` days ago, in one
    /// statement.
    fn fill(conn: &mut Self::Connection, handler: &str, rows: i64, days: i64);
    /// Examines the batch `sql` on `probe` before the pruner runs it: the
    /// index its row picking walks, and what it found wrong (nothing when it
    /// reads no row it does not delete).
    fn examine(probe: &mut Self::Connection, sql: &str) -> (String, Vec<String>);
    /// InnoDB reads, and locks until the transaction ends, the index entry
    /// that ends a range scan: a batch that reaches the end of its scope
    /// also holds the scope's next row (a row it does not delete, of the
    /// same handler in a one-handler scope). PostgreSQL locks only the rows
    /// the scan returns.
    const LOCKS_THE_ROW_PAST_THE_END: bool;
}

/// `handler`'s rows, and every other handler's, that another transaction
/// could lock now.
fn lockable<B: BatchProbe>(probe: &mut B::Connection, handler: &str) -> (i64, i64) {
    probe
        .transaction(|probe| {
            let count = |condition: &str, probe: &mut B::Connection| {
                probe.bigint(&format!(
                    "SELECT COUNT(*) AS value FROM (SELECT message_id FROM inbox_messages {} \
                     WHERE {condition} FOR UPDATE SKIP LOCKED) AS free",
                    B::PROBE_INDEX_HINT
                ))
            };
            Ok::<_, diesel::result::Error>((
                count(&format!("handler = '{handler}'"), probe),
                count(&format!("handler <> '{handler}'"), probe),
            ))
        })
        .unwrap()
}

/// The bind parameters of a statement as Diesel shows it, as SQL literals.
fn binds(debug: &str) -> (String, Vec<String>) {
    let (sql, binds) = debug
        .split_once(" -- binds: [")
        .unwrap_or_else(|| panic!("no binds in {debug}"));
    let binds = binds.strip_suffix(']').expect("a closing bracket");
    let binds = binds
        .split(", ")
        .map(|bind| match bind.strip_prefix('"') {
            Some(text) => format!(
                "'{}'",
                text.strip_suffix('"')
                    .expect("a quoted string")
                    .replace('\'', "''")
            ),
            None => bind.to_owned(),
        })
        .collect();
    (sql.to_owned(), binds)
}

/// The batch for one handler's rows, `LIMIT` at a time.
pub fn one_handler_batch_reads_the_index_and_locks_its_limit<B: BatchProbe>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    for h in 0..HANDLERS {
        let ids = ids(&format!("m{h}"), PER_HANDLER);
        seed::<B>(&mut conn, &format!("h{h}"), &ids, Some(30 * DAY));
    }
    conn.batch_execute(B::ANALYZE).unwrap();

    let prune = Prune::new(policy(7 * DAY, DAY).only(handler("h7"))).batch_size(LIMIT);
    let statements = prune.statements();
    let statement = &statements[0];
    let (index, sorts) = B::plan(&mut conn, &B::inline(&B::debug(statement)));
    assert_eq!(
        (index.as_str(), sorts),
        ("inbox_messages_handler_received_at_idx", false),
        "the batch must walk the (handler, received_at) index, oldest first, and stop at its limit"
    );

    // The batch, left open: a second connection can still lock every row
    // but the ones it deletes, the handler's and everybody else's.
    let mut probe = db.connect();
    // As `Prune::run` does: at READ COMMITTED.
    conn.batch_execute(B::READ_COMMITTED).unwrap();
    let mut seen = None;
    let result = conn.transaction(|conn| {
        let deleted = statement.execute(conn)?;
        seen = Some((deleted, lockable::<B>(&mut probe, "h7")));
        Err::<(), _>(diesel::result::Error::RollbackTransaction)
    });
    assert!(
        matches!(result, Err(diesel::result::Error::RollbackTransaction)),
        "{result:?}"
    );
    let (deleted, (lockable, others)) = seen.unwrap();
    assert_eq!(deleted, LIMIT as usize);
    assert_eq!(
        lockable,
        (PER_HANDLER - LIMIT as usize) as i64,
        "an open batch of {LIMIT} holds only the rows it deletes"
    );
    assert_eq!(
        others,
        ((HANDLERS - 1) * PER_HANDLER) as i64,
        "an open batch for h7 holds no row of another handler"
    );
}

/// The handler with a window of its own and a large backlog.
const AUDIT: &str = "audit";
/// The other handlers, each with `EXPIRED` expired ids and `LIVE` fresh ones.
const OTHERS: usize = 5;
const EXPIRED: usize = 150;
const LIVE: usize = 50;
const BATCH: u32 = 100;

/// What was seen of one batch of the run: before it executed, what
/// `BatchProbe::examine` found wrong; after it executed and before it committed,
/// the backlog's lockable rows and the other handlers' rows, present and
/// lockable.
#[derive(Debug, Default)]
struct Seen {
    sql: String,
    index: String,
    problems: Vec<String>,
    backlog_lockable: i64,
    others_present: i64,
    others_lockable: i64,
}

/// Watches the pruning connection's DELETE statements from two other
/// connections (PostgreSQL's EXPLAIN ANALYZE deletes rows in a transaction it
/// rolls back, which must not be the one probing locks).
struct Watcher<C> {
    explain: C,
    probe: C,
    seen: Arc<Mutex<Vec<Seen>>>,
}

pub fn override_backlog_is_neither_read_nor_locked<B: BatchProbe>() {
    let Some(db) = B::open() else { return };
    let backlog = B::BACKLOG;
    let mut conn = db.connect();
    B::fill(&mut conn, AUDIT, backlog, 20);
    // The other handlers' expired ids are older than even the audit trail's
    // window, so that its own pass could walk past them too.
    for h in 0..OTHERS {
        let name = format!("h{h}");
        seed::<B>(&mut conn, &name, &ids("old", EXPIRED), Some(40 * DAY));
        seed::<B>(&mut conn, &name, &ids("new", LIVE), None);
    }
    conn.batch_execute(B::ANALYZE).unwrap();

    // The audit trail keeps its ids for 30 days, everybody else for 7.
    let policy = policy(7 * DAY, DAY).with_handler(handler(AUDIT), secs(30 * DAY));
    let prune = Prune::new(policy).batch_size(BATCH);

    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut watcher = Watcher::<B::Connection> {
        explain: db.connect(),
        probe: db.connect(),
        seen: Arc::clone(&seen),
    };
    conn.set_instrumentation(move |event: InstrumentationEvent<'_>| match event {
        InstrumentationEvent::StartQuery { query, .. } => {
            let sql = query.to_string();
            // The claims' batches (the failure records' come after them).
            if sql.starts_with("DELETE") && is_claims_batch(&sql) {
                let (index, problems) = B::examine(&mut watcher.explain, &B::inline(&sql));
                watcher.seen.lock().unwrap().push(Seen {
                    sql,
                    index,
                    problems,
                    ..Seen::default()
                });
            }
        }
        InstrumentationEvent::FinishQuery {
            query, error: None, ..
        } if query.to_string().starts_with("DELETE") && is_claims_batch(&query.to_string()) => {
            let (backlog_lockable, others_lockable) = lockable::<B>(&mut watcher.probe, AUDIT);
            let others_present = count(&mut watcher.probe) - backlog;
            let mut seen = watcher.seen.lock().unwrap();
            let last = seen.last_mut().expect("the batch's start was seen");
            last.backlog_lockable = backlog_lockable;
            last.others_lockable = others_lockable;
            last.others_present = others_present;
        }
        _ => {}
    });

    let mut deleted = Vec::new();
    let report = prune
        .run_with_progress(&mut conn, |batch| {
            if batch.table == PrunedTable::Claims {
                deleted.push((batch.scope.to_string(), batch.rows as i64));
            }
            ControlFlow::Continue(())
        })
        .unwrap();
    conn.set_instrumentation(None::<Box<dyn Instrumentation>>);

    assert!(report.caught_up, "{report}");
    assert_eq!(report.rows_deleted, (OTHERS * EXPIRED) as u64, "{report}");
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(
        seen.len(),
        deleted.len(),
        "one DELETE per batch: {deleted:?}"
    );
    let audit_scope = format!("handler `{AUDIT}`");
    for (batch, ((scope, rows), seen)) in deleted.iter().zip(&seen).enumerate() {
        eprintln!(
            "{}: batch {batch} ({scope}) walked {}, deleted {rows}, held {} + {} of the backlog",
            B::NAME,
            seen.index,
            seen.others_present - seen.others_lockable,
            backlog - seen.backlog_lockable
        );
        assert!(
            seen.problems.is_empty(),
            "batch {batch} ({scope}) reads rows it does not delete: {:#?}\n{}",
            seen.problems,
            seen.sql
        );
        let held = seen.others_present - seen.others_lockable + (backlog - seen.backlog_lockable);
        let past_the_end = B::LOCKS_THE_ROW_PAST_THE_END && *rows < i64::from(BATCH);
        assert_eq!(
            held,
            rows + i64::from(past_the_end),
            "batch {batch} ({scope}) holds the rows it deletes{}",
            if past_the_end {
                ", and the next one"
            } else {
                ""
            }
        );
        if *scope != audit_scope {
            assert_eq!(
                seen.backlog_lockable, backlog,
                "batch {batch} ({scope}) holds rows of the excluded backlog"
            );
        }
    }
    // The backlog is kept by its own window, the live ids by the default one.
    assert_eq!(count(&mut conn), backlog + (OTHERS * LIVE) as i64);
}

#[cfg(feature = "mysql")]
impl BatchProbe for inbox_tests::Mysql {
    /// Any backlog row a batch locks fails the test, whatever the size, so
    /// this is not about volume; 200,000 rows (2,000 times the batch) fill in
    /// about a second, and each lock probe (one per batch) reads them all in a
    /// fraction of one. The run's cost without the walk grows with it (every
    /// batch walked the whole backlog).
    const BACKLOG: i64 = 200_000;
    const ANALYZE: &'static str = "ANALYZE TABLE inbox_messages";
    const READ_COMMITTED: &'static str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";

    const PROBE_INDEX_HINT: &'static str = "FORCE INDEX (PRIMARY)";

    fn debug(statement: &PruneBatchStatement<'_>) -> String {
        diesel::debug_query::<diesel::mysql::Mysql, _>(statement).to_string()
    }

    fn inline(debug: &str) -> String {
        let (sql, binds) = binds(debug);
        let mut parts = sql.split('?');
        let mut out = parts.next().unwrap().to_owned();
        for (part, bind) in parts.zip(&binds) {
            out.push_str(bind);
            out.push_str(part);
        }
        out
    }

    fn plan(conn: &mut diesel::MysqlConnection, sql: &str) -> (String, bool) {
        let pick = mysql_pick(conn, sql);
        (
            pick.key.clone().unwrap_or_default(),
            pick.extra.as_deref().unwrap_or("").contains("filesort"),
        )
    }

    fn fill(conn: &mut diesel::MysqlConnection, handler: &str, rows: i64, days: i64) {
        // Portable to MySQL (no sequence tables): a million numbers from six
        // digits, cut at `rows`.
        let digit = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                     UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                     UNION ALL SELECT 8 UNION ALL SELECT 9)";
        conn.batch_execute(&format!(
            "INSERT INTO inbox_messages (handler, message_id, received_at) \
             SELECT '{handler}', CONCAT('b-', n), UTC_TIMESTAMP(6) - INTERVAL {days} DAY + INTERVAL n MICROSECOND \
             FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * d.d + 10000 * e.d + 100000 * f.d AS n \
                   FROM {digit} a, {digit} b, {digit} c, {digit} d, {digit} e, {digit} f) AS numbers \
             WHERE n < {rows}"
        ))
        .expect("fill the backlog");
    }

    /// MariaDB's EXPLAIN of the row picking; the locks are what matters on
    /// InnoDB, and the lock probe counts them.
    fn examine(probe: &mut diesel::MysqlConnection, sql: &str) -> (String, Vec<String>) {
        let pick = mysql_pick(probe, sql);
        let index = pick.key.clone().unwrap_or_default();
        let problems = match pick.key.as_deref() {
            Some("inbox_messages_handler_received_at_idx") => Vec::new(),
            _ => vec![format!("the pick does not walk one handler: {pick:?}")],
        };
        (index, problems)
    }

    const LOCKS_THE_ROW_PAST_THE_END: bool = true;
}

#[cfg(feature = "mysql")]
#[derive(QueryableByName, Debug)]
struct MysqlPlanRow {
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    select_type: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    key: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    #[diesel(column_name = Extra)]
    extra: Option<String>,
}

/// The derived table that picks a batch's rows, from EXPLAIN.
#[cfg(feature = "mysql")]
fn mysql_pick(conn: &mut diesel::MysqlConnection, sql: &str) -> MysqlPlanRow {
    let rows: Vec<MysqlPlanRow> = diesel::sql_query(format!("EXPLAIN {sql}"))
        .load(conn)
        .unwrap();
    rows.into_iter()
        .find(|row| row.select_type.as_deref() == Some("DERIVED"))
        .unwrap_or_else(|| panic!("no derived table in the plan of {sql}"))
}

#[cfg(feature = "postgres")]
#[derive(QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = diesel::sql_types::Text)]
    #[diesel(column_name = "QUERY PLAN")]
    line: String,
}

#[cfg(feature = "postgres")]
fn postgres_plan(conn: &mut diesel::PgConnection, explain: &str) -> Vec<String> {
    diesel::sql_query(explain)
        .load::<PlanLine>(conn)
        .unwrap()
        .into_iter()
        .map(|line| line.line)
        .collect()
}

#[cfg(feature = "postgres")]
impl BatchProbe for inbox_tests::Postgres {
    const BACKLOG: i64 = 1_000_000;
    const ANALYZE: &'static str = "ANALYZE inbox_messages";
    const READ_COMMITTED: &'static str =
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED";

    const PROBE_INDEX_HINT: &'static str = "";

    fn debug(statement: &PruneBatchStatement<'_>) -> String {
        diesel::debug_query::<diesel::pg::Pg, _>(statement).to_string()
    }

    fn inline(debug: &str) -> String {
        let (mut sql, binds) = binds(debug);
        for (i, bind) in binds.iter().enumerate().rev() {
            sql = sql.replace(&format!("${}", i + 1), bind);
        }
        sql
    }

    fn plan(conn: &mut diesel::PgConnection, sql: &str) -> (String, bool) {
        let plan = postgres_plan(conn, &format!("EXPLAIN {sql}"));
        let scan = plan
            .iter()
            .find(|line| line.contains(" Scan using "))
            .unwrap_or_else(|| panic!("no index scan in {plan:#?}"));
        let index = scan
            .split(" Scan using ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .unwrap_or_default()
            .to_owned();
        (index, plan.iter().any(|line| line.contains("Sort")))
    }

    fn fill(conn: &mut diesel::PgConnection, handler: &str, rows: i64, days: i64) {
        conn.batch_execute(&format!(
            "INSERT INTO inbox_messages (handler, message_id, received_at) \
             SELECT '{handler}', 'b-' || i, now() - interval '{days} days' + i * interval '1 microsecond' \
             FROM generate_series(1, {rows}) AS i"
        ))
        .expect("fill the backlog");
    }

    /// EXPLAIN ANALYZE of the batch, in a transaction rolled back: every row
    /// a scan of the inbox returned and a filter then threw away ("Rows
    /// Removed by Filter") is a row read and not deleted.
    fn examine(probe: &mut diesel::PgConnection, sql: &str) -> (String, Vec<String>) {
        let mut plan = Vec::new();
        let result = probe.transaction(|probe| {
            plan = postgres_plan(
                probe,
                &format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {sql}"),
            );
            Err::<(), _>(diesel::result::Error::RollbackTransaction)
        });
        assert!(matches!(
            result,
            Err(diesel::result::Error::RollbackTransaction)
        ));
        let mut problems = Vec::new();
        let mut node = String::new();
        let mut index = String::new();
        for line in &plan {
            if line.contains("->") || !line.starts_with(' ') {
                node = line.trim().to_owned();
            }
            if let Some(rest) = line.split(" Scan using ").nth(1) {
                index = rest.split(' ').next().unwrap_or_default().to_owned();
            }
            if let Some(removed) = line.trim().strip_prefix("Rows Removed by Filter: ") {
                if removed != "0" {
                    problems.push(format!("{node}: {removed} rows removed by filter"));
                }
            }
        }
        if index.is_empty() {
            problems.push(format!("no index scan: {plan:#?}"));
        }
        (index, problems)
    }

    const LOCKS_THE_ROW_PAST_THE_END: bool = false;
}

/// Whether a batch's SQL deletes claims (not failure records or sent
/// outgoing messages, whose batches this file does not watch).
fn is_claims_batch(sql: &str) -> bool {
    !sql.contains("inbox_failures") && !sql.contains("inbox_outbox")
}
