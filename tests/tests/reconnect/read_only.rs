//! Issue 15, 2c: a server that refuses writes, as a standby or a demoted
//! primary does (`default_transaction_read_only = on`, SQLSTATE 25006
//! `read_only_sql_transaction`). The handler's error must say `Reconnect`:
//! the connection has to go, not the message. And a consumer whose URL
//! names several servers with `target_session_attrs=read-write` reaches the
//! writable one when it reconnects: two throwaway servers swap roles under a
//! running consumer (the writable one turns read-only, and 300 ms later the
//! other one writable, as in a failover), twice per run, and every message
//! takes effect exactly once over the two servers. (The broker delivers each
//! message once here: two independent servers do not share an inbox, as a
//! primary and its standby do, so a redelivery of a message acknowledged on
//! the other server would rightly be processed again.) Each run prints the time
//! from the demotion, and from the promotion, to the consumer's next
//! successful delivery.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use inbox_tests::PgServer;

use crate::app::{Payment, Recovery, assert_exactly_once, payments, prepare};
use crate::consumer::{Progress, Report};

/// Messages per multi-host run.
const MESSAGES: usize = 300;
/// The consumer's successful deliveries at which the writable server changes
/// (well before the end: a switch takes effect some 100 deliveries later
/// on a loaded machine).
const SWITCH_AT: [usize; 2] = [70, 150];
/// How long no server is writable during a switch.
const NO_WRITABLE_SERVER: Duration = Duration::from_millis(300);

fn payment(i: usize) -> Payment {
    payments(i + 1).pop().expect("a payment")
}

/// Two prepared servers, the first writable and the second read-only, and
/// the multi-host URL naming both (first the first).
fn two_servers() -> Option<(Arc<[PgServer; 2]>, String)> {
    let first = PgServer::start()?;
    let second = PgServer::start()?;
    prepare(&first.url());
    prepare(&second.url());
    second.set_read_only(true);
    let url = format!(
        "postgres://postgres@{},{}/postgres?target_session_attrs=read-write",
        first.host_port(),
        second.host_port()
    );
    Some((Arc::new([first, second]), url))
}

/// One switch, measured from the demotion and from the promotion.
struct Figure {
    from_demotion: Duration,
    from_promotion: Duration,
}

/// At each of [`SWITCH_AT`], turns the writable server read-only and,
/// [`NO_WRITABLE_SERVER`] later, the other one writable; then waits for the
/// consumer's next success.
fn switcher(
    servers: Arc<[PgServer; 2]>,
    progress: Arc<Progress>,
) -> JoinHandle<Result<Vec<Figure>, String>> {
    std::thread::spawn(move || {
        let mut figures = Vec::new();
        for (k, threshold) in SWITCH_AT.into_iter().enumerate() {
            progress.wait_for_processed(threshold)?;
            let demoted = Instant::now();
            servers[k % 2].set_read_only(true);
            std::thread::sleep(NO_WRITABLE_SERVER);
            let promoted = Instant::now();
            servers[(k + 1) % 2].set_read_only(false);
            let recovered = progress.wait_for_recovery(demoted)?;
            figures.push(Figure {
                from_demotion: recovered - demoted,
                from_promotion: recovered.saturating_duration_since(promoted),
            });
        }
        Ok(figures)
    })
}

fn conclude(
    label: &str,
    servers: &[PgServer; 2],
    consumer: Result<Report, String>,
    switches: JoinHandle<Result<Vec<Figure>, String>>,
) {
    let figures = switches.join().expect("the switcher panicked");
    let report = consumer.unwrap_or_else(|error| panic!("{label}: the consumer gave up: {error}"));
    let figures = figures.unwrap_or_else(|error| panic!("{label}: {error}"));
    println!(
        "reconnect {label}: {} switches of the writable server; consumer back after {:?} from the demotion, \
         {:?} from the promotion ({NO_WRITABLE_SERVER:?} without a writable server); {report}",
        figures.len(),
        figures.iter().map(|f| f.from_demotion).collect::<Vec<_>>(),
        figures.iter().map(|f| f.from_promotion).collect::<Vec<_>>(),
    );
    assert_eq!(figures.len(), SWITCH_AT.len(), "every switch was survived");
    assert!(
        report
            .errors
            .keys()
            .any(|(what, error)| what == "Reconnect" && error.contains("read-only")),
        "the read-only server's refusal said Reconnect: {report}"
    );
    assert_exactly_once(&[servers[0].url(), servers[1].url()], MESSAGES);
}

mod blocking {
    use diesel::prelude::*;

    use super::*;
    use crate::app::blocking::{apply_payment, consume_at};
    use inbox_runtime::Outcome;

    #[test]
    fn a_read_only_server_says_reconnect() {
        let Some(server) = PgServer::start() else {
            return;
        };
        prepare(&server.url());
        server.set_read_only(true);
        let mut conn = PgConnection::establish(&server.url()).expect("connect");
        for attempt in 1..=2 {
            let refused = apply_payment(&mut conn, &payment(0))
                .expect_err("a read-only server refuses the claim");
            println!(
                "reconnect PgConnection on a read-only server, attempt {attempt}: {refused:?}"
            );
            assert_eq!(refused.recovery(), Recovery::Reconnect, "{refused:?}");
        }

        // A writable server again: a new connection delivers the message.
        server.set_read_only(false);
        let mut conn = PgConnection::establish(&server.url()).expect("reconnect");
        assert_eq!(
            apply_payment(&mut conn, &payment(0)).expect("writable"),
            Outcome::Processed(())
        );
        assert_exactly_once(&[server.url()], 1);
    }

    #[test]
    fn a_multi_host_url_reaches_the_writable_server_with_libpq() {
        let Some((servers, url)) = two_servers() else {
            return;
        };
        let progress = Arc::new(Progress::default());
        let switches = switcher(servers.clone(), progress.clone());
        let consumer = consume_at(&url, &payments(MESSAGES), &progress);
        conclude(
            "PgConnection multi-host (libpq)",
            &servers,
            consumer,
            switches,
        );
    }
}

#[cfg(feature = "async")]
mod nonblocking {
    use diesel_async::{AsyncConnection, AsyncPgConnection};
    use inbox_runtime::Outcome;

    use super::*;
    use crate::app::nonblocking::{apply_payment, consume_at};

    #[tokio::test]
    async fn a_read_only_server_says_reconnect() {
        let Some(server) = PgServer::start() else {
            return;
        };
        prepare(&server.url());
        server.set_read_only(true);
        let mut conn = AsyncPgConnection::establish(&server.url())
            .await
            .expect("connect");
        for attempt in 1..=2 {
            let refused = apply_payment(&mut conn, &payment(0))
                .await
                .expect_err("a read-only server refuses the claim");
            println!(
                "reconnect AsyncPgConnection on a read-only server, attempt {attempt}: {refused:?}"
            );
            assert_eq!(refused.recovery(), Recovery::Reconnect, "{refused:?}");
        }

        server.set_read_only(false);
        let mut conn = AsyncPgConnection::establish(&server.url())
            .await
            .expect("reconnect");
        assert_eq!(
            apply_payment(&mut conn, &payment(0))
                .await
                .expect("writable"),
            Outcome::Processed(())
        );
        assert_exactly_once(&[server.url()], 1);
    }

    /// diesel-async hands the URL to tokio-postgres unchanged
    /// (`tokio_postgres::connect`), whose URL parser takes several
    /// `host:port` pairs and `target_session_attrs=read-write`.
    #[tokio::test]
    async fn a_multi_host_url_reaches_the_writable_server_with_tokio_postgres() {
        let Some((servers, url)) = two_servers() else {
            return;
        };
        let progress = Arc::new(Progress::default());
        let switches = switcher(servers.clone(), progress.clone());
        let consumer = consume_at(&url, &payments(MESSAGES), &progress).await;
        conclude(
            "AsyncPgConnection multi-host (tokio-postgres)",
            &servers,
            consumer,
            switches,
        );
    }
}
