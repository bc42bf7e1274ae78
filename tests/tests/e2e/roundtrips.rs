//! A driver for counting what a delivery costs on the wire, from outside the
//! process (`strace -f -c -e trace=sendto,write`): ignored, run on request.
//!
//! `INBOX_ROUNDTRIP_MESSAGES=N` messages are delivered once each
//! (processed); with `INBOX_ROUNDTRIP_DUPLICATES=1` each is then delivered
//! again (a duplicate). The difference between two runs, divided by `N`, is
//! the cost of one delivery: setting up the database is the same in both.
//!
//! ```text
//! INBOX_ROUNDTRIP_MESSAGES=200 strace -f -c -e trace=sendto,write \
//!     target/debug/deps/e2e-… roundtrips::mysql --ignored --exact --test-threads=1
//! ```

use diesel::connection::SimpleConnection;

use crate::handlers::apply;
use crate::support::*;

fn deliveries<B: E2e>() {
    let count: usize = std::env::var("INBOX_ROUNDTRIP_MESSAGES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let duplicates = std::env::var("INBOX_ROUNDTRIP_DUPLICATES").is_ok_and(|v| v == "1");
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let messages: Vec<Msg> = (0..count).map(|i| Msg::new(format!("rt-{i}"))).collect();
    for msg in &messages {
        apply(&mut conn, msg).expect("processed");
    }
    if duplicates {
        for msg in &messages {
            apply(&mut conn, msg).expect("duplicate");
        }
    }
}

#[cfg(feature = "postgres")]
#[test]
#[ignore = "a driver for strace, see the module docs"]
fn postgres() {
    deliveries::<inbox_tests::Postgres>();
}

#[cfg(feature = "mysql")]
#[test]
#[ignore = "a driver for strace, see the module docs"]
fn mysql() {
    deliveries::<inbox_tests::Mysql>();
}

/// On MariaDB/MySQL a delivery's transaction statements go as prepared
/// statements, one round trip each: a processed message is `autocommit`
/// off (a `SET`, which also sets the delivery's claim token), the claim,
/// the effect, and the commit (one `SET`, which checks that the claim
/// with the delivery's token is still there, turns `autocommit` on and
/// restores it): four executions of statements the connection prepared
/// once. A duplicate is three: `autocommit` off, the claim, the commit.
/// The server counts the two `SET`s as `Com_set_option`; Diesel's
/// `batch_execute` would add two more per statement (it switches
/// multi-statement mode on and off around each).
pub fn mysql_transaction_statements_take_one_round_trip_each<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let [processed, duplicate] = delivery_costs(&mut conn);
    assert_eq!(
        processed,
        [2, 0, 4],
        "processed: set option, prepare, execute"
    );
    assert_eq!(
        duplicate,
        [2, 0, 3],
        "duplicate: set option, prepare, execute"
    );
}

/// On an inbox whose claim-token migration has not run, the claim that
/// writes the token is refused when prepared (each time: a statement the
/// server refused is not cached), and the delivery claims again without
/// it and guards its transaction with a savepoint: a processed message
/// costs three round trips more than with the token (the refused
/// prepare, the savepoint, its release), a duplicate one more.
pub fn mysql_without_claim_tokens_costs_the_refused_claim_and_the_savepoint<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    conn.batch_execute("ALTER TABLE inbox_messages DROP COLUMN claim_token")
        .expect("an inbox from before the claim token");
    let [processed, duplicate] = delivery_costs(&mut conn);
    assert_eq!(
        processed,
        [2, 1, 6],
        "processed: set option, prepare, execute"
    );
    assert_eq!(
        duplicate,
        [2, 1, 3],
        "duplicate: set option, prepare, execute"
    );
}

/// What a processed message and then its duplicate cost `conn` in the
/// server's counters (`inbox_tests::mysql_commands_of`), once a first
/// delivery prepared the statements and a failed one the `ROLLBACK`.
fn delivery_costs<C: Effects + inbox_tests::SqlRows>(conn: &mut C) -> [[i64; 3]; 2] {
    apply(conn, &Msg::new("warm-up")).expect("processed");
    apply(conn, &Msg::with_mode("warm-up-fails", Mode::Fail)).expect_err("the body fails");
    let msg = Msg::new("m-1");
    let processed = inbox_tests::mysql_commands_of(conn, |conn| {
        apply(conn, &msg).expect("processed");
    });
    let duplicate = inbox_tests::mysql_commands_of(conn, |conn| {
        apply(conn, &msg).expect("duplicate");
    });
    [processed, duplicate]
}

inbox_tests::backend_tests!(only [mysql]: mysql_transaction_statements_take_one_round_trip_each, mysql_without_claim_tokens_costs_the_refused_claim_and_the_savepoint);
