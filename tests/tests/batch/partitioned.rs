//! PostgreSQL's generation layout: the batch claim deduplicates across
//! generations as the single claim does (the current table's trigger skips
//! an id found in an archived generation, so `RETURNING` leaves it out).

use std::time::Duration;

use diesel::PgConnection;
use inbox_runtime::prune::partitioned;
use inbox_tests::{Postgres, TestBackend};

use crate::support::*;

#[test]
fn an_id_claimed_in_an_archived_generation_is_a_duplicate() {
    let Some((db, mut conn)) = fresh::<Postgres>() else {
        return;
    };
    let conn: &mut PgConnection = &mut conn;
    partitioned::setup(conn).expect("convert to the generation layout");
    let first: Vec<String> = ["g-a", "g-b", "g-c"].map(String::from).to_vec();
    let (report, _) = apply_batch(conn, &first);
    assert_all_processed(&report, &first);
    partitioned::rotate(conn, Duration::from_secs(5)).expect("rotate");
    let second: Vec<String> = ["g-d", "g-a", "g-e"].map(String::from).to_vec();
    let (report, _) = apply_batch(conn, &second);
    assert_eq!(endings(&report), ["processed", "duplicate", "processed"]);
    partitioned::rotate(conn, Duration::from_secs(5)).expect("rotate");

    // Ids of both archived generations, the current one's and new ones.
    let batch: Vec<String> = ["g-new-1", "g-c", "g-e", "g-b", "g-new-2", "g-d"]
        .map(String::from)
        .to_vec();
    let (report, runs) = apply_batch(conn, &batch);
    assert_eq!(
        endings(&report),
        [
            "processed",
            "duplicate",
            "duplicate",
            "duplicate",
            "processed",
            "duplicate"
        ]
    );
    assert_eq!(
        runs,
        Runs::from([("g-new-1".into(), 1), ("g-new-2".into(), 1)])
    );
    let mut observer = db.connect();
    assert_eq!(all_effects(&mut observer), 7);
    for id in ["g-a", "g-b", "g-c", "g-d", "g-e"] {
        assert_eq!(effects(&mut observer, id), 1, "{id}");
    }
}
