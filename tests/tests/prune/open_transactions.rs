//! Ids held by a transaction that is still open are never removed, and the
//! pruner does not wait for that transaction.

use diesel::prelude::*;
use inbox_runtime::{Claim, ClaimKey, Prune, claim};

use crate::support::*;

/// Transaction A stays open holding: `open-0`, claimed and backdated inside
/// A (uncommitted, so invisible to others); `locked-0`, an expired row A
/// updated (row-locked); `dup-0`, an expired row A re-delivered (a duplicate
/// claim, which MySQL protects with a shared lock). Meanwhile the pruner
/// runs on its own connection (`run`: blocking or async): it must finish
/// without waiting for A and remove none of A's uncommitted or locked rows.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn held_rows_survive_with<B: ServerBackend>(
    db: &B,
    run: impl Fn(&Prune) -> Result<inbox_runtime::PruneReport, inbox_runtime::PruneError> + Sync,
) {
    let duplicate_is_locked = B::DUPLICATE_CLAIM_LOCKS_ROW;
    use diesel::connection::SimpleConnection;
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    /// Long enough for any healthy run, short enough to fail instead of
    /// hanging if the pruner ever waited for the open transaction.
    const LIVENESS: Duration = Duration::from_secs(60);

    let mut conn = db.connect();
    seed::<B>(&mut conn, "h", &ids("old", 300), Some(10 * DAY));
    seed::<B>(
        &mut conn,
        "h",
        &["locked-0".to_owned(), "dup-0".to_owned()],
        Some(10 * DAY),
    );

    let (ready_tx, ready_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    thread::scope(|scope| {
        let holder = scope.spawn(move || {
            let mut conn = db.connect();
            conn.transaction(|conn| {
                let open = ClaimKey::new(handler("h"), "open-0").unwrap();
                assert_eq!(claim(conn, &open)?, Claim::Claimed);
                backdate::<B>(conn, "h", &["open-0".to_owned()], 10 * DAY);
                conn.batch_execute(
                    "UPDATE inbox_messages SET received_at = received_at \
                     WHERE handler = 'h' AND message_id = 'locked-0'",
                )?;
                let dup = ClaimKey::new(handler("h"), "dup-0").unwrap();
                assert_eq!(claim(conn, &dup)?, Claim::Duplicate);
                ready_tx.send(()).unwrap();
                release_rx.recv().unwrap();
                diesel::QueryResult::Ok(())
            })
            .expect("transaction A commits");
        });
        ready_rx.recv().expect("transaction A is open");

        let (done_tx, done_rx) = mpsc::channel();
        let run = &run;
        scope.spawn(move || {
            let prune = Prune::new(policy(7 * DAY, DAY)).batch_size(64);
            let _ = done_tx.send(run(&prune));
        });
        let report = done_rx
            .recv_timeout(LIVENESS)
            .expect("the pruner must not wait for the open transaction")
            .expect("pruning succeeds");

        let left = stored_ids(&mut conn, "h");
        assert!(
            left.contains("locked-0"),
            "a row locked by an open transaction was removed"
        );
        assert!(
            !left.contains("open-0"),
            "uncommitted rows are invisible to others"
        );
        assert!(!left.iter().any(|id| id.starts_with("old-")), "{left:?}");
        if duplicate_is_locked {
            assert!(
                left.contains("dup-0"),
                "a row share-locked by a duplicate claim was removed"
            );
            assert_eq!(report.rows_deleted, 300, "{report}");
        } else {
            assert_eq!(report.rows_deleted, 301, "{report}");
        }

        release_tx.send(()).unwrap();
        holder.join().unwrap();
    });

    // Committed now, and expired: the next run removes them.
    assert!(stored_ids(&mut conn, "h").contains("open-0"));
    let report = Prune::new(policy(7 * DAY, DAY)).run(&mut conn).unwrap();
    assert_eq!(
        report.rows_deleted,
        if duplicate_is_locked { 3 } else { 2 },
        "{report}"
    );
    assert_eq!(count(&mut conn), 0);
}

inbox_tests::backend_tests!(only [postgres, mysql]: held_rows_survive);

/// On PostgreSQL, ON CONFLICT DO NOTHING takes no lock on the existing row;
/// on MariaDB/MySQL a duplicate claim share-locks it.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub fn held_rows_survive<B: ServerBackend>() {
    let Some(db) = B::open() else { return };
    held_rows_survive_with(&db, |prune| prune.run(&mut db.connect()));
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;

    /// SQLite has one writer: while a handler's transaction is open the pruner
    /// cannot write at all. It fails (busy) after its busy timeout, deleting
    /// nothing, and the next run does the work.
    #[test]
    fn open_writer_makes_the_pruner_fail_not_lose_rows() {
        use diesel::connection::SimpleConnection;
        use inbox_tests::Sqlite;

        let Some(db) = Sqlite::open() else {
            return;
        };
        let mut conn = db.connect();
        seed::<Sqlite>(&mut conn, "h", &ids("old", 50), Some(10 * DAY));

        let mut holder = db.connect();
        holder
            .transaction(|holder| {
                let open = ClaimKey::new(handler("h"), "open-0").unwrap();
                assert_eq!(claim(holder, &open)?, Claim::Claimed);
                backdate::<Sqlite>(holder, "h", &["open-0".to_owned()], 10 * DAY);

                conn.batch_execute("PRAGMA busy_timeout = 100").unwrap();
                let err = Prune::new(policy(7 * DAY, DAY)).run(&mut conn).unwrap_err();
                assert_eq!(err.report().rows_deleted, 0, "{err}");
                assert_eq!(count(&mut conn), 50, "nothing was deleted");
                diesel::QueryResult::Ok(())
            })
            .unwrap();

        let report = Prune::new(policy(7 * DAY, DAY)).run(&mut conn).unwrap();
        assert_eq!(report.rows_deleted, 51, "{report}");
    }
}
