//! The generation layout's maintenance (`prune::partitioned`) through
//! transaction pooling.

use std::time::Duration;

use diesel::connection::{CacheSize, SimpleConnection as _};
use diesel::prelude::*;
use inbox_runtime::RetentionPolicy;
use inbox_runtime::prune::partitioned::{self, Maintenance};
use inbox_tests::SqlRows as _;

use super::{spread, through};

const DAY: u64 = 86_400;

/// Behind a pooler that moves a client's consecutive statements from one
/// server connection to the next (transaction pooling, round robin over
/// two), each maintenance run drops the generation that expired, and none
/// leaves anything held on a server connection for the next run to trip
/// on.
#[test]
fn maintenance_through_transaction_pooling_drops_what_expired_every_run() {
    let Some((server, bouncer)) = spread() else {
        return;
    };
    let mut direct = PgConnection::establish(&server.url()).expect("connect directly");
    partitioned::setup(&mut direct).expect("the generation layout");
    let policy = RetentionPolicy::new(Duration::from_secs(7 * DAY), Duration::from_secs(DAY))
        .expect("a policy");
    let maintenance = Maintenance::new(policy).expect("maintenance");
    let mut conn = through(&bouncer, CacheSize::Disabled);
    // Round n has n generations to drop: the runs differ in how many
    // statements they send, so their first and last statements meet the
    // server connections in every combination.
    for round in 1..=4_u64 {
        for _ in 0..round {
            partitioned::rotate(&mut direct, Duration::from_secs(5)).expect("rotate");
        }
        direct
            .batch_execute(
                "UPDATE inbox_generations SET started_at = now() - interval '31 days', \
                 ended_at = now() - interval '30 days' WHERE ended_at IS NOT NULL",
            )
            .expect("age the archived generations");
        let report = maintenance.run(&mut conn).expect("a maintenance run");
        assert_eq!(
            (report.partitions_dropped, report.caught_up),
            (round, true),
            "round {round}: {report}"
        );
        let held = direct.bigint(
            "SELECT COUNT(*) AS value FROM pg_locks \
             WHERE locktype = 'advisory' AND pid <> pg_backend_pid()",
        );
        assert_eq!(
            held, 0,
            "round {round}: advisory locks left held on the server"
        );
    }
}
