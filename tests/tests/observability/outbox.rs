//! A relay's rounds: each confirmed message counted and its publish delay
//! sampled by destination, each refusal counted (and reported) with
//! whether it made the message dead, each message given back while the
//! broker is unavailable counted; nothing for an idle round.

use std::time::Duration;

use diesel::Connection;
use inbox_runtime::outbox::{
    self, BlockingPublisher, OutboxMessage, OutgoingMessage, PublishError, Relay,
};
use inbox_runtime::{Backoff, InboxError};
use inbox_tests::TestBackend;
use tracing::Level;

use crate::capture::*;

inbox_tests::backend_tests!(only [sqlite, postgres]:
    relay_rounds_are_counted_by_destination,
);

/// Confirms what goes to `receipts`, refuses `nowhere`, and is unavailable
/// for everything once `down`.
struct Broker {
    down: bool,
}

impl BlockingPublisher for Broker {
    fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        messages
            .iter()
            .map(|message| match message.destination.as_str() {
                _ if self.down => Err(PublishError::unavailable("connection refused")),
                "nowhere" => Err(PublishError::refused("NO_ROUTE")),
                _ => Ok(()),
            })
            .collect()
    }
}

pub fn relay_rounds_are_counted_by_destination<B: TestBackend>() {
    let Some(db) = B::open() else {
        return;
    };
    let mut conn = db.connect();
    conn.transaction(|conn| {
        for message in [
            OutgoingMessage::new("receipts", "r-1"),
            OutgoingMessage::new("receipts", "r-2"),
            OutgoingMessage::new("nowhere", "lost?"),
        ] {
            outbox::send(conn, &message)?;
        }
        Ok::<_, InboxError>(())
    })
    .unwrap();
    let relay = Relay::new().max_attempts(2).backoff(Backoff {
        first: Duration::from_millis(1),
        max: Duration::from_millis(1),
    });
    let mut broker = Broker { down: false };

    let (report, seen, metrics) = observed(|| relay.run_once(&mut conn, &mut broker));
    assert_eq!(report.unwrap().published, 2);
    let delay = key(
        "inbox_outbox_publish_delay_seconds",
        &[("destination", "receipts")],
    );
    assert_metrics(
        &metrics,
        &[
            (
                key(
                    "inbox_outbox_published_total",
                    &[("destination", "receipts")],
                ),
                2,
            ),
            (
                key(
                    "inbox_outbox_refused_total",
                    &[("destination", "nowhere"), ("dead", "false")],
                ),
                1,
            ),
        ],
        &[(delay.clone(), 2)],
    );
    assert!(
        metrics
            .samples(&delay)
            .iter()
            .all(|s| (0.0..60.0).contains(s)),
        "{:?}",
        metrics.samples(&delay)
    );
    let refused = seen.events_named("inbox.outbox_refused");
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].level, Level::INFO);
    assert_eq!(
        refused[0].fields["messaging.destination.name"],
        s("nowhere")
    );
    assert_eq!(refused[0].fields["error"], s("NO_ROUTE"));

    std::thread::sleep(Duration::from_millis(20));
    let (_, seen, metrics) = observed(|| relay.run_once(&mut conn, &mut broker).unwrap());
    assert_metrics(
        &metrics,
        &[(
            key(
                "inbox_outbox_refused_total",
                &[("destination", "nowhere"), ("dead", "true")],
            ),
            1,
        )],
        &[],
    );
    let dead = seen.events_named("inbox.outbox_dead");
    assert_eq!((dead.len(), dead[0].level), (1, Level::WARN));

    conn.transaction(|conn| outbox::send(conn, &OutgoingMessage::new("receipts", "r-3")))
        .unwrap();
    broker.down = true;
    let (_, seen, metrics) = observed(|| relay.run_once(&mut conn, &mut broker).unwrap());
    assert_metrics(
        &metrics,
        &[(key("inbox_outbox_unavailable_total", &[]), 1)],
        &[],
    );
    assert!(seen.events_named("inbox.outbox_refused").is_empty());

    broker.down = false;
    let (_, _, metrics) = observed(|| relay.run_once(&mut conn, &mut broker).unwrap());
    let (idle, _, nothing) = observed(|| relay.run_once(&mut conn, &mut broker).unwrap());
    assert_eq!(metrics.counters().len(), 1, "r-3 published");
    assert!(idle.is_idle());
    assert_metrics(&nothing, &[], &[]);
}
