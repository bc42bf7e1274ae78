//! The failover tests' machinery: a primary and its standby, the consumer
//! run through the primary's crash and the standby's promotion, and what
//! the promoted server holds afterwards.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use inbox_runtime::Outcome;
use inbox_tests::{PgServer, Replication};

use crate::app::blocking::{apply_payment, consume_at};
use crate::app::{Payment, deliveries, effect_counts, prepare};
use crate::consumer::{Progress, Report};

/// Payments per run; with every fifth delivered twice, 720 deliveries.
pub(super) const MESSAGES: usize = 600;
/// The consumer's acknowledged deliveries at which the primary dies.
pub(super) const FAIL_AT: usize = 250;
/// How long no server is writable: from the primary's death to the promotion.
pub(super) const NO_WRITABLE_SERVER: Duration = Duration::from_millis(300);

/// A primary with the application's tables, its standby, and the multi-host
/// URL naming both (the primary first).
pub(super) struct Pair {
    pub(super) primary: PgServer,
    pub(super) standby: PgServer,
    pub(super) url: String,
}

impl Pair {
    pub(super) fn start(replication: Replication) -> Option<Pair> {
        let primary = PgServer::start()?;
        prepare(&primary.url());
        let standby = primary.start_standby(replication)?;
        let url = format!(
            "postgres://postgres@{},{}/postgres?target_session_attrs=read-write",
            primary.host_port(),
            standby.host_port()
        );
        Some(Pair {
            primary,
            standby,
            url,
        })
    }
}

/// What happens to the standby before the primary dies.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Standby {
    /// It streams until the end.
    KeepsUp,
    /// It stops receiving ([`PgServer::stop_streaming`]) once the consumer
    /// acknowledged half of [`FAIL_AT`]; the primary dies once the consumer
    /// reaches [`FAIL_AT`], or [`HELD`] after the cut if it does not (a
    /// synchronous primary acknowledges nothing without its standby).
    StopsReceiving,
    /// It streams while [`WRITERS`] other sessions write bulk rows on the
    /// primary (about 1 MB of WAL per statement) until it dies: a busy
    /// primary, whose standby is further behind.
    KeepsUpUnderWriteLoad,
}

/// The sessions writing bulk rows for [`Standby::KeepsUpUnderWriteLoad`].
pub(super) const WRITERS: usize = 3;

/// Writes bulk rows on `url` until `stop` is set or the server is gone.
pub(super) fn write_ballast(url: &str, stop: &std::sync::atomic::AtomicBool) {
    use diesel::connection::SimpleConnection;
    use std::sync::atomic::Ordering;

    let Ok(mut conn) = PgConnection::establish(url) else {
        return;
    };
    let _ = conn
        .batch_execute("CREATE TABLE IF NOT EXISTS ballast (id serial PRIMARY KEY, filler text)");
    while !stop.load(Ordering::SeqCst) {
        if conn
            .batch_execute("INSERT INTO ballast (filler) SELECT repeat('x', 900) FROM generate_series(1, 1000)")
            .is_err()
        {
            return;
        }
    }
}

/// How long the primary outlives a cut in the stream at most.
pub(super) const HELD: Duration = Duration::from_secs(2);

/// What a failover did, seen from the consumer and the promoted server.
pub(super) struct Failover {
    pub(super) report: Report,
    /// When the standby stopped receiving, for [`Standby::StopsReceiving`].
    pub(super) cut_at: Option<Instant>,
    /// When the primary was gone: its immediate stop had returned (a
    /// delivery acknowledged before then may have committed on it).
    pub(super) gone_at: Instant,
    /// From [`back_since`](Self::back_since) to the consumer's next
    /// acknowledged delivery.
    pub(super) back_after: Duration,
    /// What [`back_after`](Self::back_after) counts from: the promotion, or
    /// the kill when an HA manager promotes.
    pub(super) back_since: &'static str,
    /// WAL the standby had not flushed, and not replayed, just before the
    /// primary died (what it flushed survives the promotion, which replays
    /// it).
    pub(super) lag: String,
}

impl Failover {
    /// The ids acknowledged as processed before `to` by a delivery that
    /// began after `from` (so its COMMIT came after `from` too, however late
    /// the busy machine records the acknowledgement), in delivery order.
    pub(super) fn processed_between(&self, from: Option<Instant>, to: Instant) -> Vec<String> {
        self.report
            .acks
            .iter()
            .filter(|ack| {
                ack.processed && from.is_none_or(|from| ack.started > from) && ack.at < to
            })
            .map(|ack| ack.id.clone())
            .collect()
    }

    /// The ids acknowledged as processed while the primary was alive.
    pub(super) fn processed_on_the_primary(&self) -> Vec<String> {
        self.processed_between(None, self.gone_at)
    }

    /// The ids two deliveries acknowledged as processed: a claim the
    /// failover lost, whose other copy the consumer then delivered to the
    /// promoted server (which took it as new). Such an id is on the promoted
    /// server, yet not because the standby received its first commit.
    pub(super) fn processed_twice(&self) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        self.report
            .acks
            .iter()
            .filter(|ack| ack.processed && !seen.insert(ack.id.clone()))
            .map(|ack| ack.id.clone())
            .collect()
    }
}

/// The consumer a test runs: the guide's loop on blocking or async
/// connections to a URL.
pub(super) type Consumer = fn(&str, &[Payment], &Progress) -> Result<Report, String>;

/// The blocking consumer (`PgConnection`, libpq).
pub(super) const BLOCKING: Consumer = consume_at;

/// The async consumer (`AsyncPgConnection`, tokio-postgres), on a runtime
/// of its own.
#[cfg(feature = "async")]
pub(super) const ASYNC: Consumer = |url, messages, progress| {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(crate::app::nonblocking::consume_at(url, messages, progress))
};

/// Runs the consumer over the pair, kills the primary as `standby` says,
/// waits [`NO_WRITABLE_SERVER`], promotes the standby, and lets the
/// consumer finish on it.
pub(super) fn fail_over(pair: &Pair, standby: Standby) -> Failover {
    fail_over_with(BLOCKING, pair, standby)
}

/// [`fail_over`] with the given consumer.
pub(super) fn fail_over_with(consumer: Consumer, pair: &Pair, standby: Standby) -> Failover {
    let stop_writers = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        if standby == Standby::KeepsUpUnderWriteLoad {
            for _ in 0..WRITERS {
                scope.spawn(|| write_ballast(&pair.primary.url(), &stop_writers));
            }
        }
        run_through(consumer, &pair.url, |progress| {
            let mut cut_at = None;
            if standby == Standby::StopsReceiving {
                progress.wait_for_processed(FAIL_AT / 2)?;
                pair.standby.stop_streaming();
                let cut = Instant::now();
                cut_at = Some(cut);
                while progress.processed() < FAIL_AT && cut.elapsed() < HELD {
                    std::thread::sleep(Duration::from_millis(2));
                }
            } else {
                progress.wait_for_processed(FAIL_AT)?;
            }
            let lag = standby_lag(&pair.primary.url());
            pair.primary.stop_immediate();
            let gone_at = Instant::now();
            stop_writers.store(true, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(NO_WRITABLE_SERVER);
            let promoted_at = Instant::now();
            pair.standby.promote();
            let back = progress.wait_for_recovery(promoted_at)?;
            Ok(Fault {
                cut_at,
                gone_at,
                back_after: back - promoted_at,
                back_since: "the promotion",
                lag,
            })
        })
    })
}

/// What a fault injector did, and when.
pub(super) struct Fault {
    pub(super) cut_at: Option<Instant>,
    pub(super) gone_at: Instant,
    pub(super) back_after: Duration,
    pub(super) back_since: &'static str,
    pub(super) lag: String,
}

/// Runs `consumer` on `url` over [`MESSAGES`] payments (every fifth
/// delivered twice) while `inject` breaks the servers under it, on a thread
/// of its own watching the consumer's progress.
pub(super) fn run_through(
    consumer: Consumer,
    url: &str,
    inject: impl FnOnce(&Progress) -> Result<Fault, String> + Send,
) -> Failover {
    let progress = Progress::default();
    let messages = deliveries(MESSAGES);
    std::thread::scope(|scope| {
        let injector = scope.spawn(|| inject(&progress));
        let report = consumer(url, &messages, &progress)
            .unwrap_or_else(|error| panic!("the consumer gave up: {error}"));
        let fault = injector
            .join()
            .expect("the injector panicked")
            .unwrap_or_else(|error| panic!("failover: {error}"));
        Failover {
            report,
            cut_at: fault.cut_at,
            gone_at: fault.gone_at,
            back_after: fault.back_after,
            back_since: fault.back_since,
            lag: fault.lag,
        }
    })
}

/// What the primary at `url` says of its standby's lag, just before it dies.
pub(super) fn standby_lag(url: &str) -> String {
    let mut conn = match PgConnection::establish(url) {
        Ok(conn) => conn,
        Err(error) => return format!("unknown ({error})"),
    };
    #[derive(QueryableByName)]
    struct Lag {
        #[diesel(sql_type = diesel::sql_types::Text)]
        lag: String,
    }
    diesel::sql_query(
        "SELECT COALESCE((SELECT (pg_current_wal_lsn() - flush_lsn)::text \
         || ' B not yet flushed there, ' || (pg_current_wal_lsn() - replay_lsn)::text \
         || ' B not yet replayed' FROM pg_stat_replication LIMIT 1), 'no standby streaming') AS lag",
    )
    .get_result::<Lag>(&mut conn)
    .map_or_else(|error| format!("unknown ({error})"), |row| row.lag)
}

/// The promoted server's effects per message id and its claims, with the
/// invariant a failover must keep whatever the replication: a claim and its
/// effect are there together or not at all, and no effect twice.
pub(super) fn claims_and_effects(url: &str) -> BTreeSet<String> {
    let mut conn = PgConnection::establish(url).expect("connect to the promoted server");
    let effects = effect_counts(&mut conn);
    let claims: BTreeSet<String> = {
        use inbox_runtime::schema::postgres::inbox_messages::dsl::*;
        inbox_messages
            .select(message_id)
            .load(&mut conn)
            .expect("read the claims")
            .into_iter()
            .collect()
    };
    let doubled: Vec<_> = effects.iter().filter(|&(_, &n)| n > 1).collect();
    assert!(doubled.is_empty(), "effects doubled: {doubled:?}");
    let with_effect: BTreeSet<String> = effects.into_keys().collect();
    assert_eq!(
        claims
            .symmetric_difference(&with_effect)
            .collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "a claim without its effect, or an effect without its claim"
    );
    claims
}

pub(super) fn payment(id: &str) -> Payment {
    let position: i64 = id
        .strip_prefix("pay-")
        .and_then(|n| n.parse().ok())
        .expect("a payment id");
    Payment {
        id: id.to_owned(),
        amount: position + 1,
    }
}

/// Delivers each of `ids` again on `url`: what each delivery answered.
pub(super) fn redeliver(url: &str, ids: &[String]) -> Vec<Outcome<()>> {
    let mut conn = PgConnection::establish(url).expect("connect to the promoted server");
    ids.iter()
        .map(|id| apply_payment(&mut conn, &payment(id)).expect("a redelivery"))
        .collect()
}
