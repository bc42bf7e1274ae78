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

use inbox_tests::galera::NODES;
use inbox_tests::{GaleraCluster, HaProxy};

use crate::consumer::{Figures, Mode, Progress, Workload, run};
use crate::support::{MysqlPool, assert_exactly_once, pools, report, through_proxy};

const IDS: usize = 1_500;
const LANES: usize = 4;
/// See [`Plan::route_back`]: 12 consumers then deliver about 240 times a
/// second, and the deliveries left after a third last well over a minute.
const PACE_MS: u64 = 50;
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

/// What a run with a killed node saw.
struct Killed {
    figures: Figures,
    processed: Vec<AtomicU32>,
    killed_at: Instant,
    restarted_at: Instant,
    rejoin_took: Duration,
    /// When the route to the rejoined node was back (the proxy's failback).
    routed_back_at: Option<Instant>,
    ids: usize,
}

impl Killed {
    /// The longest time without any answer, from the kill on.
    fn longest_gap(&self) -> Duration {
        let times = self.answers_after_kill();
        std::iter::once(self.killed_at)
            .chain(times.iter().copied())
            .zip(times.iter().copied())
            .map(|(a, b)| b - a)
            .max()
            .unwrap_or_default()
    }

    /// When each delivery was answered after the kill, in order.
    fn answers_after_kill(&self) -> Vec<Instant> {
        let mut times: Vec<Instant> = self
            .figures
            .answers
            .iter()
            .map(|&(_, at, _)| at)
            .filter(|&at| at > self.killed_at)
            .collect();
        times.sort();
        times
    }

    /// Deliveries answered while the killed node was down.
    fn answered_while_down(&self) -> usize {
        self.answers_after_kill()
            .iter()
            .filter(|&&at| at < self.restarted_at)
            .count()
    }

    /// Reports each id answered `Processed` more than once, and checks that
    /// every id took effect once on every node; returns how many ids lost
    /// their answer with a connection during COMMIT.
    fn check(&self, cluster: &GaleraCluster, label: &str, prefix: &str) -> usize {
        for (index, consumer, at, node) in &self.figures.processed_by {
            if self.processed[*index].load(Ordering::SeqCst) > 1 {
                let since = |t: Instant| {
                    if *at >= t {
                        format!("{:.3} s after", (*at - t).as_secs_f64())
                    } else {
                        format!("{:.3} s before", (t - *at).as_secs_f64())
                    }
                };
                report!(
                    "{label}: {prefix}-{index} answered Processed by consumer {consumer} on \
                     node {node}, {} the kill",
                    since(self.killed_at)
                );
            }
        }
        let unknown = assert_exactly_once(cluster, prefix, self.ids, &self.processed, true);
        report!(
            "{label}: {unknown} ids lost their answer with the connection during COMMIT \
             (Reconnect), yet were committed: their redelivery was a duplicate"
        );
        unknown
    }
}

/// A run with a killed node: which node, on how many ids, and when it comes
/// back.
struct Plan<'a> {
    prefix: &'a str,
    victim: usize,
    ids: usize,
    /// The share of the deliveries answered before the node is restarted
    /// (it is killed at a third).
    restart_at: f64,
    /// Waits, after the node rejoined, for the consumers' route to it to be
    /// back (the proxy's failback); `None` when nothing routes to it. From
    /// the kill until then, each consumer waits [`PACE_MS`] before each
    /// delivery, so that they are still delivering when the route is back
    /// (the node takes 5–12 s to rejoin here).
    route_back: Option<&'a (dyn Fn() + Sync)>,
}

/// Runs the race's workload on `pools` (one per node, in node order) and
/// SIGKILLs the plan's victim once a third of the deliveries were
/// answered; restarts it later, while the consumers go on.
fn kill_under_consumers(cluster: &GaleraCluster, pools: &[MysqlPool], plan: &Plan<'_>) -> Killed {
    let ids = plan.ids;
    let bodies: Vec<AtomicU32> = (0..ids).map(|_| AtomicU32::new(0)).collect();
    let processed: Vec<AtomicU32> = (0..ids).map(|_| AtomicU32::new(0)).collect();
    let work = Workload {
        prefix: plan.prefix,
        ids,
        lanes: LANES,
        mode: Mode::Redeliver,
    };
    // Deliveries: three copies of even ids, two of odd ones.
    let deliveries = ids / 2 * 3 + ids / 2 * 2;
    let killed_at = OnceLock::new();
    let rejoin = OnceLock::new();
    let routed_back = OnceLock::new();
    let fault = |progress: &Progress| {
        wait_for(progress, deliveries / 3);
        assert!(
            !progress.finished.load(Ordering::SeqCst),
            "the consumers finished before the kill"
        );
        killed_at.set(Instant::now()).expect("killed once");
        if plan.route_back.is_some() {
            progress.pace_ms.store(PACE_MS, Ordering::SeqCst);
        }
        cluster.kill(plan.victim);
        // Let the survivors carry the load for a while, then bring the node back.
        wait_for(progress, (deliveries as f64 * plan.restart_at) as usize);
        let restarting = Instant::now();
        cluster.restart(plan.victim);
        rejoin
            .set((restarting, restarting.elapsed()))
            .expect("rejoined once");
        if let Some(route_back) = plan.route_back {
            route_back();
            routed_back.set(Instant::now()).expect("routed back once");
            progress.pace_ms.store(0, Ordering::SeqCst);
        }
    };
    let figures = run(cluster, pools, &work, &bodies, &processed, Some(&fault));
    assert!(
        figures.never.is_empty(),
        "errors classified Never: {:?}",
        figures.never
    );
    let (restarted_at, rejoin_took) = *rejoin.get().expect("the node rejoined");
    Killed {
        figures,
        processed,
        ids,
        killed_at: *killed_at.get().expect("the node was killed"),
        restarted_at,
        rejoin_took,
        routed_back_at: routed_back.get().copied(),
    }
}

pub fn a_killed_node(cluster: &GaleraCluster) {
    const VICTIM: usize = 2;
    // Room on every node for the consumers moving in (4 live there already).
    let plan = Plan {
        prefix: "killed",
        victim: VICTIM,
        ids: IDS,
        restart_at: 2.0 / 3.0,
        route_back: None,
    };
    let killed = kill_under_consumers(cluster, &pools(cluster, 8), &plan);
    let figures = &killed.figures;
    figures.print("node killed", IDS);

    // The victim's consumers (consumer % NODES == VICTIM) answered again,
    // on a survivor, after the kill: when?
    let mut recovered: Vec<Duration> = Vec::new();
    for consumer in (0..figures.consumers).filter(|c| c % NODES == VICTIM) {
        let first = figures
            .answers
            .iter()
            .filter(|&&(c, at, node)| c == consumer && at > killed.killed_at && node != VICTIM)
            .map(|&(_, at, _)| at)
            .min()
            .unwrap_or_else(|| panic!("consumer {consumer} never answered on a survivor"));
        recovered.push(first - killed.killed_at);
    }
    recovered.sort();
    let moved = figures
        .moves
        .iter()
        .filter(|&&(at, from, _)| at > killed.killed_at && from == VICTIM)
        .count();
    assert!(moved > 0, "no consumer moved off the killed node");
    report!(
        "node killed: its {} consumers answered again on a survivor after {:?} (kill to \
         first answer, each); longest gap without any answer after the kill: {:.2} s; \
         {moved} moves off the killed node; {} deliveries answered \
         while it was down; restart to rejoined (ready, cluster size 3): {:.1} s",
        recovered.len(),
        seconds(&recovered),
        killed.longest_gap().as_secs_f64(),
        killed.answered_while_down(),
        killed.rejoin_took.as_secs_f64()
    );
    killed.check(cluster, "node killed", "killed");
}

/// Issue 28: the same run with every consumer connected through HAProxy,
/// which sends every connection to node 0 while it is up and to node 1
/// (its first backup) while it is not, as a single-writer deployment does.
/// Node 0, the writer, is killed: HAProxy closes its sessions and routes the
/// consumers' new connections to node 1; when node 0 is back, HAProxy
/// closes the sessions on the backup and routes to node 0 again.
pub fn a_killed_writer_behind_haproxy(cluster: &GaleraCluster) {
    const WRITER: usize = 0;
    let Some(proxy) = HaProxy::start(&(0..NODES).map(|n| cluster.port(n)).collect::<Vec<_>>())
    else {
        return;
    };
    let through = through_proxy(&proxy, 4 * NODES as u32);
    // Every consumer's "node" is the proxy: moving on is reconnecting.
    let pools = vec![through; NODES];
    let label = "writer killed behind HAProxy";
    // The writer restarted once the consumers deliver again; they deliver
    // at a slower pace until HAProxy routes to it again (`Plan::route_back`).
    let route_back = || wait_for_event(&proxy, "Server writes/s0 is UP");
    let plan = Plan {
        prefix: "haproxy",
        victim: WRITER,
        ids: IDS,
        restart_at: 0.36,
        route_back: Some(&route_back),
    };
    let killed = kill_under_consumers(cluster, &pools, &plan);
    let figures = &killed.figures;
    figures.print(label, plan.ids);
    let routed_back_at = killed.routed_back_at.expect("HAProxy routed back");
    let after_failback = killed
        .answers_after_kill()
        .iter()
        .filter(|&&at| at > routed_back_at)
        .count();
    assert!(
        after_failback > 0,
        "the consumers finished before HAProxy routed to the writer again"
    );
    let mut recovered: Vec<Duration> = (0..figures.consumers)
        .filter_map(|consumer| {
            let first = figures
                .answers
                .iter()
                .filter(|&&(c, at, _)| c == consumer && at > killed.killed_at)
                .map(|&(_, at, _)| at)
                .min()?;
            Some(first - killed.killed_at)
        })
        .collect();
    recovered.sort();
    assert_eq!(
        recovered.len(),
        figures.consumers,
        "a consumer never answered after the kill"
    );
    report!(
        "{label}: its {} consumers answered again after {:?} (kill to first answer, each); \
         longest gap without any answer after the kill: {:.2} s; {} deliveries answered \
         while the writer was down; restart to rejoined: {:.1} s; HAProxy routed to it again \
         {:.1} s after the restart, and {after_failback} deliveries were answered after that",
        recovered.len(),
        seconds(&recovered),
        killed.longest_gap().as_secs_f64(),
        killed.answered_while_down(),
        killed.rejoin_took.as_secs_f64(),
        (routed_back_at - killed.restarted_at).as_secs_f64()
    );
    for event in proxy.server_events() {
        report!("{label}: HAProxy: {event}");
    }
    killed.check(cluster, label, "haproxy");
}

/// Waits until `proxy` reports `event`, at most [`WAIT_LIMIT`].
fn wait_for_event(proxy: &HaProxy, event: &str) {
    let deadline = Instant::now() + WAIT_LIMIT;
    while !proxy
        .server_events()
        .iter()
        .any(|line| line.contains(event))
    {
        assert!(
            Instant::now() < deadline,
            "HAProxy did not report {event:?}: {:?}",
            proxy.server_events()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn seconds(durations: &[Duration]) -> Vec<String> {
    durations
        .iter()
        .map(|d| format!("{:.2} s", d.as_secs_f64()))
        .collect()
}
