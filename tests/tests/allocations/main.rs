//! Heap allocations per delivery, counted by a counting global allocator:
//! what a delivery allocates for a processed message (whose body writes
//! nothing) and for a duplicate, with a text id and an integer id, once the
//! connection has prepared its statements. Each count is pinned as an upper
//! bound: the inbox's own allocations and its drivers' (Diesel's, and on
//! async connections tokio-postgres's and mysql_async's; libpq and the
//! MariaDB client allocate outside Rust's allocator and are not counted),
//! with the versions `Cargo.lock` pins. A count that grows fails the test;
//! one that shrinks is worth pinning lower.
//!
//! The counter is process-wide, so the suite is one test that delivers
//! sequentially, alone in its binary.
//!
//! Run: `cargo test -p inbox-tests --features sqlite --test allocations -- --nocapture`

#![cfg(feature = "sqlite")]
#![allow(missing_docs)]

use std::alloc::System;

use diesel::connection::LoadConnection;
use inbox_runtime::{InboxBackend, idempotent};
use inbox_tests::{AppError, TestBackend};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

pub struct Text {
    pub id: String,
}

pub struct Numbered {
    pub id: u64,
}

#[idempotent(id = msg.id, handler = "allocations.text")]
fn by_text<C>(conn: &mut C, msg: &Text) -> Result<(), AppError>
where
    C: LoadConnection<Backend: InboxBackend>,
{
    let _ = (conn, msg);
    Ok(())
}

#[idempotent(id = msg.id, handler = "allocations.numbered")]
fn by_number<C>(conn: &mut C, msg: &Numbered) -> Result<(), AppError>
where
    C: LoadConnection<Backend: InboxBackend>,
{
    let _ = (conn, msg);
    Ok(())
}

/// Allocations (and reallocations) made while `deliver` runs.
fn allocations(deliver: impl FnOnce()) -> usize {
    let region = Region::new(GLOBAL);
    deliver();
    let change = region.change();
    change.allocations + change.reallocations
}

/// Per delivery, the most any of a few took: text id processed, text id
/// duplicate, integer id processed, integer id duplicate.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Counts {
    text_processed: usize,
    text_duplicate: usize,
    number_processed: usize,
    number_duplicate: usize,
}

fn counts<C>(conn: &mut C) -> Counts
where
    C: LoadConnection<Backend: InboxBackend>,
{
    // The first deliveries prepare the statements.
    for n in 0..3 {
        let text = Text {
            id: format!("warm-{n}"),
        };
        by_text(conn, &text).expect("processed");
        by_text(conn, &text).expect("duplicate");
        let number = Numbered { id: 1_000_000 + n };
        by_number(conn, &number).expect("processed");
        by_number(conn, &number).expect("duplicate");
    }
    let mut most = Counts {
        text_processed: 0,
        text_duplicate: 0,
        number_processed: 0,
        number_duplicate: 0,
    };
    for n in 0..5 {
        let text = Text {
            id: format!("message-{n:04}"),
        };
        let number = Numbered {
            id: 12_345_678_901 + n,
        };
        let processed = allocations(|| by_text(conn, &text).expect("processed"));
        let duplicate = allocations(|| by_text(conn, &text).expect("duplicate"));
        most.text_processed = most.text_processed.max(processed);
        most.text_duplicate = most.text_duplicate.max(duplicate);
        let processed = allocations(|| by_number(conn, &number).expect("processed"));
        let duplicate = allocations(|| by_number(conn, &number).expect("duplicate"));
        most.number_processed = most.number_processed.max(processed);
        most.number_duplicate = most.number_duplicate.max(duplicate);
    }
    most
}

/// What the `metrics` feature adds to every delivery: the labels of its
/// three metrics, one allocation each, with or without a recorder.
const METRICS: usize = if cfg!(feature = "metrics") { 3 } else { 0 };

impl Counts {
    /// `processed` for both processed counts, `duplicate` for both
    /// duplicates, plus what the `metrics` feature adds ([`METRICS`]).
    fn at_most(processed: usize, duplicate: usize) -> Counts {
        let metrics = METRICS;
        Counts {
            text_processed: processed + metrics,
            text_duplicate: duplicate + metrics,
            number_processed: processed + metrics,
            number_duplicate: duplicate + metrics,
        }
    }

    fn within(&self, bound: &Counts) -> bool {
        self.text_processed <= bound.text_processed
            && self.text_duplicate <= bound.text_duplicate
            && self.number_processed <= bound.number_processed
            && self.number_duplicate <= bound.number_duplicate
    }
}

/// The PostgreSQL server, unless the suite reaches it through PgBouncer's
/// transaction pooling, where the statement cache is off: every statement
/// is written out on every execution, and the pins are for the cache on.
#[cfg(feature = "postgres")]
fn postgres() -> Option<inbox_tests::Postgres> {
    if inbox_tests::skipped_behind_pgbouncer("the counts are pinned with the statement cache on") {
        return None;
    }
    inbox_tests::Postgres::open()
}

/// Prints `counts` of `backend` and fails if any is above `bound`.
fn pinned(backend: &str, counts: Counts, bound: Counts) {
    println!("{backend}: {counts:?}");
    assert!(
        counts.within(&bound),
        "{backend}: more allocations per delivery than pinned: {counts:?}, bound {bound:?}"
    );
}

#[test]
fn allocations_per_delivery() {
    let db = inbox_tests::Sqlite::open().expect("SQLite is embedded");
    // The statements' own (Diesel's): `BEGIN` and `COMMIT` one each, the
    // claim three; the key none, its id inline, an integer written straight
    // into it.
    pinned("sqlite", counts(&mut db.connect()), Counts::at_most(5, 5));
    // Diesel's binds and its statement cache's lookups: the claim's by its
    // type (a bounded claim's was by its text, written out each time: 15).
    #[cfg(feature = "postgres")]
    if let Some(db) = postgres() {
        pinned(
            "postgres",
            counts(&mut db.connect()),
            Counts::at_most(10, 10),
        );
    }
    // The bounded claim's text carries its bound (`SET STATEMENT`), so
    // Diesel's cache finds it by that text (written out in one piece); the
    // commit that checks the claim token is found by its type, its two
    // binds Diesel's; `autocommit` off and a duplicate's commit by their
    // texts. (Before the claim token: 16 and 14, with a savepoint set and
    // released by its text, and the bound's prefix formatted apart.)
    #[cfg(feature = "mysql")]
    if let Some(db) = inbox_tests::Mysql::open() {
        pinned("mysql", counts(&mut db.connect()), Counts::at_most(15, 10));
    }
    #[cfg(all(feature = "postgres", feature = "async"))]
    asynchronous::postgres();
    #[cfg(all(feature = "mysql", feature = "async"))]
    asynchronous::mysql();
}

/// Async connections, pinned: on PostgreSQL a handler written for
/// `AsyncPgConnection` (its `BEGIN` held and sent with the claim) against the
/// same handler written generic over its connection; on MySQL/MariaDB the
/// generic handler (its begin and claim sent as one text).
#[cfg(feature = "async")]
mod asynchronous {
    use diesel_async::AsyncConnection;
    use inbox_runtime::{InboxBackend, idempotent};
    use inbox_tests::{AppError, TestBackend};

    use super::{Text, allocations};

    #[cfg(feature = "postgres")]
    #[idempotent(id = msg.id, handler = "allocations.async", shared_scope)]
    async fn for_the_type(
        conn: &mut diesel_async::AsyncPgConnection,
        msg: &Text,
    ) -> Result<(), AppError> {
        let _ = (conn, msg);
        Ok(())
    }

    #[idempotent(id = msg.id, handler = "allocations.async", shared_scope)]
    async fn generic<C>(conn: &mut C, msg: &Text) -> Result<(), AppError>
    where
        C: AsyncConnection<Backend: InboxBackend>,
    {
        let _ = (conn, msg);
        Ok(())
    }

    /// One way of delivering a message.
    type Deliver<'a> = dyn FnMut(&Text) -> Result<(), AppError> + 'a;

    /// For each way of delivering, the most a delivery of a new id
    /// (processed) and of the same id again (duplicate) took, of five after
    /// three that prepare the statements; the ways take turns.
    fn most_per_delivery(ways: &mut [&mut Deliver<'_>]) -> Vec<[usize; 2]> {
        let mut most = vec![[0; 2]; ways.len()];
        for n in 0..8 {
            for (way, (deliver, most)) in ways.iter_mut().zip(&mut most).enumerate() {
                let text = Text {
                    id: format!("async-{way}-{n}"),
                };
                let processed = allocations(|| deliver(&text).expect("processed"));
                let duplicate = allocations(|| deliver(&text).expect("duplicate"));
                if n >= 3 {
                    *most = [most[0].max(processed), most[1].max(duplicate)];
                }
            }
        }
        most
    }

    /// Fails unless each of `most` is within its `bound` (plus what the
    /// `metrics` feature adds).
    fn pinned(backend: &str, most: &[[usize; 2]], bounds: &[[usize; 2]]) {
        let bounds: Vec<[usize; 2]> = bounds
            .iter()
            .map(|bound| bound.map(|count| count + super::METRICS))
            .collect();
        assert!(
            most.iter()
                .zip(&bounds)
                .all(|(counts, bound)| counts[0] <= bound[0] && counts[1] <= bound[1]),
            "{backend}, async: more allocations per delivery than pinned: {most:?}, bound {bounds:?}"
        );
    }

    /// All of the allocations are diesel-async's and tokio-postgres's, per
    /// statement (channels, buffers, the statement's text, built on every
    /// execution); the inbox's own texts (the `BEGIN` with its idle bound)
    /// are written inline. Written for the type, the `BEGIN` and the claim
    /// are in flight together: the driver's write buffer is still held by
    /// the first when it writes the second, and allocates anew. (Before
    /// the texts were inline: 42 / 43 and 39 / 39.)
    #[cfg(feature = "postgres")]
    pub fn postgres() {
        let Some(db) = super::postgres() else {
            return;
        };
        let runtime = inbox_tests::runtime::current_thread();
        let conn = std::cell::RefCell::new(runtime.block_on(db.connect_async()));
        let most = most_per_delivery(&mut [
            &mut |text| runtime.block_on(for_the_type(&mut conn.borrow_mut(), text)),
            &mut |text| runtime.block_on(generic(&mut *conn.borrow_mut(), text)),
        ]);
        println!(
            "postgres, async (processed, duplicate): written for the type {:?}, generic {:?}",
            most[0], most[1]
        );
        pinned("postgres", &most, &[[41, 42], [38, 38]]);
    }

    /// mysql_async's per statement (a duplicate's error among them), and the
    /// inbox's text of the begin and the claim (the key's bytes as hex
    /// literals), written in one allocation of the size it needs; the
    /// transaction's endings with their idle bound are written inline.
    /// (Before both were: 25 / 29.)
    #[cfg(feature = "mysql")]
    pub fn mysql() {
        let Some(db) = inbox_tests::Mysql::open() else {
            return;
        };
        let runtime = inbox_tests::runtime::current_thread();
        let mut conn = runtime.block_on(db.connect_async());
        let most = most_per_delivery(&mut [&mut |text| runtime.block_on(generic(&mut conn, text))]);
        println!("mysql, async (processed, duplicate): generic {:?}", most[0]);
        pinned("mysql", &most, &[[16, 20]]);
    }
}
