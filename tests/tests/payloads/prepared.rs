//! What a duplicate of a fingerprinted or storing handler costs on the
//! wire where the claim cannot read the stored claim itself (MariaDB/MySQL
//! on Diesel's blocking connections), counted by the server; the async
//! twins, which read it in the claim, are in `asynchronous.rs`.

use inbox_runtime::Outcome;
use inbox_tests::TestBackend;

use crate::handlers::*;
use crate::support::*;

/// On MariaDB/MySQL, where the claim cannot read what the claim it met
/// stored, the duplicate reads it with a statement of its own: one the
/// connection prepared once, as it did the claim. A fingerprinted duplicate,
/// and a stored result's, then prepare nothing and execute four statements
/// (`autocommit` off, the claim, the read, the commit): one round trip more
/// than a plain duplicate, not two.
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
        [2, 0, 4],
        "a fingerprinted duplicate: set option, prepare, execute"
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

inbox_tests::backend_tests!(only [mysql]: a_duplicates_read_of_the_stored_claim_is_prepared_once);
