//! What the Galera scenarios share: the handler, its effects table, pools
//! per node, server counters, the exactly-once check, and printing.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use diesel::sql_types::{BigInt, Integer, Text};
use inbox_runtime::{Outcome, idempotent};
use inbox_tests::GaleraCluster;
use inbox_tests::galera::NODES;

pub type MysqlPool = Pool<ConnectionManager<MysqlConnection>>;

/// The handler's deduplication scope.
pub const HANDLER: &str = "galera.apply";

/// Prints a figure or a finding where it is seen without `--nocapture`.
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), "galera: {}", format_args!($($arg)*));
    }};
}
pub(crate) use report;

/// One delivery of a message.
pub struct Delivery<'a> {
    pub id: String,
    /// The node the consumer delivers on (recorded with the effect).
    pub node: usize,
    /// How many times a body ran for this id, over every delivery.
    pub bodies: &'a AtomicU32,
    /// Whether the body ran in this attempt.
    pub ran: Cell<bool>,
    /// Called after the body wrote its effect, before it returns.
    pub pause: Option<&'a (dyn Fn() + Sync)>,
}

impl<'a> Delivery<'a> {
    pub fn new(id: impl Into<String>, node: usize, bodies: &'a AtomicU32) -> Self {
        Delivery {
            id: id.into(),
            node,
            bodies,
            ran: Cell::new(false),
            pause: None,
        }
    }
}

/// The handler: one effect row per body run that commits.
#[idempotent(id = msg.id, handler = "galera.apply", shared_scope)]
pub fn apply(
    conn: &mut MysqlConnection,
    msg: &Delivery<'_>,
) -> Result<Outcome<()>, diesel::result::Error> {
    msg.ran.set(true);
    msg.bodies.fetch_add(1, Ordering::SeqCst);
    diesel::sql_query("INSERT INTO effects (message_id, node) VALUES (?, ?)")
        .bind::<Text, _>(&msg.id)
        .bind::<Integer, _>(msg.node as i32)
        .execute(conn)?;
    if let Some(pause) = msg.pause {
        pause();
    }
    Ok(Outcome::Processed(()))
}

/// The effects table (Galera needs a primary key on every table), created
/// on node 0 and seen by every node before any scenario writes to it: a
/// node applies the cluster's writes, the table's creation included, a
/// moment after they were certified, so a statement sent to node 1 right
/// away could still meet "Table 'effects' doesn't exist". A read with
/// `wsrep_sync_wait` waits until its node has caught up.
pub fn create_effects(cluster: &GaleraCluster) {
    let mut conn = connect(cluster, 0);
    diesel::sql_query(
        "CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
         message_id VARCHAR(255) NOT NULL, node INT NOT NULL, KEY (message_id))",
    )
    .execute(&mut conn)
    .expect("create the effects table");
    for node in 0..NODES {
        let mut conn = connect(cluster, node);
        diesel::sql_query("SET SESSION wsrep_sync_wait = 1")
            .execute(&mut conn)
            .expect("set wsrep_sync_wait");
        diesel::sql_query("SELECT id FROM effects LIMIT 1")
            .execute(&mut conn)
            .unwrap_or_else(|error| panic!("node {node} sees the effects table: {error}"));
    }
}

pub fn connect(cluster: &GaleraCluster, node: usize) -> MysqlConnection {
    MysqlConnection::establish(&cluster.url(node)).expect("connect to a Galera node")
}

/// An r2d2 pool per node: a dead node's pool fails `get` within 2 s.
pub fn pools(cluster: &GaleraCluster, size: u32) -> Vec<MysqlPool> {
    (0..NODES)
        .map(|node| {
            Pool::builder()
                .max_size(size)
                .min_idle(Some(0))
                .connection_timeout(std::time::Duration::from_secs(2))
                .build(ConnectionManager::new(cluster.url(node)))
                .expect("build a pool")
        })
        .collect()
}

/// An r2d2 pool of `size` connections through `proxy` (to whichever node
/// it routes to), failing `get` within 2 s.
pub fn through_proxy(proxy: &inbox_tests::HaProxy, size: u32) -> MysqlPool {
    let url = format!(
        "mysql://root@127.0.0.1:{}/{}",
        proxy.port(),
        inbox_tests::galera::DATABASE
    );
    Pool::builder()
        .max_size(size)
        .min_idle(Some(0))
        .connection_timeout(std::time::Duration::from_secs(2))
        .build(ConnectionManager::new(url))
        .expect("build a pool")
}

/// Certification failures and brute-force aborts, summed over the nodes
/// that answer.
pub fn conflicts(cluster: &GaleraCluster) -> (u64, u64) {
    let sum = |name: &str| {
        (0..NODES)
            .filter_map(|node| cluster.status(node, name)?.parse::<u64>().ok())
            .sum()
    };
    (
        sum("wsrep_local_cert_failures"),
        sum("wsrep_local_bf_aborts"),
    )
}

#[derive(QueryableByName)]
struct Effect {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Integer)]
    node: i32,
}

#[derive(QueryableByName)]
struct Counts {
    #[diesel(sql_type = BigInt)]
    effects: i64,
    #[diesel(sql_type = BigInt)]
    distinct_ids: i64,
    #[diesel(sql_type = BigInt)]
    claims: i64,
}

/// Every id `prefix-0` … `prefix-{ids-1}` has exactly one effect and one
/// claim, on every node (read after the node caught up: `wsrep_sync_wait`),
/// and `processed` says each was answered `Processed` exactly once — or,
/// with `unknown_commits`, at most once: a connection lost during COMMIT
/// leaves the caller without an answer although the COMMIT took effect
/// (the redelivery is then a duplicate). Returns how many ids had no
/// `Processed` answer.
pub fn assert_exactly_once(
    cluster: &GaleraCluster,
    prefix: &str,
    ids: usize,
    processed: &[AtomicU32],
    unknown_commits: bool,
) -> usize {
    let allowed = |answers: u32| answers == 1 || (unknown_commits && answers == 0);
    let unanswered = (0..ids)
        .filter(|&i| processed[i].load(Ordering::SeqCst) == 0)
        .count();
    let twice: Vec<usize> = (0..ids)
        .filter(|&i| !allowed(processed[i].load(Ordering::SeqCst)))
        .collect();
    if !twice.is_empty() {
        let mut found = String::new();
        for node in 0..NODES {
            let mut conn = connect(cluster, node);
            for &i in twice.iter().take(5) {
                let rows: Vec<Effect> = diesel::sql_query(
                    "SELECT id, node FROM effects WHERE message_id = ? ORDER BY id",
                )
                .bind::<Text, _>(format!("{prefix}-{i}"))
                .load(&mut conn)
                .unwrap_or_default();
                let rows: Vec<(i64, i32)> = rows.iter().map(|e| (e.id, e.node)).collect();
                found.push_str(&format!(
                    "\n  node {node}: {prefix}-{i}: effects (row, consumer's node) {rows:?}"
                ));
            }
        }
        panic!(
            "{prefix}: ids not answered Processed exactly once: {:?} (answers {:?}){found}",
            &twice[..twice.len().min(10)],
            twice
                .iter()
                .take(10)
                .map(|&i| processed[i].load(Ordering::SeqCst))
                .collect::<Vec<_>>()
        );
    }
    let pattern = format!("{prefix}-%");
    for node in 0..NODES {
        let mut conn = connect(cluster, node);
        diesel::sql_query("SET SESSION wsrep_sync_wait = 1")
            .execute(&mut conn)
            .expect("causal reads");
        let counts: Counts = diesel::sql_query(
            "SELECT (SELECT COUNT(*) FROM effects WHERE message_id LIKE ?) AS effects, \
                    (SELECT COUNT(DISTINCT message_id) FROM effects WHERE message_id LIKE ?) AS distinct_ids, \
                    (SELECT COUNT(*) FROM inbox_messages WHERE handler = ? AND message_id LIKE ?) AS claims",
        )
        .bind::<Text, _>(&pattern)
        .bind::<Text, _>(&pattern)
        .bind::<Text, _>(HANDLER)
        .bind::<Text, _>(&pattern)
        .get_result(&mut conn)
        .expect("count effects and claims");
        let ids = ids as i64;
        assert_eq!(
            (counts.effects, counts.distinct_ids, counts.claims),
            (ids, ids, ids),
            "{prefix} on node {node}: (effects, distinct ids with an effect, claims)"
        );
    }
    unanswered
}
