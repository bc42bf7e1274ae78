//! What a duplicate of a fingerprinted or storing handler costs on the
//! wire on Diesel's blocking MariaDB/MySQL connection, whose cached claim
//! learns the columns of `RETURNING` only once it ran, counted by the
//! server and on the wire; the async twins are in `asynchronous.rs`.

use inbox_runtime::Outcome;
use inbox_tests::{ServerBackend, TestBackend};

use crate::handlers::*;
use crate::support::*;

/// On MariaDB the claim of a fingerprinted or storing handler reads what
/// the claim it met stored (`INSERT … RETURNING`). Diesel's blocking
/// connection reads a statement's columns before it runs it, and MariaDB
/// describes them only once it ran: a connection's first such claim runs
/// without reading and its row is read apart; from then on the cached
/// statement knows its columns. So a warm connection's fingerprinted or
/// stored result's duplicate prepares nothing and executes three
/// statements (`autocommit` off, the claim, the commit), as a plain
/// duplicate does.
pub fn a_duplicates_read_of_the_stored_claim_is_prepared_once<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    // The first duplicate of each prepares the statements.
    let first = Transfer::new("tp-1", "amount=1");
    assert_eq!(transfer(&mut conn, &first).unwrap(), Outcome::Processed(()));
    assert_eq!(transfer(&mut conn, &first).unwrap(), Outcome::Duplicate);
    assert!(
        charge(&mut conn, &Charge::new("tp-2", 5))
            .unwrap()
            .is_processed()
    );
    assert!(
        charge(&mut conn, &Charge::new("tp-2", 5))
            .unwrap()
            .is_replayed()
    );

    let fingerprinted = inbox_tests::mysql_commands_of(&mut conn, |conn| {
        assert_eq!(transfer(conn, &first).unwrap(), Outcome::Duplicate);
    });
    assert_eq!(
        fingerprinted,
        [2, 0, 3],
        "a fingerprinted duplicate, as a plain one: set option, prepare, execute"
    );
    let stored = inbox_tests::mysql_commands_of(&mut conn, |conn| {
        assert!(charge(conn, &Charge::new("tp-2", 5)).unwrap().is_replayed());
    });
    assert_eq!(
        stored,
        [2, 0, 3],
        "a stored result's duplicate, as a plain one: set option, prepare, execute"
    );
}

/// The same on the wire, through the harness proxy: a fingerprinted
/// duplicate and a stored result's cost the round trips of a plain
/// duplicate of the same handler's claims.
pub fn a_fingerprinted_duplicate_costs_a_plain_ones_round_trips<B: ServerBackend>() {
    use diesel::Connection as _;
    use inbox_tests::proxy::Proxy;

    let Some((db, _direct)) = fresh::<B>() else {
        return;
    };
    let (template, upstream) = Proxy::split_url(db.url(), B::DEFAULT_PORT);
    let proxy = Proxy::start(&upstream);
    let mut conn = B::Connection::establish(&proxy.url(&template)).expect("through the proxy");
    let plain = Transfer::new("tw-1", "amount=1");
    assert_eq!(
        transfer_unfingerprinted(&mut conn, &plain).unwrap(),
        Outcome::Processed(())
    );
    let first = Transfer::new("tw-2", "amount=1");
    assert_eq!(transfer(&mut conn, &first).unwrap(), Outcome::Processed(()));
    assert!(
        charge(&mut conn, &Charge::new("tw-3", 5))
            .unwrap()
            .is_processed()
    );
    let flights = |conn: &mut B::Connection, deliver: &dyn Fn(&mut B::Connection)| {
        deliver(conn); // prepares what it needs
        let before = proxy.flights();
        deliver(conn);
        proxy.flights() - before
    };
    let plain_duplicate = flights(&mut conn, &|conn| {
        assert_eq!(
            transfer_unfingerprinted(conn, &Transfer::new("tw-1", "amount=1")).unwrap(),
            Outcome::Duplicate
        );
    });
    let fingerprinted = flights(&mut conn, &|conn| {
        assert_eq!(
            transfer(conn, &Transfer::new("tw-2", "amount=1")).unwrap(),
            Outcome::Duplicate
        );
    });
    let stored = flights(&mut conn, &|conn| {
        assert!(charge(conn, &Charge::new("tw-3", 5)).unwrap().is_replayed());
    });
    println!(
        "round trips: plain {plain_duplicate}, fingerprinted {fingerprinted}, stored {stored}"
    );
    assert_eq!(fingerprinted, plain_duplicate);
    assert_eq!(stored, plain_duplicate);
}

inbox_tests::backend_tests!(only [mysql]:
    a_duplicates_read_of_the_stored_claim_is_prepared_once,
    a_fingerprinted_duplicate_costs_a_plain_ones_round_trips,
);
