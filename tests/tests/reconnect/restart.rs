//! Issue 15, 2a: the server restarted in immediate mode (every backend
//! killed, crash recovery at start) under a running consumer, three times
//! per run. The consumer must resume by itself each time, and after the run
//! every message has taken effect exactly once: the delivery in flight at
//! the crash (rolled back, or committed without the consumer hearing of it)
//! is delivered again, and the inbox makes a committed one a duplicate.
//!
//! Each run prints, per restart, how long the server took to come back
//! (`pg_ctl restart` returning) and how long until the consumer's next
//! successful delivery, both from the moment the restart was issued.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use inbox_tests::PgServer;

use crate::app::{assert_exactly_once, deliveries, prepare};
use crate::consumer::{Progress, Report};

/// Messages per run (with the broker's redeliveries, 600 deliveries).
const MESSAGES: usize = 500;
/// The consumer's successful deliveries at which the server is restarted.
const RESTART_AT: [usize; 3] = [80, 230, 380];

/// One restart, measured from the moment it was issued.
struct Figure {
    server_back: Duration,
    consumer_back: Duration,
}

/// A throwaway server with the application's tables, or `None` (skipped).
fn server() -> Option<Arc<PgServer>> {
    let server = PgServer::start()?;
    prepare(&server.url());
    Some(Arc::new(server))
}

/// Restarts `server` at each of [`RESTART_AT`], on a thread of its own, and
/// waits after each restart for the consumer's next success.
fn restarter(
    server: Arc<PgServer>,
    progress: Arc<Progress>,
) -> JoinHandle<Result<Vec<Figure>, String>> {
    std::thread::spawn(move || {
        let mut figures = Vec::new();
        for threshold in RESTART_AT {
            progress.wait_for_processed(threshold)?;
            let issued = Instant::now();
            server.restart_immediate();
            let server_back = issued.elapsed();
            let recovered = progress.wait_for_recovery(issued)?;
            figures.push(Figure {
                server_back,
                consumer_back: recovered - issued,
            });
        }
        Ok(figures)
    })
}

/// Checks and prints a run: the consumer finished, every restart was
/// survived, every message took effect exactly once.
fn conclude(
    label: &str,
    server: &PgServer,
    consumer: Result<Report, String>,
    restarts: JoinHandle<Result<Vec<Figure>, String>>,
) -> Report {
    // The restarter first: it ends once the consumer has, and holds the server.
    let figures = restarts.join().expect("the restarter panicked");
    let report = consumer.unwrap_or_else(|error| panic!("{label}: the consumer gave up: {error}"));
    let figures = figures.unwrap_or_else(|error| panic!("{label}: {error}"));
    let mut back: Vec<Duration> = figures.iter().map(|f| f.consumer_back).collect();
    back.sort();
    println!(
        "reconnect {label}: {} immediate restarts; server back after {:?}; consumer back after {:?} \
         (median {:.0?}, max {:.0?}); {report}",
        figures.len(),
        figures.iter().map(|f| f.server_back).collect::<Vec<_>>(),
        figures.iter().map(|f| f.consumer_back).collect::<Vec<_>>(),
        back[back.len() / 2],
        back[back.len() - 1],
    );
    assert_eq!(
        figures.len(),
        RESTART_AT.len(),
        "every restart was survived"
    );
    assert!(report.reconnects > 0, "the consumer reconnected: {report}");
    assert_exactly_once(&[server.url()], MESSAGES);
    report
}

/// After a pooled run: restart the server while the pool's connections sit
/// idle (all of them now dead), then deliver more messages. The pool must
/// hand out only live connections: no delivery fails.
fn assert_pool_discards_dead_connections(label: &str, report: Report) {
    assert_eq!(
        (report.retries, report.reconnects),
        (0, 0),
        "{label}: a delivery after a restart with the pool idle failed, so the pool handed out a dead connection: {report}"
    );
}

/// The extra deliveries after the idle restart (ids not in the main run).
fn after_idle_restart() -> Vec<crate::app::Payment> {
    deliveries(MESSAGES + 10).split_off(deliveries(MESSAGES).len())
}

mod blocking {
    use std::sync::Arc;
    use std::time::Duration;

    use diesel::prelude::*;
    use diesel::r2d2::{ConnectionManager, Pool};

    use super::*;
    use crate::app::AppError;
    use crate::app::blocking::{apply_payment, consume_at};
    use crate::consumer::consume;

    #[test]
    fn a_connection_resumes_after_immediate_restarts() {
        let Some(server) = server() else { return };
        let progress = Arc::new(Progress::default());
        let restarts = restarter(server.clone(), progress.clone());
        let consumer = consume_at(&server.url(), &deliveries(MESSAGES), &progress);
        conclude("PgConnection", &server, consumer, restarts);
    }

    #[test]
    fn an_r2d2_pool_resumes_after_immediate_restarts() {
        let Some(server) = server() else { return };
        // r2d2's defaults, but for a short wait on a server that is down
        // (the consumer backs off and asks again). The defaults include
        // `test_on_check_out(true)`: an idle connection that died is pinged
        // and discarded on checkout; `has_broken` discards a connection
        // whose transaction manager is broken when it is returned.
        let pool = Pool::builder()
            .max_size(2)
            .connection_timeout(Duration::from_secs(2))
            .build(ConnectionManager::<PgConnection>::new(server.url()))
            .expect("a pool");
        let progress = Arc::new(Progress::default());
        let restarts = restarter(server.clone(), progress.clone());
        let consumer = consume(
            &deliveries(MESSAGES),
            &progress,
            || pool.get().map_err(|e| e.to_string()),
            |conn, msg| apply_payment(conn, msg),
            AppError::recovery,
        );
        conclude("r2d2", &server, consumer, restarts);

        server.restart_immediate();
        let after = consume(
            &after_idle_restart(),
            &Progress::default(),
            || pool.get().map_err(|e| e.to_string()),
            |conn, msg| apply_payment(conn, msg),
            AppError::recovery,
        )
        .expect("deliveries after an idle restart");
        assert_pool_discards_dead_connections("r2d2", after);
    }
}

#[cfg(feature = "async")]
mod nonblocking {
    use std::sync::Arc;
    use std::time::Duration;

    use diesel_async::AsyncPgConnection;
    use diesel_async::pooled_connection::{AsyncDieselConnectionManager, bb8, deadpool};
    use std::ops::DerefMut;

    use super::*;
    use crate::app::AppError;
    use crate::app::nonblocking::{apply_payment, consume_at};
    use crate::consumer::consume_async;

    /// A run with restarts on connections from a pool (`get`), then the
    /// deliveries after a restart with the pool idle.
    async fn pool_resumes<C>(
        label: &str,
        server: &Arc<PgServer>,
        mut get: impl AsyncFnMut() -> Result<C, String>,
    ) where
        C: DerefMut<Target = AsyncPgConnection>,
    {
        let progress = Arc::new(Progress::default());
        let restarts = restarter(server.clone(), progress.clone());
        let consumer = consume_async(
            &deliveries(MESSAGES),
            &progress,
            &mut get,
            async |conn: &mut C, msg| apply_payment(conn, msg).await,
            AppError::recovery,
        )
        .await;
        conclude(label, server, consumer, restarts);

        server.restart_immediate();
        let after = consume_async(
            &after_idle_restart(),
            &Progress::default(),
            &mut get,
            async |conn: &mut C, msg| apply_payment(conn, msg).await,
            AppError::recovery,
        )
        .await
        .expect("deliveries after an idle restart");
        assert_pool_discards_dead_connections(label, after);
    }

    #[tokio::test]
    async fn an_async_connection_resumes_after_immediate_restarts() {
        let Some(server) = server() else { return };
        let progress = Arc::new(Progress::default());
        let restarts = restarter(server.clone(), progress.clone());
        let consumer = consume_at(&server.url(), &deliveries(MESSAGES), &progress).await;
        conclude("AsyncPgConnection", &server, consumer, restarts);
    }

    #[tokio::test]
    async fn a_deadpool_pool_resumes_after_immediate_restarts() {
        let Some(server) = server() else { return };
        // deadpool's defaults: a returned connection is recycled after
        // `is_broken` (its transaction manager, its socket) and a ping
        // (`RecyclingMethod::Verified`).
        let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(server.url());
        let pool = deadpool::Pool::builder(manager)
            .max_size(2)
            .build()
            .expect("a pool");
        pool_resumes("deadpool", &server, async || {
            pool.get().await.map_err(|e| e.to_string())
        })
        .await;
    }

    #[tokio::test]
    async fn a_bb8_pool_resumes_after_immediate_restarts() {
        let Some(server) = server() else { return };
        // bb8's defaults (`test_on_check_out(true)`, `has_broken` on
        // return), but for a short wait on a server that is down.
        let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(server.url());
        let pool = bb8::Pool::builder()
            .max_size(2)
            .connection_timeout(Duration::from_secs(2))
            .build(manager)
            .await
            .expect("a pool");
        pool_resumes("bb8", &server, async || {
            pool.get_owned().await.map_err(|e| e.to_string())
        })
        .await;
    }
}
