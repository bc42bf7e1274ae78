//! Pruning while live handlers claim new ids and redeliver recent ones:
//! no handler or pruner error, no deadlock, no in-window row lost, every
//! effect exactly once.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Instant;

use inbox_runtime::{Outcome, Prune};

use crate::support::*;

const HANDLERS: usize = 4;
const PRUNERS: usize = 2;
const EXPIRED: usize = 20_000;
const KEPT: usize = 1_000;
/// Each handler keeps claiming until the pruners are done and it has
/// claimed at least this many ids.
const MIN_CLAIMS: usize = 150;

struct HandlerRun {
    claimed: Vec<String>,
    /// Claims made while both pruners were still at work.
    during_pruning: usize,
    duplicates: usize,
    errors: Vec<String>,
}

struct PrunerRun {
    rows: u64,
    batches: u64,
    runs: usize,
    errors: Vec<String>,
}

inbox_tests::backend_tests!(only [postgres, mysql]: pruning_alongside_live_handlers);

pub fn pruning_alongside_live_handlers<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let db = &db;
    let mut conn = db.connect();
    create_ledger(&mut conn);
    let kept = ids("kept", KEPT);
    seed::<B>(&mut conn, "live", &ids("old", EXPIRED), Some(10 * DAY));
    seed::<B>(&mut conn, "live", &kept, Some(6 * DAY));

    let pruners_done = AtomicUsize::new(0);
    let started = Instant::now();
    let (handlers, pruners) = thread::scope(|scope| {
        let handlers: Vec<_> = (0..HANDLERS)
            .map(|worker| {
                let (pruners_done, kept) = (&pruners_done, &kept);
                scope.spawn(move || {
                    let mut conn = db.connect();
                    let mut run = HandlerRun {
                        claimed: Vec::new(),
                        during_pruning: 0,
                        duplicates: 0,
                        errors: Vec::new(),
                    };
                    let mut n = 0;
                    while pruners_done.load(Ordering::SeqCst) < PRUNERS || n < MIN_CLAIMS {
                        let id = format!("w{worker}-{n}");
                        let pruning = pruners_done.load(Ordering::SeqCst) == 0;
                        match deliver(&mut conn, "live", &id, true) {
                            Ok(Outcome::Processed(())) => {
                                run.claimed.push(id);
                                run.during_pruning += usize::from(pruning);
                            }
                            Ok(Outcome::Duplicate) => {
                                run.errors.push(format!("{id}: new id seen as a duplicate"))
                            }
                            Err(error) => run.errors.push(format!("{id}: {error}: {error:?}")),
                        }
                        // A redelivery of a recent (in-window) message.
                        let recent = &kept[(worker * 7919 + n * 31) % KEPT];
                        match deliver(&mut conn, "live", recent, true) {
                            Ok(Outcome::Duplicate) => run.duplicates += 1,
                            Ok(Outcome::Processed(())) => run
                                .errors
                                .push(format!("{recent}: in-window id was processed again")),
                            Err(error) => run.errors.push(format!("{recent}: {error}: {error:?}")),
                        }
                        n += 1;
                    }
                    run
                })
            })
            .collect();
        let pruners: Vec<_> = (0..PRUNERS)
            .map(|_| {
                let pruners_done = &pruners_done;
                scope.spawn(move || {
                    let mut conn = db.connect();
                    let prune = Prune::new(policy(7 * DAY, DAY)).batch_size(200);
                    let mut run = PrunerRun {
                        rows: 0,
                        batches: 0,
                        runs: 0,
                        errors: Vec::new(),
                    };
                    // Until one run finds nothing left to do (or errors pile up).
                    while run.errors.len() < 10 {
                        run.runs += 1;
                        match prune.run(&mut conn) {
                            Ok(report) => {
                                run.rows += report.rows_deleted;
                                run.batches += report.batches;
                                if report.caught_up {
                                    break;
                                }
                            }
                            Err(error) => run.errors.push(format!("{error}: {error:?}")),
                        }
                    }
                    pruners_done.fetch_add(1, Ordering::SeqCst);
                    run
                })
            })
            .collect();
        let handlers: Vec<HandlerRun> = handlers.into_iter().map(|h| h.join().unwrap()).collect();
        let pruners: Vec<PrunerRun> = pruners.into_iter().map(|p| p.join().unwrap()).collect();
        (handlers, pruners)
    });

    let errors: Vec<&String> = handlers
        .iter()
        .flat_map(|h| &h.errors)
        .chain(pruners.iter().flat_map(|p| &p.errors))
        .collect();
    assert!(
        errors.is_empty(),
        "{} errors, first ones: {:#?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );

    let pruned: u64 = pruners.iter().map(|p| p.rows).sum();
    let claimed: BTreeSet<String> = handlers
        .iter()
        .flat_map(|h| h.claimed.iter().cloned())
        .collect();
    let during: usize = handlers.iter().map(|h| h.during_pruning).sum();
    eprintln!(
        "{}: {} claims ({during} while pruning) and {} redeliveries by {HANDLERS} handlers while {PRUNERS} \
         pruners deleted {pruned} rows in {} batches ({} runs), {:.2?}",
        B::NAME,
        claimed.len(),
        handlers.iter().map(|h| h.duplicates).sum::<usize>(),
        pruners.iter().map(|p| p.batches).sum::<u64>(),
        pruners.iter().map(|p| p.runs).sum::<usize>(),
        started.elapsed()
    );
    assert_eq!(
        pruned, EXPIRED as u64,
        "each expired row deleted once, by one pruner"
    );
    assert!(during > 0, "handlers claimed ids while the pruners ran");

    // Nothing expired is left, nothing in the window was lost.
    let report = Prune::new(policy(7 * DAY, DAY)).run(&mut conn).unwrap();
    assert_eq!(report.rows_deleted, 0, "{report}");
    let mut expected = set(&kept);
    expected.extend(claimed.iter().cloned());
    assert_eq!(stored_ids(&mut conn, "live"), expected);

    // Every new id's effect exactly once; redeliveries of kept ids none.
    let mut effects = ledger(&mut conn);
    effects.sort();
    let claimed_sorted: Vec<String> = claimed.into_iter().collect();
    assert_eq!(effects, claimed_sorted);
}
