//! Issue 28: failover by an HA manager rather than by the test. A
//! pg_auto_failover formation (a monitor and a synchronous primary/secondary
//! pair, `inbox_tests::PgFormation`), the guide's consumer on the URI
//! `pg_autoctl show uri` prints, and the primary's host killed mid-run
//! (SIGKILL to its keeper, postmaster and backends at once): the monitor
//! promotes the secondary by itself and the consumer finds it through the
//! multi-host URI.
//!
//! Figures printed: acknowledged deliveries lost (0 with the formation's
//! synchronous replication, asserted), the time from the kill to the
//! consumer's next success, and bodies run twice (0, asserted).

use std::time::Instant;

use inbox_tests::PgFormation;

use super::run::FAIL_AT;
use super::run::{Consumer, Failover, Fault, run_through, standby_lag};
use super::synchronous;
use crate::app::prepare;

/// Runs `consumer` on the formation's URI and kills the primary's node once
/// [`FAIL_AT`] deliveries were acknowledged; returns the run and the URL of
/// the node the monitor promoted.
fn killed_under(formation: &PgFormation, consumer: Consumer) -> (Failover, String) {
    let uri = formation.uri();
    prepare(&uri);
    let old = formation.primary().expect("a primary");
    let failover = run_through(consumer, &uri, |progress| {
        progress.wait_for_processed(FAIL_AT)?;
        let lag = standby_lag(&formation.node_url(old));
        formation.kill_node(old);
        let gone_at = Instant::now();
        let back = progress.wait_for_recovery(gone_at)?;
        Ok(Fault {
            cut_at: None,
            gone_at,
            back_after: back - gone_at,
            back_since: "the kill (the HA manager's promotion included)",
            lag,
        })
    });
    let new = formation
        .wait_for_primary_other_than(old)
        .expect("the monitor promotes the secondary");
    println!(
        "pg_auto_failover after the kill of node {}:\n{}",
        old + 1,
        formation.show_state()
    );
    (failover, formation.node_url(new))
}

#[test]
fn an_ha_manager_promotes_the_secondary_and_no_acknowledged_delivery_is_lost() {
    let Some(formation) = PgFormation::start() else {
        return;
    };
    let (failover, promoted) = killed_under(&formation, super::run::BLOCKING);
    synchronous("pg_auto_failover, PgConnection", &promoted, &failover);
}

#[cfg(feature = "async")]
#[test]
fn an_ha_manager_promotes_the_secondary_and_no_acknowledged_async_delivery_is_lost() {
    let Some(formation) = PgFormation::start() else {
        return;
    };
    let (failover, promoted) = killed_under(&formation, super::run::ASYNC);
    synchronous("pg_auto_failover, AsyncPgConnection", &promoted, &failover);
}
