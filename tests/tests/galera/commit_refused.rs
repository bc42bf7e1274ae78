//! A COMMIT refused because another node committed the same id first.
//!
//! Delivery A claims the id on node 0 and its body runs; while A's
//! transaction is still open, delivery B of the same id runs on node 1:
//! node 1 sees no claim (A's is local to node 0 until it commits), so B
//! claims too, its body runs, and it commits first. A's COMMIT is then
//! refused (certification failure, or a brute-force abort of A when node 0
//! applies B), and the error arrives as `DatabaseErrorKind::Unknown` with
//! InnoDB's "Deadlock found…" text: the COMMIT is a plain statement, whose
//! error number Diesel does not keep. Both bodies ran; one effect is
//! committed; A's redelivery is a duplicate.

use std::sync::Barrier;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;

use diesel::result::Error;
use inbox_runtime::{Outcome, Recovery, is_lock_conflict, recovery};
use inbox_tests::GaleraCluster;

use crate::support::{Delivery, apply, assert_exactly_once, connect, report};

/// What a refused COMMIT must look like to a consumer: a lock conflict,
/// to be retried on the same connection.
fn assert_retry(flavour: &str, error: &Error) {
    report!("{flavour}: a COMMIT refused by certification arrives as {error:?}");
    assert!(
        is_lock_conflict(error),
        "{flavour}: is_lock_conflict() must recognise a refused COMMIT: {error:?}"
    );
    assert_eq!(
        recovery(error),
        Recovery::Retry,
        "{flavour}: recovery() of a refused COMMIT: {error:?}"
    );
}

pub fn blocking(cluster: &GaleraCluster) {
    let bodies = AtomicU32::new(0);
    // The held delivery's body waits twice: once to say it ran, once for
    // the rival's commit.
    let barrier = Barrier::new(2);
    let pause = || {
        barrier.wait();
        barrier.wait();
    };
    let id = "refused-blocking-0";
    let (held, rival) = thread::scope(|scope| {
        let held = scope.spawn(|| {
            let mut conn = connect(cluster, 0);
            let mut delivery = Delivery::new(id, 0, &bodies);
            delivery.pause = Some(&pause);
            apply(&mut conn, &delivery)
        });
        barrier.wait();
        let mut conn = connect(cluster, 1);
        let rival = apply(&mut conn, &Delivery::new(id, 1, &bodies));
        barrier.wait();
        (held.join().expect("the held delivery"), rival)
    });
    assert_eq!(rival.expect("the rival commits"), Outcome::Processed(()));
    let error = held.expect_err("the held delivery's COMMIT is refused");
    assert_retry("blocking", &error);
    assert_eq!(bodies.load(Ordering::SeqCst), 2, "both bodies ran");
    // The consumer retries as told, on the same node.
    let mut conn = connect(cluster, 0);
    let again = apply(&mut conn, &Delivery::new(id, 0, &bodies));
    assert_eq!(again.expect("redelivery"), Outcome::Duplicate);
    assert_eq!(
        bodies.load(Ordering::SeqCst),
        2,
        "the redelivery's body did not run"
    );
    let processed = [AtomicU32::new(1)];
    assert_exactly_once(cluster, "refused-blocking", 1, &processed, false);
}

#[cfg(feature = "async")]
pub use self::asynchronous::asynchronous;

#[cfg(feature = "async")]
mod asynchronous {
    use std::sync::atomic::{AtomicU32, Ordering};

    use diesel::sql_types::{Integer, Text};
    use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl};
    use inbox_runtime::{Outcome, idempotent};
    use inbox_tests::GaleraCluster;
    use tokio::sync::Notify;

    use crate::support::{assert_exactly_once, report};

    pub struct AsyncDelivery<'a> {
        pub id: &'a str,
        pub node: usize,
        pub bodies: &'a AtomicU32,
        /// Said after the body wrote its effect; then the body waits for the second.
        pub pause: Option<(&'a Notify, &'a Notify)>,
    }

    #[idempotent(id = msg.id, handler = "galera.apply", shared_scope)]
    async fn apply_async(
        conn: &mut AsyncMysqlConnection,
        msg: &AsyncDelivery<'_>,
    ) -> Result<Outcome<()>, diesel::result::Error> {
        msg.bodies.fetch_add(1, Ordering::SeqCst);
        diesel::sql_query("INSERT INTO effects (message_id, node) VALUES (?, ?)")
            .bind::<Text, _>(msg.id)
            .bind::<Integer, _>(msg.node as i32)
            .execute(conn)
            .await?;
        if let Some((ran, go)) = msg.pause {
            ran.notify_one();
            go.notified().await;
        }
        Ok(Outcome::Processed(()))
    }

    pub fn asynchronous(cluster: &GaleraCluster) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let bodies = AtomicU32::new(0);
        let (ran, go) = (Notify::new(), Notify::new());
        let id = "refused-async-0";
        runtime.block_on(async {
            let mut held_conn = AsyncMysqlConnection::establish(&cluster.url(0))
                .await
                .expect("connect to node 0");
            let mut rival_conn = AsyncMysqlConnection::establish(&cluster.url(1))
                .await
                .expect("connect to node 1");
            let held_delivery = AsyncDelivery {
                id,
                node: 0,
                bodies: &bodies,
                pause: Some((&ran, &go)),
            };
            let rival_delivery = AsyncDelivery {
                id,
                node: 1,
                bodies: &bodies,
                pause: None,
            };
            let held = apply_async(&mut held_conn, &held_delivery);
            let rival = async {
                ran.notified().await;
                let rival = apply_async(&mut rival_conn, &rival_delivery).await;
                go.notify_one();
                rival
            };
            let (held, rival) = tokio::join!(held, rival);
            assert_eq!(rival.expect("the rival commits"), Outcome::Processed(()));
            let error = held.expect_err("the held delivery's COMMIT is refused");
            super::assert_retry("async", &error);
            assert_eq!(
                AtomicU32::load(&bodies, Ordering::SeqCst),
                2,
                "both bodies ran"
            );
            let again = AsyncDelivery {
                id,
                node: 0,
                bodies: &bodies,
                pause: None,
            };
            let again = apply_async(&mut held_conn, &again).await;
            assert_eq!(again.expect("redelivery"), Outcome::Duplicate);
            assert_eq!(AtomicU32::load(&bodies, Ordering::SeqCst), 2);
        });
        report!("async: both bodies ran, one effect, the redelivery was a duplicate");
        let processed = [AtomicU32::new(1)];
        assert_exactly_once(cluster, "refused-async", 1, &processed, false);
    }
}
