//! Retention and dead messages: pruning removes dead records with their
//! claims once they are older than the retention window. A dead record that
//! outlived its pruned claim would be wrong three ways: the redelivery runs
//! the body again (the claim is gone), could never be made dead again
//! (`mark_exhausted` wants `dead_at IS NULL`), and once processed would
//! still be listed as dead, so `revive` would delete its processed claim.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use inbox_runtime::{Prune, RetentionPolicy, dead_letters};
use inbox_tests::TestBackend;

use crate::handlers::*;
use crate::support::*;

pub fn pruning_forgets_a_dead_message_with_its_claim<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut ops = db.connect();
    for attempt in 1..=3 {
        let _ = three(
            &mut conn,
            &Msg::failing("old-dead", &format!("boom {attempt}")),
        );
    }
    assert_eq!(
        failure_row::<B>(&mut ops, THREE, "old-dead"),
        exhausted(3, "boom 3")
    );
    // Thirty days ago, by the database clock.
    let ago = B::ago_sql(30 * 86_400);
    ops.batch_execute(&format!("UPDATE inbox_messages SET received_at = {ago}"))
        .unwrap();
    ops.batch_execute(&format!(
        "UPDATE inbox_failures SET first_failed_at = {ago}, last_failed_at = {ago}, dead_at = {ago}"
    ))
    .unwrap();
    let week =
        RetentionPolicy::new(Duration::from_secs(7 * 86_400), Duration::from_secs(86_400)).unwrap();
    Prune::new(week).run(&mut ops).expect("prune");
    assert_eq!(
        claims(&mut ops, THREE, "old-dead"),
        0,
        "the claim is pruned"
    );
    assert_eq!(
        failure_row::<B>(&mut ops, THREE, "old-dead"),
        None,
        "the dead record is pruned with it, as documented"
    );
    assert!(dead_letters::summary(&mut ops).unwrap().is_empty());
}

inbox_tests::backend_tests!(pruning_forgets_a_dead_message_with_its_claim);
