//! Claim cost as the inbox grows: `cargo bench -p inbox-tests --bench
//! throughput --features postgres,mysql -- growth`.
//!
//! For each inbox size the inbox is prefilled (PostgreSQL and MariaDB/MySQL:
//! plain layout; PostgreSQL also the generation layout, the same rows split
//! over archived generations and the current one), then `handler` (a claim
//! and the effect in one transaction, through `run_idempotent`) and
//! `no-dedup` (the effect alone) run in interleaved rounds on 4
//! connections, new ids each delivery (random UUIDs unless
//! `INBOX_BENCH_GROWTH_IDS` says otherwise). Printed per case: claims/s,
//! the ratio claim+effect / effect alone (median of the per-round ratios),
//! that ratio against the empty inbox's, the primary key's size, and the
//! write-ahead log (PostgreSQL: `pg_current_wal_insert_lsn`) or redo log
//! (MariaDB: `Innodb_lsn_current`) written per delivery of each variant
//! during its slices, whose difference is the claim's share.
//!
//! Prefilling writes the rows with their primary key dropped, then builds
//! it (a sorted build, minutes instead of hours at 30 M rows), then
//! `CHECKPOINT` (PostgreSQL): the log figures are those of the minutes after
//! a checkpoint, when every page's first change writes a full-page image
//! (the worst, and the steady state once the key outgrows what one
//! checkpoint interval's claims touch).
//!
//! # Settings (environment)
//!
//! - `INBOX_BENCH_GROWTH_ROWS`: plain-layout sizes, `0,1M,10M,30M`;
//! - `INBOX_BENCH_GROWTH_GENERATIONS`: archived generations of the
//!   generation layout, `0,2,4,30` (PostgreSQL); each case holds
//!   `INBOX_BENCH_GROWTH_GENERATION_ROWS` (`30M`) rows split evenly over
//!   its archived generations and the current one;
//! - `INBOX_BENCH_GROWTH_IDS`: `random` (UUIDv4), `ordered` (UUIDv7),
//!   `counter`; default `random,ordered`, each measured on the same
//!   prefilled inbox;
//! - `INBOX_BENCH_GROWTH_WAL_COMPRESSION`: `lz4`, `pglz` or `zstd`: the
//!   delivering PostgreSQL sessions compress full-page images (a superuser
//!   setting);
//! - `INBOX_BENCH_BACKENDS` (`postgres,mysql`), `INBOX_BENCH_ROUNDS` (10),
//!   `INBOX_BENCH_SLICE_MS` (2000), `INBOX_BENCH_CONNECTIONS` (4, the
//!   first value).

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use inbox_tests::SqlRows;

use crate::servers::Server;
use crate::{Config, Ids, Measured, Variant, Worker, env_list, env_number, load_average, median};

const VARIANTS: [Variant; 2] = [Variant::NoDedup, Variant::Handler];

/// What a growth run measures.
struct Growth {
    rows: Vec<u64>,
    /// The generation layout's (PostgreSQL only).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    generations: Vec<u64>,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    generation_rows: u64,
    ids: Vec<Ids>,
    /// The rounds (their number and slice length, growth's own defaults).
    config: Config,
    connections: usize,
}

/// `30M`, `1.5M`, `200k`, `1000`.
fn count(text: &str) -> u64 {
    let (number, scale) = match text.as_bytes().last() {
        Some(b'M' | b'm') => (&text[..text.len() - 1], 1e6),
        Some(b'k' | b'K') => (&text[..text.len() - 1], 1e3),
        _ => (text, 1.0),
    };
    let value: f64 = number
        .parse()
        .unwrap_or_else(|_| panic!("`{text}`: a count such as 30M, 200k or 1000"));
    (value * scale) as u64
}

impl Growth {
    fn from_env() -> Growth {
        let counts =
            |name: &str, default: &str| env_list(name, default).iter().map(|n| count(n)).collect();
        Growth {
            rows: counts("INBOX_BENCH_GROWTH_ROWS", "0,1M,10M,30M"),
            generations: counts("INBOX_BENCH_GROWTH_GENERATIONS", "0,2,4,30"),
            generation_rows: count(
                &std::env::var("INBOX_BENCH_GROWTH_GENERATION_ROWS")
                    .unwrap_or_else(|_| "30M".into()),
            ),
            ids: env_list("INBOX_BENCH_GROWTH_IDS", "random,ordered")
                .iter()
                .map(|name| match name.as_str() {
                    "random" => Ids::Random,
                    "ordered" => Ids::TimeOrdered,
                    "counter" => Ids::Counter,
                    other => panic!("INBOX_BENCH_GROWTH_IDS: no id kind `{other}`"),
                })
                .collect(),
            config: Config {
                rounds: env_number("INBOX_BENCH_ROUNDS", 10) as usize,
                slice: Duration::from_millis(env_number("INBOX_BENCH_SLICE_MS", 2000)),
                ..Config::from_env()
            },
            connections: env_list("INBOX_BENCH_CONNECTIONS", "4")[0]
                .parse()
                .expect("INBOX_BENCH_CONNECTIONS: a number"),
        }
    }
}

/// Runs the growth cases on every backend of `INBOX_BENCH_BACKENDS`.
pub fn run() {
    let growth = Growth::from_env();
    println!(
        "growth: {} rounds x {} ms per variant, {} connections, load average {}",
        growth.config.rounds,
        growth.config.slice.as_millis(),
        growth.connections,
        load_average()
    );
    for backend in env_list("INBOX_BENCH_BACKENDS", "postgres,mysql") {
        match backend.as_str() {
            #[cfg(feature = "postgres")]
            "postgres" => postgres(&growth),
            #[cfg(feature = "mysql")]
            "mysql" => plain::<inbox_tests::Mysql>("MariaDB/MySQL", &growth),
            other => println!("\n{other}: not in this build, or no growth cases"),
        }
    }
}

/// What a server needs for the growth cases: adding rows, sizing the key,
/// reading the log position.
pub trait Grows: Server {
    /// Adds `rows` random ids to the inbox's current table.
    fn prefill(conn: &mut Self::Connection, rows: u64);
    /// Bytes in the inbox's primary key(s), every generation included.
    fn key_bytes(conn: &mut Self::Connection) -> i64;
    /// The log's position in bytes.
    fn log_position(conn: &mut Self::Connection) -> i64;
    /// Full-page images written to the log so far, where the server counts
    /// them.
    fn full_page_images(conn: &mut Self::Connection) -> Option<i64>;
    /// What every delivering connection sends first (PostgreSQL:
    /// `INBOX_BENCH_GROWTH_WAL_COMPRESSION`).
    fn session_sql() -> Option<String>;
    /// Starts each case's log figures the same way (PostgreSQL: a
    /// `CHECKPOINT`).
    fn settle(conn: &mut Self::Connection);
}

#[cfg(feature = "postgres")]
impl Grows for inbox_tests::Postgres {
    fn prefill(conn: &mut Self::Connection, rows: u64) {
        if rows == 0 {
            return;
        }
        conn.batch_execute(&format!(
            "DO $$
             DECLARE
                 key_name TEXT;
             BEGIN
                 SELECT conname INTO key_name FROM pg_constraint
                     WHERE conrelid = 'inbox_messages'::regclass AND contype = 'p';
                 EXECUTE format('ALTER TABLE inbox_messages DROP CONSTRAINT %I', key_name);
                 DROP INDEX IF EXISTS inbox_messages_received_at_idx;
                 DROP INDEX IF EXISTS inbox_messages_handler_received_at_idx;
                 ALTER TABLE inbox_messages DISABLE TRIGGER USER;
                 INSERT INTO inbox_messages (handler, message_id, received_at)
                     SELECT '{handler}', gen_random_uuid()::text, now() - random() * interval '1 day'
                     FROM generate_series(1, {rows});
                 ALTER TABLE inbox_messages ENABLE TRIGGER USER;
                 EXECUTE format('ALTER TABLE inbox_messages ADD CONSTRAINT %I PRIMARY KEY (handler, message_id)', key_name);
                 CREATE INDEX inbox_messages_received_at_idx ON inbox_messages (received_at);
                 CREATE INDEX inbox_messages_handler_received_at_idx
                     ON inbox_messages (handler, (received_at AT TIME ZONE 'UTC'));
             END
             $$;
             ANALYZE inbox_messages;",
            handler = crate::HANDLER,
        ))
        .expect("prefill the inbox");
    }

    fn key_bytes(conn: &mut Self::Connection) -> i64 {
        conn.bigint(
            "SELECT coalesce(sum(pg_relation_size(x.indexrelid)), 0)::bigint AS value
             FROM pg_index x JOIN pg_class t ON t.oid = x.indrelid
             WHERE x.indisprimary
               AND t.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'inbox_messages'::regclass)
               AND (t.relname = 'inbox_messages' OR t.relname LIKE 'inbox\\_messages\\_g%')",
        )
    }

    fn log_position(conn: &mut Self::Connection) -> i64 {
        conn.bigint("SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint AS value")
    }

    fn full_page_images(conn: &mut Self::Connection) -> Option<i64> {
        Some(conn.bigint("SELECT wal_fpi AS value FROM pg_stat_wal"))
    }

    fn session_sql() -> Option<String> {
        std::env::var("INBOX_BENCH_GROWTH_WAL_COMPRESSION")
            .ok()
            .map(|method| format!("SET wal_compression = '{method}'"))
    }

    fn settle(conn: &mut Self::Connection) {
        conn.batch_execute("CHECKPOINT").expect("CHECKPOINT");
    }
}

#[cfg(feature = "mysql")]
impl Grows for inbox_tests::Mysql {
    fn prefill(conn: &mut Self::Connection, rows: u64) {
        if rows == 0 {
            return;
        }
        // InnoDB rebuilds the table sorted when the key comes back.
        conn.batch_execute(&format!(
            "ALTER TABLE inbox_messages DROP PRIMARY KEY,
                 DROP INDEX inbox_messages_received_at_idx,
                 DROP INDEX inbox_messages_handler_received_at_idx;
             INSERT INTO inbox_messages (handler, message_id, received_at)
                 SELECT '{handler}',
                        INSERT(INSERT(INSERT(INSERT(MD5(CONCAT(UUID(), seq)), 9, 0, '-'), 14, 0, '-'), 19, 0, '-'), 24, 0, '-'),
                        UTC_TIMESTAMP(6) - INTERVAL FLOOR(RAND() * 86400) SECOND
                 FROM seq_1_to_{rows};
             ALTER TABLE inbox_messages ADD PRIMARY KEY (handler, message_id),
                 ADD KEY inbox_messages_received_at_idx (received_at),
                 ADD KEY inbox_messages_handler_received_at_idx (handler, received_at);
             ANALYZE TABLE inbox_messages;",
            handler = crate::HANDLER,
        ))
        .expect("prefill the inbox");
    }

    fn key_bytes(conn: &mut Self::Connection) -> i64 {
        // The primary key is the table (clustered).
        conn.bigint(
            "SELECT CAST(data_length AS SIGNED) AS value FROM information_schema.tables
             WHERE table_schema = DATABASE() AND table_name = 'inbox_messages'",
        )
    }

    fn log_position(conn: &mut Self::Connection) -> i64 {
        conn.bigint(
            "SELECT CAST(variable_value AS SIGNED) AS value FROM information_schema.global_status
             WHERE variable_name = 'INNODB_LSN_CURRENT'",
        )
    }

    fn full_page_images(_: &mut Self::Connection) -> Option<i64> {
        None // InnoDB protects torn pages with its doublewrite buffer, not the redo log
    }

    fn session_sql() -> Option<String> {
        None
    }

    fn settle(_: &mut Self::Connection) {}
}

/// The plain layout at every size of `INBOX_BENCH_GROWTH_ROWS`, growing one
/// inbox; every id kind at each size.
fn plain<B: Grows>(name: &str, growth: &Growth) {
    let Some(db) = B::open() else {
        println!("\n{name}: skipped (not reachable)");
        return;
    };
    println!(
        "\n{name}, plain layout{}",
        B::session_sql().map_or(String::new(), |sql| format!(" ({sql})"))
    );
    let mut admin = db.connect();
    admin
        .batch_execute(&crate::connections::accounts_sql(growth.connections))
        .expect("create the accounts");
    let mut empty = Empty::default();
    let mut filled = 0;
    for &rows in &growth.rows {
        let started = Instant::now();
        B::prefill(&mut admin, rows.saturating_sub(filled));
        filled = filled.max(rows);
        println!(
            "  {rows} rows (prefilled in {:.0} s)",
            started.elapsed().as_secs_f64()
        );
        for &ids in &growth.ids {
            measure::<B>(&db, &mut admin, growth, ids, &mut empty);
        }
    }
}

/// Each id kind's ratio on the first (empty) inbox of a series.
#[derive(Default)]
struct Empty(Vec<(Ids, f64)>);

impl Empty {
    fn ratio(&mut self, ids: Ids, ratio: f64) -> f64 {
        match self.0.iter().find(|(kind, _)| *kind == ids) {
            Some(&(_, empty)) => empty,
            None => {
                self.0.push((ids, ratio));
                ratio
            }
        }
    }
}

/// The generation layout with each count of archived generations.
#[cfg(feature = "postgres")]
fn postgres(growth: &Growth) {
    use inbox_runtime::prune::partitioned;
    use inbox_tests::{Postgres, TestBackend};

    plain::<Postgres>("PostgreSQL", growth);
    if growth.generations.is_empty() {
        return;
    }
    println!(
        "\nPostgreSQL, generation layout, {} rows over the generations",
        growth.generation_rows,
    );
    let mut empty = Empty::default();
    for &archived in &growth.generations {
        let Some(db) = Postgres::open() else { return };
        let mut admin = db.connect();
        admin
            .batch_execute(&crate::connections::accounts_sql(growth.connections))
            .expect("create the accounts");
        partitioned::setup(&mut admin).expect("the generation layout");
        let started = Instant::now();
        let per_generation = if archived == 0 {
            0
        } else {
            growth.generation_rows / (archived + 1)
        };
        for _ in 0..archived {
            Postgres::prefill(&mut admin, per_generation);
            partitioned::rotate(&mut admin, Duration::from_secs(60)).expect("rotate");
        }
        Postgres::prefill(&mut admin, per_generation);
        println!(
            "  {archived} archived + current, {per_generation} rows each (prefilled in {:.0} s)",
            started.elapsed().as_secs_f64()
        );
        for &ids in &growth.ids {
            measure::<Postgres>(&db, &mut admin, growth, ids, &mut empty);
        }
    }
}

/// Runs the interleaved rounds on a prefilled inbox, after a checkpoint,
/// and prints its line.
fn measure<B: Grows>(
    db: &B,
    admin: &mut B::Connection,
    growth: &Growth,
    ids: Ids,
    empty: &mut Empty,
) {
    let mut workers: Vec<Worker<B::Connection>> = (0..growth.connections)
        .map(|account| {
            let mut conn = db.connect();
            if let Some(sql) = B::session_sql() {
                conn.batch_execute(&sql).expect("configure the session");
            }
            let mut worker = Worker::new(conn, account as i64);
            worker.ids = ids;
            worker
        })
        .collect();
    B::settle(admin);
    // Per variant: log bytes, full-page images, messages.
    let mut log = [(0_i64, 0_i64, 0_usize); VARIANTS.len()];
    let mut counts_images = false;
    let mut measured: Vec<Measured> =
        crate::rounds(&growth.config, &VARIANTS, |variant, length| {
            let (bytes, images) = (B::log_position(admin), B::full_page_images(admin));
            let sample = crate::slice_sync(&mut workers, variant, length);
            let at = VARIANTS
                .iter()
                .position(|&v| v == variant)
                .expect("a growth variant");
            log[at].0 += B::log_position(admin) - bytes;
            if let Some((after, before)) = B::full_page_images(admin).zip(images) {
                counts_images = true;
                log[at].1 += after - before;
            }
            log[at].2 += sample.messages;
            sample
        });
    let per_delivery = |at: usize, value: i64| value as f64 / log[at].2.max(1) as f64;
    let (effect_log, claim_log) = (per_delivery(0, log[0].0), per_delivery(1, log[1].0));
    let images = if counts_images {
        format!(
            ", full-page images/delivery {:.2} and {:.2}",
            per_delivery(0, log[0].1),
            per_delivery(1, log[1].1)
        )
    } else {
        String::new()
    };
    let mut ratios: Vec<f64> = measured[1]
        .throughputs
        .iter()
        .zip(&measured[0].throughputs)
        .map(|(claimed, alone)| claimed / alone)
        .collect();
    let ratio = median(&mut ratios);
    let against_empty = ratio / empty.ratio(ids, ratio);
    println!(
        "    {:<20} claims/s {:>5.0}  effect alone/s {:>5.0}  ratio {ratio:.3} ({:.2}-{:.2})  x empty {against_empty:.3}  \
         key {} MB  log/delivery: effect {effect_log:.0} B, claim+effect {claim_log:.0} B, claim {:.0} B{images}  (load {})",
        ids.name(),
        median(&mut measured[1].throughputs),
        median(&mut measured[0].throughputs),
        ratios.first().copied().unwrap_or(f64::NAN),
        ratios.last().copied().unwrap_or(f64::NAN),
        B::key_bytes(admin) / 1_000_000,
        claim_log - effect_log,
        load_average(),
    );
}
