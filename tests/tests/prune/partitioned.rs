//! PostgreSQL's generation layout: the stock claim still deduplicates
//! across generations, expired generations are dropped whole, and rotation
//! is safe under concurrent deliveries at READ COMMITTED and REPEATABLE READ.
//! A transaction still open holds its ids against pruning and rotation (see
//! `open_transactions`); the layout's migrations upgrade an old layout; and a
//! claim late in a long transaction is dated by its statement, in the plain,
//! the migrated and the generation tables alike.

#[cfg(feature = "postgres")]
mod postgres {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::thread;
    use std::time::Duration;

    use diesel::connection::SimpleConnection;
    use diesel::migration::MigrationSource;
    use diesel::prelude::*;
    use diesel::result::DatabaseErrorKind;
    use diesel_migrations::MigrationHarness;
    use inbox_runtime::prune::partitioned::{self, Maintenance};
    use inbox_runtime::{Claim, ClaimKey, InboxError, Outcome, Prune, claim};
    use inbox_tests::Postgres;

    use crate::open_transactions::held_rows_survive_with;
    use crate::schema::{describe, run_first_migration, run_pending_migrations, without_inbox};
    use crate::support::*;

    const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

    fn partitioned_db() -> Option<(Postgres, PgConnection)> {
        let db = Postgres::open()?;
        let mut conn = db.connect();
        partitioned::setup(&mut conn).expect("convert to the generation layout");
        Some((db, conn))
    }

    fn processed(conn: &mut PgConnection, id: &str) -> bool {
        match deliver(conn, "h", id, false).expect("delivery succeeds") {
            Outcome::Processed(()) => true,
            Outcome::Duplicate => false,
        }
    }

    /// Pretends generation `generation` ended `ago` seconds ago.
    fn age_generation(conn: &mut PgConnection, generation: i64, ago: i64) {
        conn.batch_execute(&format!(
            "UPDATE inbox_generations SET started_at = now() - interval '{} seconds', \
             ended_at = now() - interval '{ago} seconds' WHERE generation = {generation}",
            ago + HOUR
        ))
        .unwrap();
    }

    #[test]
    fn duplicates_are_detected_across_generations() {
        let Some((_db, mut conn)) = partitioned_db() else {
            return;
        };
        partitioned::setup(&mut conn).expect("setup is idempotent");
        assert!(partitioned::is_partitioned(&mut conn).unwrap());
        let generations = partitioned::generations(&mut conn).unwrap();
        assert_eq!(generations.len(), 1);
        assert!(generations[0].is_current());

        assert!(processed(&mut conn, "a"));
        assert!(processed(&mut conn, "b"));
        assert_eq!(partitioned::rotate(&mut conn, LOCK_TIMEOUT).unwrap(), 2);
        assert!(!processed(&mut conn, "a"), "claimed in generation 1");
        assert!(processed(&mut conn, "c"));
        assert!(
            !processed(&mut conn, "c"),
            "claimed in the current generation"
        );
        assert_eq!(partitioned::rotate(&mut conn, LOCK_TIMEOUT).unwrap(), 3);
        assert_eq!(partitioned::rotate(&mut conn, LOCK_TIMEOUT).unwrap(), 4);
        for id in ["a", "b", "c"] {
            assert!(!processed(&mut conn, id), "{id} is still remembered");
        }

        let generations = partitioned::generations(&mut conn).unwrap();
        let numbers: Vec<i64> = generations.iter().map(|g| g.generation).collect();
        assert_eq!(numbers, [1, 2, 3, 4]);
        assert_eq!(generations[0].table_name(), "inbox_messages_g1");
        assert_eq!(generations[3].table_name(), "inbox_messages");
        assert!(
            generations
                .windows(2)
                .all(|w| w[0].ended_at == Some(w[1].started_at))
        );

        // Back to the plain layout: archived ids come back with it.
        partitioned::teardown(&mut conn).unwrap();
        assert!(!partitioned::is_partitioned(&mut conn).unwrap());
        for id in ["a", "b", "c"] {
            assert!(!processed(&mut conn, id), "{id} survived the teardown");
        }
        assert_eq!(count(&mut conn), 3);
    }

    #[test]
    fn expired_generations_are_dropped_whole() {
        let Some((_db, mut conn)) = partitioned_db() else {
            return;
        };
        seed::<Postgres>(&mut conn, "h", &ids("g1", 300), None);
        partitioned::rotate(&mut conn, LOCK_TIMEOUT).unwrap();
        seed::<Postgres>(&mut conn, "h", &ids("g2", 200), None);
        partitioned::rotate(&mut conn, LOCK_TIMEOUT).unwrap();
        seed::<Postgres>(&mut conn, "h", &ids("g3", 100), None);
        conn.batch_execute("ANALYZE inbox_messages_g1").unwrap();

        // Generation 1 ended 8 days ago, generation 2 six days ago.
        age_generation(&mut conn, 1, 8 * DAY);
        age_generation(&mut conn, 2, 6 * DAY);
        let keep_a_week = policy(7 * DAY, DAY);
        let report = partitioned::drop_expired(&mut conn, &keep_a_week).unwrap();
        assert_eq!(report.partitions_dropped, 1, "{report}");
        assert_eq!(
            report.rows_deleted, 300,
            "the planner's estimate after ANALYZE: {report}"
        );
        let exists: Vec<i64> = partitioned::generations(&mut conn)
            .unwrap()
            .iter()
            .map(|g| g.generation)
            .collect();
        assert_eq!(exists, [2, 3]);
        assert!(
            processed(&mut conn, "g1-0"),
            "a dropped generation's ids are forgotten"
        );
        assert!(
            !processed(&mut conn, "g2-0"),
            "generation 2 is inside the window"
        );
        assert!(!processed(&mut conn, "g3-0"));

        // Per-handler windows keep generations for the longest one.
        let longer_for_audit = keep_a_week
            .clone()
            .with_handler(handler("audit"), secs(30 * DAY));
        age_generation(&mut conn, 2, 20 * DAY);
        let report = partitioned::drop_expired(&mut conn, &longer_for_audit).unwrap();
        assert_eq!(report.partitions_dropped, 0, "{report}");
        let report = partitioned::drop_expired(&mut conn, &keep_a_week).unwrap();
        assert_eq!(report.partitions_dropped, 1, "{report}");

        // A policy for one handler cannot drop generations of everybody.
        let err =
            partitioned::drop_expired(&mut conn, &keep_a_week.only(handler("h"))).unwrap_err();
        assert!(
            matches!(err.error(), InboxError::InvalidRetention { .. }),
            "{err}"
        );
    }

    #[test]
    fn an_interrupted_detach_is_finished_by_the_next_drop() {
        let Some((_db, mut conn)) = partitioned_db() else {
            return;
        };
        seed::<Postgres>(&mut conn, "h", &ids("g1", 10), None);
        partitioned::rotate(&mut conn, LOCK_TIMEOUT).unwrap();
        age_generation(&mut conn, 1, 30 * DAY);
        // Detached by hand, as if a prune died between detaching and dropping.
        conn.batch_execute("ALTER TABLE inbox_messages_archive DETACH PARTITION inbox_messages_g1")
            .unwrap();
        let report = partitioned::drop_expired(&mut conn, &policy(7 * DAY, DAY)).unwrap();
        assert_eq!(report.partitions_dropped, 1, "{report}");
        assert!(processed(&mut conn, "g1-0"));
    }

    #[test]
    fn maintenance_rotates_when_due_and_drops_what_expired() {
        let Some((_db, mut conn)) = partitioned_db() else {
            return;
        };
        let maintenance = Maintenance::new(policy(7 * DAY, DAY))
            .and_then(|maintenance| maintenance.generations(7))
            .unwrap()
            .lock_timeout(LOCK_TIMEOUT);
        let report = maintenance.run(&mut conn).unwrap();
        assert_eq!(
            (report.partitions_created, report.partitions_dropped),
            (0, 0),
            "not due yet"
        );

        // The current generation started two days ago: rotate.
        conn.batch_execute("UPDATE inbox_generations SET started_at = now() - interval '2 days'")
            .unwrap();
        assert!(processed(&mut conn, "x"));
        let report = maintenance.run(&mut conn).unwrap();
        assert_eq!(report.partitions_created, 1, "{report}");
        assert!(!processed(&mut conn, "x"));

        // Generation 1 ended long ago: dropped, and no new rotation yet.
        age_generation(&mut conn, 1, 9 * DAY);
        let report = maintenance.run(&mut conn).unwrap();
        assert_eq!(
            (report.partitions_created, report.partitions_dropped),
            (0, 1),
            "{report}"
        );
        assert!(processed(&mut conn, "x"));

        // Batched pruning still works on the current generation.
        seed::<Postgres>(&mut conn, "h", &ids("old", 30), Some(30 * DAY));
        let report = Prune::new(policy(7 * DAY, DAY)).run(&mut conn).unwrap();
        assert_eq!(report.rows_deleted, 30, "{report}");
    }

    /// Moves the whole layout `days` into the past: every generation started
    /// and ended that much earlier (what passing time does to it).
    fn days_pass(conn: &mut PgConnection, days: i64) {
        conn.batch_execute(&format!(
            "UPDATE inbox_generations SET started_at = started_at - interval '{days} days', \
             ended_at = ended_at - interval '{days} days'"
        ))
        .unwrap();
    }

    fn archived_generations(conn: &mut PgConnection) -> usize {
        partitioned::generations(conn)
            .unwrap()
            .iter()
            .filter(|generation| !generation.is_current())
            .count()
    }

    /// An inbox run the old way (one generation per day of a 30-day window:
    /// 30 archived generations, each probed by every claim) moves to
    /// `Maintenance`'s bounded generations (the window split in 2, the
    /// default): every id stays a duplicate for its whole window on every
    /// simulated day of the change, the old daily generations expire one by
    /// one, and from then on a claim probes at most 3 archived generations.
    #[test]
    fn moving_to_bounded_generations_keeps_every_claim() {
        let Some((_db, mut conn)) = partitioned_db() else {
            return;
        };
        const WINDOW_DAYS: i64 = 30;
        // (id, day claimed); day 0 is when the change happens.
        let mut claimed: Vec<(String, i64)> = Vec::new();
        for day in -WINDOW_DAYS..0 {
            for i in 0..2 {
                let id = format!("old-{day}-{i}");
                assert!(processed(&mut conn, &id));
                claimed.push((id, day));
            }
            days_pass(&mut conn, 1);
            partitioned::rotate(&mut conn, LOCK_TIMEOUT).unwrap();
        }
        assert_eq!(archived_generations(&mut conn), 30);

        let maintenance = Maintenance::new(policy(WINDOW_DAYS * DAY, DAY))
            .unwrap()
            .lock_timeout(LOCK_TIMEOUT);
        assert_eq!(maintenance.period(), secs(WINDOW_DAYS * DAY) / 2);
        let mut most_archived_after_the_change = 0;
        let mut oldest_kept = 0;
        for day in 0..(2 * WINDOW_DAYS) {
            let report = maintenance.run(&mut conn).unwrap();
            assert!(report.partitions_created <= 1, "day {day}: {report}");
            // Every id younger than the window is still a duplicate.
            for (id, claimed_on) in &claimed {
                if day - claimed_on < WINDOW_DAYS {
                    assert!(
                        !processed(&mut conn, id),
                        "day {day}: {id}, claimed on day {claimed_on}, was accepted again"
                    );
                }
            }
            for i in 0..2 {
                let id = format!("new-{day}-{i}");
                assert!(processed(&mut conn, &id), "day {day}: {id} is new");
                claimed.push((id, day));
            }
            let archived = archived_generations(&mut conn);
            if day > WINDOW_DAYS {
                most_archived_after_the_change = most_archived_after_the_change.max(archived);
                // The storage side: no id outlives the window plus one
                // period (15 days) and the day the simulation steps by.
                let stored: BTreeSet<String> = conn
                    .texts(
                        "SELECT message_id AS value FROM inbox_messages \
                         UNION ALL SELECT message_id FROM inbox_messages_archive",
                    )
                    .into_iter()
                    .collect();
                let oldest = claimed
                    .iter()
                    .filter(|(id, _)| stored.contains(id))
                    .map(|(_, claimed_on)| day - claimed_on)
                    .max()
                    .unwrap_or(0);
                oldest_kept = oldest_kept.max(oldest);
            }
            days_pass(&mut conn, 1);
        }
        assert!(
            (2..=3).contains(&most_archived_after_the_change),
            "once the daily generations expired, {most_archived_after_the_change} archived generations (expected at most 2 + 1)"
        );
        assert!(
            (WINDOW_DAYS..=WINDOW_DAYS + WINDOW_DAYS / 2 + 1).contains(&oldest_kept),
            "the oldest id kept was {oldest_kept} days old (window {WINDOW_DAYS} days, period {} days)",
            WINDOW_DAYS / 2
        );
        // The oldest ids did expire (the layout does drop them).
        assert!(processed(&mut conn, "old--30-0"));
    }

    /// A REPEATABLE READ transaction whose snapshot predates a rotation must not
    /// claim an id archived by it: the guard refuses it with 40001, and the
    /// retry sees the duplicate.
    #[test]
    fn repeatable_read_snapshot_older_than_a_rotation_is_refused() {
        let Some((db, mut conn)) = partitioned_db() else {
            return;
        };
        let mut late = db.connect();
        late.batch_execute(
            "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        )
        .unwrap();
        let result = late.transaction(|late| {
            // The snapshot is taken here, before "k" exists.
            diesel::sql_query("SELECT 1").execute(late)?;
            assert!(processed(&mut conn, "k"));
            partitioned::rotate(&mut conn, LOCK_TIMEOUT).unwrap();
            // "k" is now archived, invisible to this snapshot.
            let key = inbox_runtime::ClaimKey::new(handler("h"), "k").unwrap();
            inbox_runtime::claim(late, &key)
        });
        assert!(
            matches!(
                result,
                Err(diesel::result::Error::DatabaseError(
                    DatabaseErrorKind::SerializationFailure,
                    _
                ))
            ),
            "{result:?}"
        );
        assert!(!processed(&mut late, "k"), "the retry sees the duplicate");
    }

    /// Workers deliver the same ids in different orders while generations
    /// rotate under them every few milliseconds: each id's effect happens once.
    fn deliveries_race_rotations(isolation: &str) {
        let Some((db, mut conn)) = partitioned_db() else {
            return;
        };
        create_ledger(&mut conn);
        const WORKERS: usize = 4;
        const IDS: usize = 300;
        let all = ids("m", IDS);
        let stop = AtomicBool::new(false);
        let (rotations, retries) = thread::scope(|scope| {
            let rotator = scope.spawn(|| {
                let mut conn = db.connect();
                let mut rotations = 0;
                // Every claim probes each archived generation: keep their number
                // realistic (a week of daily generations is 7).
                while !stop.load(Ordering::SeqCst) && rotations < 40 {
                    partitioned::rotate(&mut conn, LOCK_TIMEOUT).expect("rotation succeeds");
                    rotations += 1;
                    thread::sleep(Duration::from_millis(20));
                }
                rotations
            });
            let workers: Vec<_> = (0..WORKERS)
                .map(|worker| {
                    let (db, all) = (&db, &all);
                    scope.spawn(move || {
                        let mut conn = db.connect();
                        conn.batch_execute(&format!(
                            "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL {isolation}"
                        ))
                        .unwrap();
                        let mut retries = 0;
                        for i in 0..IDS {
                            // Pairs of workers in near lockstep (same ids at the
                            // same time), in opposite directions across pairs.
                            let position = if worker % 2 == 0 {
                                i + worker
                            } else {
                                IDS - 1 - i + worker
                            };
                            let id = &all[position % IDS];
                            loop {
                                match deliver(&mut conn, "h", id, true) {
                                    Ok(_) => break,
                                    Err(InboxError::Database(
                                        diesel::result::Error::DatabaseError(
                                            DatabaseErrorKind::SerializationFailure,
                                            _,
                                        ),
                                    )) => retries += 1,
                                    Err(error) => panic!("{id}: {error}: {error:?}"),
                                }
                            }
                        }
                        retries
                    })
                })
                .collect();
            let retries: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
            stop.store(true, Ordering::SeqCst);
            (rotator.join().unwrap(), retries)
        });
        let mut effects: BTreeMap<String, usize> = BTreeMap::new();
        for id in ledger(&mut conn) {
            *effects.entry(id).or_default() += 1;
        }
        eprintln!("{isolation}: {rotations} rotations, {retries} serialization retries");
        assert!(rotations > 1, "rotations happened during the deliveries");
        assert_eq!(effects.len(), IDS, "every id processed");
        let twice: Vec<_> = effects.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "processed more than once: {twice:?}");
    }

    #[test]
    fn deliveries_race_rotations_read_committed() {
        deliveries_race_rotations("READ COMMITTED");
    }

    #[test]
    fn deliveries_race_rotations_repeatable_read() {
        deliveries_race_rotations("REPEATABLE READ");
    }

    /// Pruners on several nodes: one at a time drops generations (it holds
    /// the layout's lease); the others return at once without touching
    /// anything, and a lease whose holder died is taken over once expired.
    #[test]
    fn one_maintenance_at_a_time() {
        let Some((_db, mut conn)) = partitioned_db() else {
            return;
        };
        partitioned::rotate(&mut conn, LOCK_TIMEOUT).unwrap();
        age_generation(&mut conn, 1, 30 * DAY);
        // Another node's run, under way.
        conn.batch_execute(
            "INSERT INTO inbox_maintenance_lease (holder, expires_at) \
             VALUES ('another node', now() + interval '5 minutes')",
        )
        .unwrap();
        let report = partitioned::drop_expired(&mut conn, &policy(7 * DAY, DAY)).unwrap();
        assert_eq!(
            (report.partitions_dropped, report.caught_up),
            (0, false),
            "{report}"
        );
        let maintenance = partitioned::Maintenance::new(policy(7 * DAY, DAY)).unwrap();
        let report = maintenance.run(&mut conn).unwrap();
        assert_eq!(
            (report.partitions_dropped, report.caught_up),
            (0, false),
            "{report}"
        );
        // That node died: its lease runs out.
        conn.batch_execute(
            "UPDATE inbox_maintenance_lease SET expires_at = now() - interval '1 second'",
        )
        .unwrap();
        let report = partitioned::drop_expired(&mut conn, &policy(7 * DAY, DAY)).unwrap();
        assert_eq!(
            (report.partitions_dropped, report.caught_up),
            (1, true),
            "{report}"
        );
        assert_eq!(
            conn.bigint("SELECT COUNT(*) AS value FROM inbox_maintenance_lease"),
            0,
            "the run gave the lease back"
        );
    }

    /// A run that loses its lease while it works (it expired and another
    /// run took it) stops before its next generation: not caught up.
    #[test]
    fn a_run_that_lost_its_lease_stops() {
        let Some((db, mut conn)) = partitioned_db() else {
            return;
        };
        partitioned::rotate(&mut conn, LOCK_TIMEOUT).unwrap();
        partitioned::rotate(&mut conn, LOCK_TIMEOUT).unwrap();
        age_generation(&mut conn, 1, 30 * DAY);
        age_generation(&mut conn, 2, 30 * DAY);
        // The first generation's detach waits for this reader of the
        // archive; meanwhile the lease passes to another run.
        let mut reader = db.connect();
        reader
            .batch_execute("BEGIN; SELECT COUNT(*) FROM inbox_messages_archive")
            .unwrap();
        let report = std::thread::scope(|scope| {
            let run = scope.spawn(|| partitioned::drop_expired(&mut conn, &policy(7 * DAY, DAY)));
            let mut other = db.connect();
            let started = std::time::Instant::now();
            while other.bigint(
                "SELECT COUNT(*) AS value FROM pg_stat_activity \
                 WHERE query LIKE '%DETACH PARTITION%CONCURRENTLY%' AND state = 'active' \
                 AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
            ) == 0
            {
                assert!(started.elapsed().as_secs() < 30, "the detach never waited");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other
                .batch_execute("UPDATE inbox_maintenance_lease SET holder = 'another run'")
                .unwrap();
            reader.batch_execute("COMMIT").unwrap();
            run.join().unwrap().unwrap()
        });
        assert_eq!(
            (report.partitions_dropped, report.caught_up),
            (1, false),
            "{report}"
        );
        assert_eq!(
            conn.texts("SELECT holder AS value FROM inbox_maintenance_lease"),
            vec!["another run".to_owned()],
            "the lease stays the other run's"
        );
    }

    /// Applications often run the plain `setup` at every start: it must not
    /// disturb the generation layout.
    #[test]
    fn plain_setup_after_rotations_changes_nothing() {
        let Some((_db, mut conn)) = partitioned_db() else {
            return;
        };
        assert!(processed(&mut conn, "a"));
        partitioned::rotate(&mut conn, LOCK_TIMEOUT).unwrap();
        inbox_runtime::setup(&mut conn).unwrap();
        partitioned::setup(&mut conn).unwrap();
        #[derive(QueryableByName)]
        struct Indexes {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let indexes: Indexes = diesel::sql_query(
            "SELECT count(*) AS n FROM pg_index WHERE indrelid = 'inbox_messages'::regclass",
        )
        .get_result(&mut conn)
        .unwrap();
        assert_eq!(
            indexes.n, 3,
            "the primary key, the received_at and (handler, received_at) indexes, no duplicate"
        );
        assert!(!processed(&mut conn, "a"));
        assert_eq!(partitioned::generations(&mut conn).unwrap().len(), 2);
    }

    /// Periods and ages beyond `MAX_RETENTION` cannot overflow PostgreSQL's
    /// interval or timestamp arithmetic: a rotation "older than forever" is
    /// simply never due, and the longest window drops nothing recent.
    #[test]
    fn extreme_ages_do_not_overflow() {
        let Some((_db, mut conn)) = partitioned_db() else {
            return;
        };
        assert_eq!(
            partitioned::rotate_if_older_than(&mut conn, Duration::MAX, LOCK_TIMEOUT).unwrap(),
            None
        );
        assert_eq!(
            partitioned::rotate_if_older_than(
                &mut conn,
                inbox_runtime::MAX_RETENTION,
                LOCK_TIMEOUT
            )
            .unwrap(),
            None
        );
        partitioned::rotate(&mut conn, LOCK_TIMEOUT).unwrap();
        age_generation(&mut conn, 1, 30 * DAY);
        let longest =
            inbox_runtime::RetentionPolicy::new(inbox_runtime::MAX_RETENTION, secs(DAY)).unwrap();
        let maintenance = Maintenance::new(longest)
            .and_then(|maintenance| maintenance.generations(1))
            .unwrap()
            .lock_timeout(LOCK_TIMEOUT);
        let report = maintenance.run(&mut conn).unwrap();
        assert_eq!(
            (report.partitions_dropped, report.partitions_created),
            (0, 0),
            "{report}"
        );
    }

    #[derive(QueryableByName)]
    struct Pid {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        pid: i32,
    }

    fn backend_pid(conn: &mut PgConnection) -> i32 {
        diesel::sql_query("SELECT pg_backend_pid() AS pid")
            .get_result::<Pid>(conn)
            .unwrap()
            .pid
    }

    /// Waits until backend `pid` waits for a lock.
    fn wait_until_blocked(conn: &mut PgConnection, pid: i32) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let waiting = conn.bigint(&format!(
                "SELECT count(*) AS value FROM pg_locks WHERE pid = {pid} AND NOT granted"
            ));
            if waiting > 0 {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "backend {pid} never blocked"
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Which delivery of the id reaches the table first.
    #[derive(Clone, Copy, PartialEq)]
    enum Order {
        /// The second delivery queues behind the rotation, which waits for the
        /// first delivery's transaction.
        RotationFirst,
        /// The second delivery waits on the first one's row; the rotation
        /// queues behind both.
        SecondFirst,
    }

    /// Two deliveries of one id race a rotation, lined up deterministically:
    /// the first claims and holds its transaction open, the rotation and the
    /// second delivery queue (in `order`), then the first commits (or rolls
    /// back). The second must see a duplicate (or claim the id), or, at
    /// REPEATABLE READ with a snapshot older than the rotation, fail with a
    /// retryable serialization failure after which it sees the same.
    fn claim_races_rotation(isolation: &str, order: Order, first_commits: bool) {
        if inbox_tests::skipped_behind_pgbouncer("it watches a connection's server session by id") {
            return;
        }
        let Some((db, mut conn)) = partitioned_db() else {
            return;
        };
        let key = inbox_runtime::ClaimKey::new(handler("h"), "x").unwrap();
        let mut first = db.connect();
        let db = &db;
        let (rotated, second) = thread::scope(|scope| {
            let (pid_tx, pid_rx) = std::sync::mpsc::channel();
            let mut rotator = None;
            let mut second = None;
            let start_rotator = |pid_tx: std::sync::mpsc::Sender<i32>| {
                scope.spawn(move || {
                    let mut conn = db.connect();
                    pid_tx.send(backend_pid(&mut conn)).unwrap();
                    partitioned::rotate(&mut conn, Duration::from_secs(60))
                })
            };
            let start_second = |pid_tx: std::sync::mpsc::Sender<i32>| {
                let key = &key;
                scope.spawn(move || {
                    let mut conn = db.connect();
                    conn.batch_execute(&format!(
                        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL {isolation}"
                    ))
                    .unwrap();
                    pid_tx.send(backend_pid(&mut conn)).unwrap();
                    conn.transaction(|conn| {
                        // The snapshot (at REPEATABLE READ) is taken here.
                        diesel::sql_query("SELECT 1").execute(conn)?;
                        inbox_runtime::claim(conn, key)
                    })
                })
            };
            let outcome = first.transaction(|first| {
                assert_eq!(
                    inbox_runtime::claim(first, &key)?,
                    inbox_runtime::Claim::Claimed
                );
                if order == Order::RotationFirst {
                    rotator = Some(start_rotator(pid_tx.clone()));
                    wait_until_blocked(&mut conn, pid_rx.recv().unwrap());
                    second = Some(start_second(pid_tx.clone()));
                    wait_until_blocked(&mut conn, pid_rx.recv().unwrap());
                } else {
                    second = Some(start_second(pid_tx.clone()));
                    wait_until_blocked(&mut conn, pid_rx.recv().unwrap());
                    rotator = Some(start_rotator(pid_tx.clone()));
                    wait_until_blocked(&mut conn, pid_rx.recv().unwrap());
                }
                if first_commits {
                    Ok(())
                } else {
                    Err(diesel::result::Error::RollbackTransaction)
                }
            });
            assert_eq!(outcome.is_ok(), first_commits);
            (
                rotator.unwrap().join().unwrap(),
                second.unwrap().join().unwrap(),
            )
        });
        assert_eq!(rotated.expect("the rotation succeeds"), 2);

        let expected = if first_commits {
            inbox_runtime::Claim::Duplicate
        } else {
            inbox_runtime::Claim::Claimed
        };
        let serialization_failure = matches!(
            second,
            Err(diesel::result::Error::DatabaseError(
                DatabaseErrorKind::SerializationFailure,
                _
            ))
        );
        match (isolation, order) {
            ("REPEATABLE READ", Order::RotationFirst) => {
                assert!(serialization_failure, "{second:?}");
                // The retry, with a fresh snapshot.
                let retried = conn.transaction(|conn| inbox_runtime::claim(conn, &key));
                assert_eq!(retried.unwrap(), expected);
            }
            // Waiting on the first delivery's row at REPEATABLE READ: a
            // committed conflicting row is a serialization failure too.
            ("REPEATABLE READ", Order::SecondFirst) if first_commits => {
                assert!(serialization_failure, "{second:?}");
            }
            _ => assert_eq!(second.unwrap(), expected),
        }
        // Whoever claimed it, the id is remembered once, across generations.
        assert!(!processed(&mut conn, "x"), "the id is a duplicate now");
        let copies = conn.bigint(
            "SELECT (SELECT count(*) FROM inbox_messages WHERE message_id = 'x') \
                  + (SELECT count(*) FROM inbox_messages_archive WHERE message_id = 'x') AS value",
        );
        assert_eq!(copies, 1);
    }

    #[test]
    fn claim_races_rotation_read_committed() {
        for order in [Order::RotationFirst, Order::SecondFirst] {
            for first_commits in [true, false] {
                claim_races_rotation("READ COMMITTED", order, first_commits);
            }
        }
    }

    #[test]
    fn claim_races_rotation_repeatable_read() {
        for order in [Order::RotationFirst, Order::SecondFirst] {
            for first_commits in [true, false] {
                claim_races_rotation("REPEATABLE READ", order, first_commits);
            }
        }
    }

    /// `run`'s result while a handler's transaction on `handler_conn`, still
    /// open, holds the claim of `id` (handler `h`) and so its lock.
    fn run_while_claimed<T>(
        handler_conn: &mut PgConnection,
        id: &str,
        run: impl FnOnce() -> T,
    ) -> T {
        handler_conn
            .transaction(|handler_conn| {
                let key = inbox_runtime::ClaimKey::new(handler("h"), id).unwrap();
                assert_eq!(
                    inbox_runtime::claim(handler_conn, &key)?,
                    inbox_runtime::Claim::Claimed
                );
                Ok::<_, diesel::result::Error>(run())
            })
            .unwrap()
    }

    /// A maintenance run with nothing to do (no rotation due, nothing expired)
    /// takes no lock on the inbox: a handler's transaction left open does not
    /// make it wait, so it neither fails on its lock timeout (55P03) nor makes
    /// the claims behind it wait.
    #[test]
    fn a_maintenance_run_with_nothing_due_waits_for_no_claim() {
        let Some((db, mut conn)) = partitioned_db() else {
            return;
        };
        let maintenance = Maintenance::new(policy(7 * DAY, DAY))
            .and_then(|maintenance| maintenance.generations(7))
            .unwrap()
            .lock_timeout(Duration::from_millis(200));
        let mut handler_conn = db.connect();
        let run = run_while_claimed(&mut handler_conn, "open", || maintenance.run(&mut conn));
        let report = run.expect("a run with nothing due does not wait for the open claim");
        assert_eq!(
            (report.partitions_created, report.partitions_dropped),
            (0, 0),
            "{report}"
        );
        // A due rotation still waits for it (and so is bounded by the timeout).
        conn.batch_execute("UPDATE inbox_generations SET started_at = now() - interval '2 days'")
            .unwrap();
        let run = run_while_claimed(&mut handler_conn, "open-2", || maintenance.run(&mut conn));
        let err = run.expect_err("a due rotation waits for the open claim");
        assert!(err.to_string().contains("lock timeout"), "{err}");
        let report = maintenance.run(&mut conn).unwrap();
        assert_eq!(report.partitions_created, 1, "{report}");
    }

    /// Two rotations due at once, both waiting for a claim in progress: the
    /// first rotates, the second checks again once it holds the lock and finds
    /// nothing due (at READ COMMITTED), or fails with a serialization failure (at
    /// REPEATABLE READ, where its snapshot cannot see the first rotation).
    fn rotations_waiting_at_once(isolation: &str) -> Vec<Result<Option<i64>, InboxError>> {
        if inbox_tests::skipped_behind_pgbouncer(
            "it watches its connections' server sessions by id",
        ) {
            return Vec::new();
        }
        let Some((db, mut conn)) = partitioned_db() else {
            return Vec::new();
        };
        conn.batch_execute("UPDATE inbox_generations SET started_at = now() - interval '2 days'")
            .unwrap();
        let key = inbox_runtime::ClaimKey::new(handler("h"), "held").unwrap();
        let mut holder = db.connect();
        let db = &db;
        let results = thread::scope(|scope| {
            let (pid_tx, pid_rx) = std::sync::mpsc::channel();
            let rotate = |pid_tx: std::sync::mpsc::Sender<i32>| {
                scope.spawn(move || {
                    let mut conn = db.connect();
                    conn.batch_execute(&format!(
                        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL {isolation}"
                    ))
                    .unwrap();
                    pid_tx.send(backend_pid(&mut conn)).unwrap();
                    partitioned::rotate_if_older_than(&mut conn, secs(DAY), Duration::from_secs(60))
                })
            };
            let mut rotations = Vec::new();
            holder
                .transaction(|holder| {
                    assert_eq!(
                        inbox_runtime::claim(holder, &key)?,
                        inbox_runtime::Claim::Claimed
                    );
                    for _ in 0..2 {
                        rotations.push(rotate(pid_tx.clone()));
                        wait_until_blocked(&mut conn, pid_rx.recv().unwrap());
                    }
                    Ok::<_, diesel::result::Error>(())
                })
                .unwrap();
            rotations
                .into_iter()
                .map(|rotation| rotation.join().unwrap())
                .collect::<Vec<_>>()
        });
        assert_eq!(partitioned::generations(&mut conn).unwrap().len(), 2);
        results
    }

    /// [`rotations_waiting_at_once`], checked to have rotated once (the
    /// first, to generation 2): the second's result, or `None` (skipped).
    fn second_of_rotations_waiting_at_once(
        isolation: &str,
    ) -> Option<Result<Option<i64>, InboxError>> {
        let results = rotations_waiting_at_once(isolation);
        let [first, second] = match <[_; 2]>::try_from(results) {
            Ok(two) => two,
            Err(results) => {
                assert!(results.is_empty(), "skipped, or two rotations: {results:?}");
                return None;
            }
        };
        assert_eq!(first.as_ref().unwrap(), &Some(2));
        Some(second)
    }

    #[test]
    fn rotations_waiting_at_once_rotate_once_read_committed() {
        let Some(second) = second_of_rotations_waiting_at_once("READ COMMITTED") else {
            return;
        };
        assert_eq!(second.as_ref().unwrap(), &None);
    }

    #[test]
    fn rotations_waiting_at_once_rotate_once_repeatable_read() {
        let Some(second) = second_of_rotations_waiting_at_once("REPEATABLE READ") else {
            return;
        };
        assert!(
            matches!(
                second,
                Err(InboxError::Database(diesel::result::Error::DatabaseError(
                    DatabaseErrorKind::SerializationFailure,
                    _
                )))
            ),
            "{second:?}"
        );
    }

    /// A connection to `first` whose search path also has `second`, after it.
    fn search_path(first: &Postgres, second: &Postgres) -> PgConnection {
        let url = first.url().replace(
            &format!("%3D{}", first.schema()),
            &format!("%3D{}%2C{}", first.schema(), second.schema()),
        );
        assert_ne!(
            url,
            first.url(),
            "the test schema's URL sets its search path"
        );
        PgConnection::establish(&url).unwrap()
    }

    fn generation_numbers(conn: &mut PgConnection) -> Vec<i64> {
        partitioned::generations(conn)
            .unwrap()
            .iter()
            .map(|g| g.generation)
            .collect()
    }

    /// A plain inbox in schema `a`, a partitioned one in `b`, and a session whose
    /// search path is `a, b`: its inbox is a's, so the generation layout's
    /// functions find nothing of theirs, and b's generations are never touched
    /// (they used to be found through the search path, and dropped).
    #[test]
    fn maintenance_never_reaches_another_schemas_generations() {
        if inbox_tests::skipped_behind_pgbouncer(
            "it sets a search_path of its own, which PgBouncer does not pass on",
        ) {
            return;
        }
        let Some((b, mut b_conn)) = partitioned_db() else {
            return;
        };
        let Some(a) = Postgres::open() else {
            return;
        };
        partitioned::rotate(&mut b_conn, LOCK_TIMEOUT).unwrap();
        age_generation(&mut b_conn, 1, 30 * DAY);

        let mut conn = search_path(&a, &b);
        assert!(
            !partitioned::is_partitioned(&mut conn).unwrap(),
            "the inbox in the search path is a's, which is plain"
        );
        let maintenance = Maintenance::new(policy(7 * DAY, DAY))
            .and_then(|maintenance| maintenance.generations(7))
            .unwrap()
            .lock_timeout(LOCK_TIMEOUT);
        let err = maintenance.run(&mut conn).unwrap_err();
        assert!(err.to_string().contains("inbox_generations"), "{err}");
        let err = partitioned::drop_expired(&mut conn, &policy(7 * DAY, DAY)).unwrap_err();
        assert!(err.to_string().contains("inbox_generations"), "{err}");
        assert!(partitioned::rotate(&mut conn, LOCK_TIMEOUT).is_err());
        assert_eq!(generation_numbers(&mut b_conn), [1, 2], "b is untouched");

        // Through b's own search path, b's maintenance does its work.
        let report = maintenance.run(&mut b_conn).unwrap();
        assert_eq!(report.partitions_dropped, 1, "{report}");
    }

    /// The layout's SQL functions run with their own schema as search path: a
    /// session whose search path finds another partitioned inbox first, calling
    /// b's rotation or inserting into b's table, reaches b's tables only.
    #[test]
    fn layout_functions_use_their_own_schema() {
        if inbox_tests::skipped_behind_pgbouncer(
            "it sets a search_path of its own, which PgBouncer does not pass on",
        ) {
            return;
        }
        let Some((b, mut b_conn)) = partitioned_db() else {
            return;
        };
        let Some((a, mut a_conn)) = partitioned_db() else {
            return;
        };
        assert!(processed(&mut b_conn, "x"));
        partitioned::rotate(&mut b_conn, LOCK_TIMEOUT).unwrap();
        partitioned::rotate(&mut a_conn, LOCK_TIMEOUT).unwrap();
        let (a_before, b_before) = (
            generation_numbers(&mut a_conn),
            generation_numbers(&mut b_conn),
        );
        assert_eq!((a_before.len(), b_before.len()), (2, 2));

        let mut conn = search_path(&a, &b);
        // "x" is in b's archive: b's guard must look there, not in a's.
        let inserted = diesel::sql_query(format!(
            "INSERT INTO {}.inbox_messages (handler, message_id) VALUES ('h', 'x') \
             ON CONFLICT (handler, message_id) DO NOTHING",
            b.schema()
        ))
        .execute(&mut conn)
        .unwrap();
        assert_eq!(inserted, 0, "a duplicate of b's archived id");
        // b's rotation rotates b.
        diesel::sql_query(format!("SELECT {}.inbox_rotate()", b.schema()))
            .execute(&mut conn)
            .unwrap();
        assert_eq!(generation_numbers(&mut a_conn), a_before, "a is untouched");
        assert_eq!(generation_numbers(&mut b_conn), [1, 2, 3]);
        assert!(!processed(&mut b_conn, "x"), "b still knows x");
        assert!(processed(&mut a_conn, "x"), "a never saw x");
    }

    /// The same on PostgreSQL's generation layout, where claims go through its
    /// trigger.
    #[test]
    fn held_rows_survive_in_the_generation_layout() {
        if let Some(db) = Postgres::open() {
            partitioned::setup(&mut db.connect()).unwrap();
            held_rows_survive_with(&db, |prune| prune.run(&mut db.connect()));
        }
    }

    /// In the generation layout, a claim still open holds the rotation back: it
    /// cannot archive (nor a later drop remove) an id whose transaction has not
    /// ended. The rotation fails at its lock timeout, changing nothing; once
    /// the claim commits, it archives the id, which stays a duplicate.
    #[test]
    fn open_claim_holds_back_a_rotation() {
        let Some(db) = Postgres::open() else {
            return;
        };
        let mut conn = db.connect();
        partitioned::setup(&mut conn).unwrap();
        let mut holder = db.connect();
        holder
            .transaction(|holder| {
                let open = ClaimKey::new(handler("h"), "open-0").unwrap();
                assert_eq!(claim(holder, &open)?, Claim::Claimed);
                let err = partitioned::rotate(&mut conn, Duration::from_millis(200)).unwrap_err();
                assert!(err.is_retryable(), "a lock timeout: {err:?}");
                assert_eq!(partitioned::generations(&mut conn).unwrap().len(), 1);
                diesel::QueryResult::Ok(())
            })
            .unwrap();
        assert_eq!(
            partitioned::rotate(&mut conn, Duration::from_secs(5)).unwrap(),
            2
        );
        assert_eq!(
            deliver(&mut conn, "h", "open-0", false).unwrap(),
            Outcome::Duplicate
        );
    }

    #[derive(QueryableByName)]
    struct Clock {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        after_start: bool,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        not_after_now: bool,
    }

    /// Claims `id` late in a transaction that began earlier: `received_at`
    /// is later than the transaction's start (`now()`), and not later than
    /// the clock after the claim.
    fn late_claim(conn: &mut PgConnection, id: &str) {
        let clock = conn
            .transaction(|conn| {
                // The transaction's start is fixed by its first statement.
                conn.batch_execute("SELECT now(); SELECT pg_sleep(0.05)")?;
                assert_eq!(
                    deliver(conn, "h", id, false).expect("the claim"),
                    Outcome::Processed(())
                );
                diesel::sql_query(format!(
                    "SELECT received_at > now() AS after_start, \
                            received_at <= clock_timestamp() AS not_after_now \
                     FROM inbox_messages WHERE handler = 'h' AND message_id = '{id}'"
                ))
                .get_result::<Clock>(conn)
            })
            .unwrap();
        assert!(
            clock.after_start,
            "{id}: received_at is the claim's statement time, not the transaction's start"
        );
        assert!(clock.not_after_now);
    }

    #[test]
    fn a_claim_late_in_a_transaction_gets_its_statement_time() {
        let Some(db) = Postgres::open() else {
            return;
        };
        let mut conn = db.connect();
        late_claim(&mut conn, "plain");

        // An inbox of the first version, upgraded by the migrations.
        let mut conn = without_inbox(&db);
        run_first_migration(&mut conn);
        run_pending_migrations(&mut conn);
        late_claim(&mut conn, "migrated");

        // The generation layout: the converted table, then a new generation.
        partitioned::setup(&mut conn).unwrap();
        late_claim(&mut conn, "generation-1");
        partitioned::rotate(&mut conn, Duration::from_secs(5)).unwrap();
        late_claim(&mut conn, "generation-2");
    }

    #[derive(QueryableByName)]
    struct Proc {
        #[diesel(sql_type = diesel::sql_types::Text)]
        proname: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        config: Option<String>,
    }

    /// A generation layout converted by the first versions of both migration
    /// sets, with a generation rotated by the old functions, is upgraded by
    /// the later migrations: functions, the current table's index and
    /// default, and the tables of later rotations.
    #[test]
    fn migrations_upgrade_an_old_generation_layout() {
        let Some(db) = Postgres::open() else {
            return;
        };
        let new = describe::<Postgres>(&mut db.connect());
        let mut conn = without_inbox(&db);
        let mut layout =
            MigrationSource::<diesel::pg::Pg>::migrations(&partitioned::MIGRATIONS).unwrap();
        layout.sort_by_key(|migration| migration.name().version().to_string());
        run_first_migration(&mut conn);
        conn.run_migration(&*layout[0]).unwrap();
        assert!(deliver(&mut conn, "h", "before", false).is_ok());
        partitioned::rotate(&mut conn, Duration::from_secs(5)).unwrap();

        run_pending_migrations(&mut conn);
        conn.run_pending_migrations(partitioned::MIGRATIONS)
            .unwrap();
        let functions: Vec<Proc> = diesel::sql_query(
            "SELECT proname::text AS proname, array_to_string(proconfig, ',') AS config \
             FROM pg_proc WHERE pronamespace = current_schema()::regnamespace \
             ORDER BY proname",
        )
        .load(&mut conn)
        .unwrap();
        // The outbox's commit notifications are not part of the schema.
        assert!(functions.iter().all(|f| f.proname != "inbox_outbox_notify"));
        let expected = format!("search_path=pg_catalog, {}, pg_temp", db.schema());
        assert_eq!(functions.len(), 3);
        for function in &functions {
            assert_eq!(
                function.config.as_deref(),
                Some(expected.as_str()),
                "{}",
                function.proname
            );
        }
        let layout_columns = |lines: Vec<String>| -> Vec<String> {
            lines
                .into_iter()
                .filter(|line| line.starts_with("index") || line.contains("received_at"))
                .map(|line| line.replace("_g2_pkey", "_pkey"))
                .collect()
        };
        let plain = layout_columns(new);
        assert_eq!(layout_columns(describe::<Postgres>(&mut conn)), plain);
        partitioned::rotate(&mut conn, Duration::from_secs(5)).unwrap();
        let rotated: Vec<String> = layout_columns(describe::<Postgres>(&mut conn))
            .into_iter()
            .map(|line| line.replace("_g3_pkey", "_pkey"))
            .collect();
        assert_eq!(rotated, plain);
        assert_eq!(
            deliver(&mut conn, "h", "before", false).unwrap(),
            Outcome::Duplicate
        );
    }
}
