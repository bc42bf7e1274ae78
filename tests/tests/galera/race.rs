//! Issue 15 items 2d and 3: the same ids delivered at once on different
//! nodes, with lock conflicts handed to the consumer (which redelivers)
//! and retried at once inside the consumer (what the runtime would do if it
//! retried a certification-refused COMMIT itself).

use std::sync::atomic::AtomicU32;

use inbox_tests::GaleraCluster;

use crate::consumer::{Figures, Mode, Workload, run};
use crate::support::{assert_exactly_once, pools, report};

pub const IDS: usize = 2_000;
/// 4 lanes × 3 nodes = 12 consumers.
pub const LANES: usize = 4;
/// Tries in all when the consumer retries at once (the runtime's claim
/// retry makes 5, `CLAIM_ATTEMPTS`; a prune batch 4).
pub const ATTEMPTS: u32 = 4;

/// Runs one way and checks what must hold whatever the timing.
pub fn race(cluster: &GaleraCluster, prefix: &str, mode: Mode) -> Figures {
    let pools = pools(cluster, 4);
    let bodies: Vec<AtomicU32> = (0..IDS).map(|_| AtomicU32::new(0)).collect();
    let processed: Vec<AtomicU32> = (0..IDS).map(|_| AtomicU32::new(0)).collect();
    let work = Workload {
        prefix,
        ids: IDS,
        lanes: LANES,
        mode,
    };
    let figures = run(cluster, &pools, &work, &bodies, &processed, None);
    figures.print(&format!("race {prefix} ({mode:?})"), IDS);
    assert!(
        figures.never.is_empty(),
        "errors classified Never: {:?}",
        figures.never
    );
    assert_exactly_once(cluster, prefix, IDS, &processed, false);
    figures
}

pub fn both_ways(cluster: &GaleraCluster) {
    // Twice each, alternating, so that a busy moment of the shared machine
    // does not land on one way only.
    let mut handed_back = Vec::new();
    let mut retried = Vec::new();
    for round in 0..2 {
        handed_back.push(race(
            cluster,
            &format!("race-handed-{round}"),
            Mode::Redeliver,
        ));
        retried.push(race(
            cluster,
            &format!("race-retried-{round}"),
            Mode::RetryAtOnce { attempts: ATTEMPTS },
        ));
    }
    for (label, runs) in [
        ("handed to the consumer", &handed_back),
        ("retried at once", &retried),
    ] {
        let line: Vec<String> = runs
            .iter()
            .map(|f| {
                format!(
                    "{} errors seen by the consumer ({} refused COMMITs), {} retried at once, \
                     {} ids run twice, {:.0} ids/s",
                    f.seen_total(),
                    f.seen.get("refused COMMIT (Unknown)").copied().unwrap_or(0),
                    f.retried_at_once.values().sum::<u64>(),
                    f.ids_run_twice,
                    IDS as f64 / f.elapsed.as_secs_f64()
                )
            })
            .collect();
        report!("item 3, {label}: {}", line.join(" | "));
    }
}
