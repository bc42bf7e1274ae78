//! The outbox on diesel-async connections: recorded in an async
//! transaction (an async handler's), relayed by `run_once_async`.

use std::future::pending;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use diesel_async::AsyncConnection;
use inbox_runtime::outbox::{self, OutboxMessage, OutgoingMessage, PublishError, Publisher, Relay};
use inbox_runtime::{InboxError, idempotent};
use inbox_tests::{AppError, AsyncSqlRows, TestBackend};

use crate::support::*;

inbox_tests::backend_tests!(
    async recorded_in_an_async_handler_once_and_relayed_in_key_order,
    refused_outside_an_async_transaction,
    an_async_handlers_unkeyed_message_is_written_with_its_commit_as_sent,
    a_dropped_async_round_gives_its_messages_back,
    an_async_handlers_messages_continue_its_deliverys_trace,
);

/// Relays every pending message with a default relay to a broker of its
/// own: the broker, and how many rounds published something.
async fn drain_async<C>(conn: &mut C) -> (Broker, usize)
where
    C: AsyncConnection,
    C::Backend: inbox_runtime::InboxBackend,
{
    let relay = Relay::new();
    let mut broker = Broker::default();
    let mut rounds = 0;
    while !relay
        .run_once_async(conn, &mut broker)
        .await
        .unwrap()
        .is_idle()
    {
        rounds += 1;
    }
    (broker, rounds)
}

#[idempotent(id = id, handler = "outbox.announce_async")]
async fn announce<C>(conn: &mut C, id: &str, fail: bool) -> Result<(), AppError>
where
    C: AsyncConnection,
    C::Backend: inbox_runtime::InboxBackend,
{
    let message = OutgoingMessage::new("receipts", id.to_owned()).ordering_key("account");
    outbox::send_async(conn, &message).await?;
    if fail {
        return Err(AppError::Failed("after recording its message"));
    }
    Ok(())
}

pub async fn recorded_in_an_async_handler_once_and_relayed_in_key_order<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect_async().await;
    announce(&mut conn, "m-1", false).await.unwrap();
    announce(&mut conn, "m-1", false).await.unwrap();
    assert!(announce(&mut conn, "m-2", true).await.is_err());
    announce(&mut conn, "m-2", false).await.unwrap();
    announce(&mut conn, "m-3", false).await.unwrap();
    assert_eq!(
        conn.bigint("SELECT COUNT(*) AS value FROM inbox_outbox")
            .await,
        3
    );
    let (broker, rounds) = drain_async(&mut conn).await;
    assert_eq!(rounds, 3, "one message of the key per round");
    assert_eq!(broker.payloads(), ["m-1", "m-2", "m-3"]);
    assert_eq!(
        conn.bigint("SELECT COUNT(*) AS value FROM inbox_outbox")
            .await,
        0,
        "confirmed messages are deleted"
    );
}

pub async fn refused_outside_an_async_transaction<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect_async().await;
    let error = outbox::send_async(&mut conn, &OutgoingMessage::new("q", "x"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, InboxError::OutsideTransaction { .. }),
        "{error:?}"
    );
    let inside: Result<(), InboxError> = conn
        .transaction(async |conn| {
            outbox::send_async(conn, &OutgoingMessage::new("q", "y")).await?;
            let mut broker = Broker::default();
            let refused = Relay::new().run_once_async(conn, &mut broker).await;
            assert!(matches!(refused, Err(InboxError::InsideTransaction { .. })));
            Ok(())
        })
        .await;
    inside.unwrap();
    assert_eq!(
        conn.bigint("SELECT COUNT(*) AS value FROM inbox_outbox")
            .await,
        1
    );
}

/// Text and bytes a message written into the commit's SQL text must keep.
const AWKWARD: &str = r#"it's a \ "test"; -- $1 $$ é"#;

#[idempotent(id = id, handler = "outbox.unkeyed_async")]
async fn unkeyed<C>(conn: &mut C, id: &str, fail: bool) -> Result<(), AppError>
where
    C: AsyncConnection,
    C::Backend: inbox_runtime::InboxBackend,
{
    let payload: Vec<u8> = (0..=255_u8).collect();
    let message = OutgoingMessage::new(AWKWARD, payload).header("x-awkward", AWKWARD);
    outbox::send_async(conn, &message).await?;
    // A later poll of the body: the message is still the delivery's.
    tokio::task::yield_now().await;
    outbox::send_async(conn, &OutgoingMessage::new("receipts", id.to_owned())).await?;
    if fail {
        return Err(AppError::Failed("after recording its messages"));
    }
    Ok(())
}

pub async fn an_async_handlers_unkeyed_message_is_written_with_its_commit_as_sent<
    B: TestBackend,
>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect_async().await;
    assert!(unkeyed(&mut conn, "m-1", true).await.is_err());
    assert_eq!(
        conn.bigint("SELECT COUNT(*) AS value FROM inbox_outbox")
            .await,
        0,
        "the failed attempt wrote nothing"
    );
    unkeyed(&mut conn, "m-1", false).await.unwrap();
    unkeyed(&mut conn, "m-1", false).await.unwrap();
    let (broker, _) = drain_async(&mut conn).await;
    let confirmed = broker.confirmed.lock().unwrap().clone();
    assert_eq!(confirmed.len(), 2, "once, the duplicate wrote nothing");
    let awkward = confirmed
        .iter()
        .find(|message| message.destination == AWKWARD)
        .expect("the awkward message");
    assert_eq!(awkward.payload, (0..=255_u8).collect::<Vec<u8>>());
    assert_eq!(
        awkward.headers,
        [("x-awkward".to_owned(), AWKWARD.to_owned())]
    );
}

/// Takes messages and never answers: a round waiting on it is dropped by
/// its caller (a timeout, a shutdown).
struct NeverAnswers(Arc<AtomicUsize>);

impl Publisher for NeverAnswers {
    fn publish(
        &mut self,
        messages: &[OutboxMessage],
    ) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send {
        self.0.fetch_add(messages.len(), Ordering::SeqCst);
        pending()
    }
}

pub async fn a_dropped_async_round_gives_its_messages_back<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect_async().await;
    let sent: Result<_, InboxError> = conn
        .transaction(async |conn| {
            outbox::send_async(conn, &OutgoingMessage::new("receipts", "m1")).await
        })
        .await;
    let id = sent.unwrap();
    let relay = Relay::new().lease(Duration::from_secs(1));
    let started = Arc::new(AtomicUsize::new(0));
    let mut abandoned = db.connect_async().await;
    let mut never = NeverAnswers(Arc::clone(&started));
    let round = relay.run_once_async(&mut abandoned, &mut never);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), round)
            .await
            .is_err(),
        "the round waits for the broker"
    );
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "dropped while publishing m1"
    );

    let mut broker = Broker::default();
    assert!(
        relay
            .run_once_async(&mut conn, &mut broker)
            .await
            .unwrap()
            .is_idle(),
        "m1 is still held by the dropped round"
    );
    if rounds_hold_locks::<B>() {
        // Dropped inside its transaction: the connection is broken, not
        // reused inside the abandoned transaction; closing it gives m1 back.
        let error = relay
            .run_once_async(&mut abandoned, &mut broker)
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                InboxError::Database(diesel::result::Error::BrokenTransactionManager)
            ),
            "{error:?}"
        );
        drop(abandoned);
    } else {
        // The lease was committed before publishing: the connection is fine,
        // and m1 comes back when the lease runs out.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        drop(abandoned);
    }
    let mut published = Vec::new();
    for _ in 0..50 {
        relay.run_once_async(&mut conn, &mut broker).await.unwrap();
        published = broker.payloads();
        if !published.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(published, ["m1"]);
    assert_eq!(broker.confirmed.lock().unwrap()[0].id, id);
}

#[idempotent(id = id, handler = "outbox.traced_async", trace = traceparent)]
async fn traced<C>(conn: &mut C, id: &str, traceparent: Option<String>) -> Result<(), AppError>
where
    C: AsyncConnection,
    C::Backend: inbox_runtime::InboxBackend,
{
    outbox::send_async(
        conn,
        &OutgoingMessage::new("receipts", format!("{id} plain")),
    )
    .await?;
    // A yield between the two: the trace is the body's at every poll.
    tokio::task::yield_now().await;
    outbox::send_async(
        conn,
        &OutgoingMessage::new("receipts", format!("{id} later")),
    )
    .await?;
    Ok(())
}

/// `#[idempotent(trace = …)]` on an async handler: every message its body
/// sends, before and after an await, continues the incoming trace; a
/// delivery without the header continues none.
pub async fn an_async_handlers_messages_continue_its_deliverys_trace<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect_async().await;
    traced(&mut conn, "t-1", Some(INCOMING_TRACE.to_owned()))
        .await
        .unwrap();
    traced(&mut conn, "t-2", None).await.unwrap();
    let (broker, _) = drain_async(&mut conn).await;
    let traceparents = traceparents(&broker);
    assert!(
        continues_incoming(&traceparents["t-1 plain"]),
        "{traceparents:?}"
    );
    assert!(
        continues_incoming(&traceparents["t-1 later"]),
        "{traceparents:?}"
    );
    assert_ne!(
        traceparents["t-1 plain"], traceparents["t-1 later"],
        "a span per message"
    );
    assert!(traceparents["t-2 plain"].is_empty(), "{traceparents:?}");
}
