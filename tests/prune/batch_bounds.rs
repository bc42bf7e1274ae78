//! A batch reads the `received_at` index and locks (and deletes) no more
//! rows than its limit, whatever its scope: checked with EXPLAIN and by
//! probing, from a second connection, which rows the open batch holds.
//!
//! The inbox holds many handlers' expired ids, so that a one-handler scope
//! is selective: left to itself, MariaDB's optimizer then reads it through
//! the primary key (`handler = ?`) and sorts, which locks every expired row
//! of the handler in every batch.

#![cfg(any(feature = "postgres", feature = "mysql"))]

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_runtime::prune::PruneBatchStatement;
use inbox_runtime::Prune;

use crate::common::*;

const HANDLERS: usize = 100;
const PER_HANDLER: usize = 60;
const LIMIT: u32 = 10;

/// What differs between the two servers.
trait Server: PruneDb {
    /// Refreshes the planner's statistics.
    const ANALYZE: &'static str;
    /// Makes the next transaction READ COMMITTED.
    const READ_COMMITTED: &'static str;
    /// Expired rows of handler `h7` that another transaction could lock now.
    fn lockable(probe: &mut Self::Connection) -> i64;
    /// Text of `statement` with its bind parameters written in, to EXPLAIN.
    fn inline(statement: &PruneBatchStatement<'_>, binds: &[String]) -> String;
    /// The index the batch's row picking reads, and whether it sorts.
    fn plan(conn: &mut Self::Connection, sql: &str) -> (String, bool);
}

/// The batch for one handler's rows, `LIMIT` at a time.
fn one_handler_batch<D: Server>(db: &D) {
    let mut conn = db.connect();
    for h in 0..HANDLERS {
        let ids = ids(&format!("m{h}"), PER_HANDLER);
        seed::<D>(&mut conn, &format!("h{h}"), &ids, Some(30 * DAY));
    }
    conn.batch_execute(D::ANALYZE).unwrap();

    let prune = Prune::new(policy(7 * DAY, DAY).only(handler("h7")))
        .batch_size(LIMIT)
        .unwrap();
    let statements = prune.statements();
    let statement = &statements[0];
    let binds = [
        (7 * DAY * 1_000_000).to_string(),
        "'h7'".to_owned(),
        LIMIT.to_string(),
    ];
    let (index, sorts) = D::plan(&mut conn, &D::inline(statement, &binds));
    assert_eq!(
        (index.as_str(), sorts),
        ("inbox_messages_received_at_idx", false),
        "the batch must walk the received_at index, oldest first, and stop at its limit"
    );

    // The batch, left open: a second connection can still lock every
    // expired row of the handler but the ones it deletes.
    let mut probe = db.connect();
    // As `Prune::run` does: at READ COMMITTED.
    conn.batch_execute(D::READ_COMMITTED).unwrap();
    let mut seen = None;
    let result = conn.transaction(|conn| {
        let deleted = statement.execute(conn)?;
        seen = Some((deleted, D::lockable(&mut probe)));
        Err::<(), _>(diesel::result::Error::RollbackTransaction)
    });
    assert!(
        matches!(result, Err(diesel::result::Error::RollbackTransaction)),
        "{result:?}"
    );
    let (deleted, lockable) = seen.unwrap();
    assert_eq!(deleted, LIMIT as usize);
    assert_eq!(
        lockable,
        (PER_HANDLER - LIMIT as usize) as i64,
        "an open batch of {LIMIT} holds only the rows it deletes"
    );
}

#[cfg(feature = "mysql")]
impl Server for inbox_suite::testdb::MysqlDatabase {
    const ANALYZE: &'static str = "ANALYZE TABLE inbox_messages";
    const READ_COMMITTED: &'static str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";

    fn lockable(probe: &mut diesel::MysqlConnection) -> i64 {
        probe
            .transaction(|probe| {
                diesel::sql_query(
                    "SELECT COUNT(*) AS n FROM (SELECT message_id FROM inbox_messages \
                     FORCE INDEX (PRIMARY) WHERE handler = 'h7' FOR UPDATE SKIP LOCKED) AS free",
                )
                .get_result::<CountRow>(probe)
            })
            .unwrap()
            .n
    }

    fn inline(statement: &PruneBatchStatement<'_>, binds: &[String]) -> String {
        let sql = diesel::debug_query::<diesel::mysql::Mysql, _>(statement).to_string();
        let sql = sql.split(" -- binds:").next().unwrap();
        let mut parts = sql.split('?');
        let mut out = parts.next().unwrap().to_owned();
        for (part, bind) in parts.zip(binds) {
            out.push_str(bind);
            out.push_str(part);
        }
        out
    }

    fn plan(conn: &mut diesel::MysqlConnection, sql: &str) -> (String, bool) {
        #[derive(QueryableByName, Debug)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
            select_type: Option<String>,
            #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
            key: Option<String>,
            #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
            #[diesel(column_name = Extra)]
            extra: Option<String>,
        }
        let rows: Vec<Row> = diesel::sql_query(format!("EXPLAIN {sql}"))
            .load(conn)
            .unwrap();
        let pick = rows
            .iter()
            .find(|row| row.select_type.as_deref() == Some("DERIVED"))
            .unwrap_or_else(|| panic!("no derived table in {rows:#?}"));
        (
            pick.key.clone().unwrap_or_default(),
            pick.extra.as_deref().unwrap_or("").contains("filesort"),
        )
    }
}

#[cfg(feature = "postgres")]
impl Server for inbox_suite::testdb::PgDatabase {
    const ANALYZE: &'static str = "ANALYZE inbox_messages";
    const READ_COMMITTED: &'static str =
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED";

    fn lockable(probe: &mut diesel::PgConnection) -> i64 {
        probe
            .transaction(|probe| {
                diesel::sql_query(
                    "SELECT COUNT(*) AS n FROM (SELECT message_id FROM inbox_messages \
                     WHERE handler = 'h7' FOR UPDATE SKIP LOCKED) AS free",
                )
                .get_result::<CountRow>(probe)
            })
            .unwrap()
            .n
    }

    fn inline(statement: &PruneBatchStatement<'_>, binds: &[String]) -> String {
        let sql = diesel::debug_query::<diesel::pg::Pg, _>(statement).to_string();
        let mut sql = sql.split(" -- binds:").next().unwrap().to_owned();
        for (i, bind) in binds.iter().enumerate().rev() {
            sql = sql.replace(&format!("${}", i + 1), bind);
        }
        sql
    }

    fn plan(conn: &mut diesel::PgConnection, sql: &str) -> (String, bool) {
        #[derive(QueryableByName)]
        struct Line {
            #[diesel(sql_type = diesel::sql_types::Text)]
            #[diesel(column_name = "QUERY PLAN")]
            line: String,
        }
        let plan: Vec<String> = diesel::sql_query(format!("EXPLAIN {sql}"))
            .load::<Line>(conn)
            .unwrap()
            .into_iter()
            .map(|line| line.line)
            .collect();
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
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_one_handler_batch_reads_the_index_and_locks_its_limit() {
    use inbox_suite::testdb::TestDatabase as _;
    if let Some(db) = inbox_suite::testdb::MysqlDatabase::open() {
        one_handler_batch(&db);
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_one_handler_batch_reads_the_index_and_locks_its_limit() {
    use inbox_suite::testdb::TestDatabase as _;
    if let Some(db) = inbox_suite::testdb::PgDatabase::open() {
        one_handler_batch(&db);
    }
}
