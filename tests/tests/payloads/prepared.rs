//! What a duplicate of a fingerprinted or storing handler costs on the
//! wire where the claim cannot read the stored claim itself (MariaDB/MySQL
//! on Diesel's blocking connections), counted by the server; the async
//! twins, which read it in the claim, are in `asynchronous.rs`.

use inbox_runtime::Outcome;
use inbox_tests::{ServerBackend, TestBackend};

use crate::handlers::*;
use crate::support::*;

/// On MariaDB/MySQL, where the claim cannot read what the claim it met
/// stored, a fingerprinted duplicate's commit compares the fingerprint
/// itself (it commits only if the claim it met stored no other): it
/// prepares nothing and executes three statements (`autocommit` off, the
/// claim, the commit), as a plain duplicate does. A stored result's
/// duplicate reads the result with a statement of its own, one the
/// connection prepared once, as it did the claim: four statements, one
/// round trip more than a plain duplicate, not two.
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
        [2, 0, 4],
        "a stored result's duplicate: set option, prepare, execute"
    );
}

/// The same on the wire, through the harness proxy: a fingerprinted
/// duplicate costs the round trips of a plain duplicate of the same
/// handler's claims, a stored result's one more.
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
    assert_eq!(stored, plain_duplicate + 1);
}

inbox_tests::backend_tests!(only [mysql]:
    a_duplicates_read_of_the_stored_claim_is_prepared_once,
    a_fingerprinted_duplicate_costs_a_plain_ones_round_trips,
);
