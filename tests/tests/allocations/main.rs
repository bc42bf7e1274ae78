//! Heap allocations per delivery, counted by a counting global allocator:
//! what the inbox itself allocates for a processed message (whose body
//! writes nothing) and for a duplicate, with a text id and an integer id,
//! once the connection has prepared its statements. The counts are pinned
//! as upper bounds on SQLite (every backend's driver allocates on its own
//! for each statement, so PostgreSQL's and MariaDB's are printed, not
//! pinned).
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

#[test]
fn allocations_per_delivery() {
    let db = inbox_tests::Sqlite::open().expect("SQLite is embedded");
    let sqlite = counts(&mut db.connect());
    println!("sqlite: {sqlite:?}");
    #[cfg(feature = "postgres")]
    if let Some(db) = inbox_tests::Postgres::open() {
        println!("postgres: {:?}", counts(&mut db.connect()));
    }
    #[cfg(feature = "mysql")]
    if let Some(db) = inbox_tests::Mysql::open() {
        println!("mysql: {:?}", counts(&mut db.connect()));
    }
    #[cfg(all(feature = "postgres", feature = "async"))]
    asynchronous::print_postgres();
    // SQLite: the statements' own (Diesel's): `BEGIN` and `COMMIT` one
    // each, the claim three; the key none, its id inline, an integer
    // written straight into it (it took one more, a `String`, before).
    // With the `metrics` feature, the labels of the delivery's three
    // metrics take one each, with or without a recorder.
    let per_delivery = 5 + if cfg!(feature = "metrics") { 3 } else { 0 };
    let bound = Counts {
        text_processed: per_delivery,
        text_duplicate: per_delivery,
        number_processed: per_delivery,
        number_duplicate: per_delivery,
    };
    assert!(
        sqlite.text_processed <= bound.text_processed
            && sqlite.text_duplicate <= bound.text_duplicate
            && sqlite.number_processed <= bound.number_processed
            && sqlite.number_duplicate <= bound.number_duplicate,
        "more allocations per delivery than before: {sqlite:?}, bound {bound:?}"
    );
}

/// Async PostgreSQL, printed: a handler written for `AsyncPgConnection`
/// (its `BEGIN` held and sent with the claim) against the same handler
/// written generic over its connection.
#[cfg(all(feature = "postgres", feature = "async"))]
mod asynchronous {
    use diesel_async::{AsyncConnection, AsyncPgConnection};
    use inbox_runtime::{InboxBackend, idempotent};
    use inbox_tests::{AppError, TestBackend};

    use super::{Text, allocations};

    #[idempotent(id = msg.id, handler = "allocations.async", shared_scope)]
    async fn for_the_type(conn: &mut AsyncPgConnection, msg: &Text) -> Result<(), AppError> {
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

    pub fn print_postgres() {
        let Some(db) = inbox_tests::Postgres::open() else {
            return;
        };
        let runtime = inbox_tests::runtime::current_thread();
        let mut conn = runtime.block_on(db.connect_async());
        let mut most = [[0; 2]; 2];
        for n in 0..8 {
            for (way, written) in most.iter_mut().enumerate() {
                let text = Text {
                    id: format!("async-{way}-{n}"),
                };
                let mut deliver = || {
                    runtime.block_on(async {
                        match way {
                            0 => for_the_type(&mut conn, &text).await,
                            _ => generic(&mut conn, &text).await,
                        }
                    })
                };
                let processed = allocations(|| deliver().expect("processed"));
                let duplicate = allocations(|| deliver().expect("duplicate"));
                // The first three prepare the statements.
                if n >= 3 {
                    written[0] = written[0].max(processed);
                    written[1] = written[1].max(duplicate);
                }
            }
        }
        println!(
            "postgres, async (processed, duplicate): written for the type {:?}, generic {:?}",
            most[0], most[1]
        );
    }
}
