//! Retention and dead messages. `dead_letters`' documentation says pruning
//! removes dead records, like claims, once they are older than the
//! retention window; pruning today deletes claims only. A dead message
//! whose claim was pruned keeps its dead record: its redelivery runs the
//! body again (the claim is gone), can never be made dead again
//! (`mark_exhausted` wants `dead_at IS NULL`), and once processed is still
//! listed as dead, so `revive` would delete its processed claim.

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

/// Instantiated with `#[ignore]`: pruning does not touch `inbox_failures`.
mod ignored {
    macro_rules! ignored {
        ($($backend:ident: $feature:literal, $ty:ty;)+) => {$(
            #[cfg(feature = $feature)]
            #[test]
            #[ignore = "pruning deletes claims only; dead records outlive their pruned claims \
                        (dead_letters documents that pruning removes them)"]
            fn $backend() {
                super::pruning_forgets_a_dead_message_with_its_claim::<$ty>();
            }
        )+};
    }
    ignored! {
        postgres: "postgres", inbox_tests::Postgres;
        mysql: "mysql", inbox_tests::Mysql;
        sqlite: "sqlite", inbox_tests::Sqlite;
    }
}
