//! Issue 15 item 2d: a node SIGKILLed under running consumers.
//!
//! The race's workload (errors handed back to the consumer) with node 2
//! killed once a third of the deliveries were answered. Its consumers get
//! "Lost connection…" (or a refused connection from its pool), which
//! `recovery()` calls Reconnect: they move to the next node's pool and
//! redeliver. The node is restarted and rejoins (state transfer) while the
//! others go on. In the end every id has one effect and one claim, on every
//! node, the rejoined one included. A consumer whose connection died during
//! COMMIT gets no answer (Reconnect) although the COMMIT may have taken
//! effect: such an id is answered `Processed` by nobody and its redelivery is
//! a duplicate; the effect is still there exactly once.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use inbox_tests::GaleraCluster;
use inbox_tests::galera::NODES;

use crate::consumer::{Mode, Progress, Workload, run};
use crate::support::{assert_exactly_once, pools, report};

const IDS: usize = 1_500;
const LANES: usize = 4;
const VICTIM: usize = 2;
/// Bounds on the injector's waits: it fails rather than hang.
const WAIT_LIMIT: Duration = Duration::from_secs(120);

fn wait_for(progress: &Progress, answered: usize) {
    let deadline = Instant::now() + WAIT_LIMIT;
    while progress.answered.load(Ordering::SeqCst) < answered
        && !progress.finished.load(Ordering::SeqCst)
    {
        assert!(Instant::now() < deadline, "the consumers made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn a_killed_node(cluster: &GaleraCluster) {
    let prefix = "killed".to_owned();
    // Room on every node for the consumers moving in (4 live there already).
    let pools = pools(cluster, 8);
    let bodies: Vec<AtomicU32> = (0..IDS).map(|_| AtomicU32::new(0)).collect();
    let processed: Vec<AtomicU32> = (0..IDS).map(|_| AtomicU32::new(0)).collect();
    let work = Workload {
        prefix: &prefix,
        ids: IDS,
        lanes: LANES,
        mode: Mode::Redeliver,
    };
    // Deliveries: three copies of even ids, two of odd ones.
    let deliveries = IDS / 2 * 3 + IDS / 2 * 2;
    let killed_at = OnceLock::new();
    let rejoin = OnceLock::new();
    let fault = |progress: &Progress| {
        wait_for(progress, deliveries / 3);
        assert!(
            !progress.finished.load(Ordering::SeqCst),
            "the consumers finished before the kill"
        );
        killed_at.set(Instant::now()).expect("killed once");
        cluster.kill(VICTIM);
        // Let the survivors carry the load for a while, then bring the node back.
        wait_for(progress, deliveries * 2 / 3);
        let restarting = Instant::now();
        cluster.restart(VICTIM);
        rejoin
            .set((restarting, restarting.elapsed()))
            .expect("rejoined once");
    };
    let figures = run(cluster, &pools, &work, &bodies, &processed, Some(&fault));
    figures.print("node killed", IDS);
    assert!(
        figures.never.is_empty(),
        "errors classified Never: {:?}",
        figures.never
    );
    let killed_at = *killed_at.get().expect("the node was killed");
    let (restarted_at, rejoin_took) = *rejoin.get().expect("the node rejoined");

    // The victim's consumers (consumer % NODES == VICTIM) answered again,
    // on a survivor, after the kill: when?
    let mut recovered: Vec<Duration> = Vec::new();
    for consumer in (0..figures.consumers).filter(|c| c % NODES == VICTIM) {
        let first = figures
            .answers
            .iter()
            .filter(|&&(c, at, node)| c == consumer && at > killed_at && node != VICTIM)
            .map(|&(_, at, _)| at)
            .min()
            .unwrap_or_else(|| panic!("consumer {consumer} never answered on a survivor"));
        recovered.push(first - killed_at);
    }
    recovered.sort();
    let moved = figures
        .moves
        .iter()
        .filter(|&&(at, from, _)| at > killed_at && from == VICTIM)
        .count();
    assert!(moved > 0, "no consumer moved off the killed node");
    // The longest time without any answer, from the kill on.
    let mut times: Vec<Instant> = figures
        .answers
        .iter()
        .map(|&(_, at, _)| at)
        .filter(|&at| at > killed_at)
        .collect();
    times.sort();
    let stall = std::iter::once(killed_at)
        .chain(times.iter().copied())
        .zip(times.iter().copied())
        .map(|(a, b)| b - a)
        .max()
        .unwrap_or_default();
    let answered_while_down = times.iter().filter(|&&at| at < restarted_at).count();
    report!(
        "node killed: its {} consumers answered again on a survivor after {:?} (kill to \
         first answer, each); longest gap without any answer after the kill: {:.2} s; \
         {moved} moves off the killed node; {answered_while_down} deliveries answered \
         while it was down; restart to rejoined (ready, cluster size 3): {:.1} s",
        recovered.len(),
        recovered
            .iter()
            .map(|d| format!("{:.2} s", d.as_secs_f64()))
            .collect::<Vec<_>>(),
        stall.as_secs_f64(),
        rejoin_took.as_secs_f64()
    );
    for (index, consumer, at, node) in &figures.processed_by {
        if processed[*index].load(Ordering::SeqCst) > 1 {
            let since = |t: Instant| {
                if *at >= t {
                    format!("{:.3} s after", (*at - t).as_secs_f64())
                } else {
                    format!("{:.3} s before", (t - *at).as_secs_f64())
                }
            };
            report!(
                "node killed: killed-{index} answered Processed by consumer {consumer} on node \
                 {node}, {} the kill",
                since(killed_at)
            );
        }
    }
    let unknown = assert_exactly_once(cluster, &prefix, IDS, &processed, true);
    report!(
        "node killed: {unknown} ids lost their answer with the connection during COMMIT \
         (Reconnect), yet were committed: their redelivery was a duplicate"
    );
}
