//! An async handler's outgoing message travels with its commit: counted on
//! the wire through the harness proxy, on the real servers. An unkeyed
//! message (of up to 16 KiB) costs no round trip of its own, keeps every
//! byte (also where the session reads backslashes literally), and one the
//! server refuses at the commit fails the delivery as database trouble
//! with nothing of it committed and the session as it was; a larger one
//! is inserted at once, as a statement of its own.

use diesel::result::Error as DieselError;
use diesel_async::{AsyncConnection, SimpleAsyncConnection};
use inbox_runtime::outbox::{self, OutboxMessage, OutgoingMessage, PublishError, Publisher, Relay};
use inbox_runtime::{InboxBackend, InboxError, Recovery, idempotent};
use inbox_tests::{AppError, AsyncSqlRows, ServerBackend};

use crate::handlers::write_effect;
use crate::support::{claims, counted, effects, flights};

/// Text that no quoting short of the server's own could carry: quotes,
/// backslashes, a statement's end, comment marks and characters beyond
/// ASCII.
const AWKWARD: &str = r#"it's a \ "test"; -- $1 $$ /* é ✓ */ \'); DROP TABLE inbox_outbox; --"#;

/// Writes its effect, then records `messages` (none: the same handler
/// without an outgoing message).
#[idempotent(id = id, handler = "async.outgoing")]
async fn announce<C>(conn: &mut C, id: &str, messages: &[OutgoingMessage]) -> Result<(), AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    write_effect(conn, id, 0).await?;
    for message in messages {
        outbox::send_async(conn, message).await?;
    }
    Ok(())
}

/// Publishes every pending message to a publisher that confirms each at
/// once: what it was given, in order.
async fn relayed<C>(conn: &mut C) -> Vec<OutboxMessage>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    let mut taken = Taken::default();
    while !Relay::new()
        .run_once_async(conn, &mut taken)
        .await
        .unwrap()
        .is_idle()
    {}
    taken.0
}

/// Confirms every message it is given, and keeps it.
#[derive(Default)]
struct Taken(Vec<OutboxMessage>);

impl Publisher for Taken {
    async fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        self.0.extend_from_slice(messages);
        messages.iter().map(|_| Ok(())).collect()
    }
}

/// Two deliveries without a message and two with `message` (ids
/// `warm-N` and `warm-message-N`) through `deliver`, so that what a route
/// prepares is prepared before its round trips are counted.
async fn warm_up(
    message: &OutgoingMessage,
    mut deliver: impl AsyncFnMut(&str, &[OutgoingMessage]) -> Result<(), AppError>,
) {
    for round in 0..2 {
        deliver(&format!("warm-{round}"), &[]).await.unwrap();
        deliver(
            &format!("warm-message-{round}"),
            std::slice::from_ref(message),
        )
        .await
        .unwrap();
    }
}

/// Nothing of `handler`'s delivery of `id` committed: no effect, no
/// claim, and no message at all (so no ghost).
async fn assert_nothing_committed(direct: &mut impl AsyncSqlRows, handler: &str, id: &str) {
    assert_eq!(effects(direct, id).await, 0);
    assert_eq!(claims(direct, handler, id).await, 0);
    let messages = direct
        .bigint("SELECT COUNT(*) AS value FROM inbox_outbox")
        .await;
    assert_eq!(messages, 0, "no ghost");
}

/// Whether `relayed` is `sent` as it was recorded.
fn assert_as_sent(relayed: &OutboxMessage, sent: &OutgoingMessage) {
    assert_eq!(relayed.destination, sent.destination());
    assert_eq!(relayed.payload, sent.payload());
    assert_eq!(relayed.headers, sent.headers());
}

/// A processed delivery that records one unkeyed message costs the round
/// trips of the same delivery without it: the message goes in the commit's.
pub async fn an_unkeyed_message_costs_no_round_trip_of_its_own<B: ServerBackend>() {
    let Some(mut counted) = counted::<B>().await else {
        return;
    };
    let message = OutgoingMessage::new("receipts", "p-1 applied").header("x-kind", "receipt");
    let message_sent = message.clone();
    warm_up(&message, async |id: &str, messages: &[OutgoingMessage]| {
        announce(&mut counted.conn, id, messages).await
    })
    .await;
    let (done, without) = flights(&counted.proxy, announce(&mut counted.conn, "plain", &[])).await;
    done.unwrap();
    let (done, with) = flights(
        &counted.proxy,
        announce(
            &mut counted.conn,
            "with-message",
            std::slice::from_ref(&message),
        ),
    )
    .await;
    done.unwrap();
    println!("round trips: without a message {without}, with one {with}");
    assert_eq!(with, without, "the message travels with the commit");
    assert_eq!(effects(&mut counted.direct, "with-message").await, 1);
    assert_eq!(
        claims(&mut counted.direct, "async.outgoing", "with-message").await,
        1
    );
    let relayed = relayed(&mut counted.direct).await;
    assert_eq!(relayed.len(), 3, "the two warm-ups' and this one's");
    for message in &relayed {
        assert_as_sent(message, &message_sent);
    }
}

/// [`announce`] written for `AsyncPgConnection` itself, whose `BEGIN`
/// travels with the claim (the pipelined route).
#[cfg(feature = "postgres")]
#[idempotent(id = id, handler = "async.outgoing_pg")]
async fn announce_pg(
    conn: &mut diesel_async::AsyncPgConnection,
    id: &str,
    messages: &[OutgoingMessage],
) -> Result<(), AppError> {
    write_effect(conn, id, 0).await?;
    for message in messages {
        outbox::send_async(conn, message).await?;
    }
    Ok(())
}

/// The same on the pipelined route of a handler written for
/// `AsyncPgConnection`: the message costs no round trip there either.
#[cfg(feature = "postgres")]
async fn on_the_pipelined_route_too() {
    let Some(mut counted) = counted::<inbox_tests::Postgres>().await else {
        return;
    };
    let message = OutgoingMessage::new("receipts", "p-1 applied");
    warm_up(&message, async |id: &str, messages: &[OutgoingMessage]| {
        announce_pg(&mut counted.conn, id, messages).await
    })
    .await;
    let mut costs = Vec::new();
    for (n, messages) in [&[][..], std::slice::from_ref(&message)].iter().enumerate() {
        let (done, flown) = flights(
            &counted.proxy,
            announce_pg(&mut counted.conn, &format!("counted-{n}"), messages),
        )
        .await;
        done.unwrap();
        costs.push(flown);
    }
    println!(
        "round trips: without a message {}, with one {}",
        costs[0], costs[1]
    );
    assert_eq!(costs[1], costs[0], "the message travels with the commit");
    assert_eq!(relayed(&mut counted.direct).await.len(), 3);
}

/// Every byte value, quotes and backslashes in the destination, a header
/// and the payload are stored as sent, under the default `sql_mode` and
/// (on MySQL/MariaDB) one that reads backslashes literally and quotes
/// names with `"`: the message's text is hex, which neither changes.
pub async fn a_message_in_the_commits_text_keeps_every_byte<B: ServerBackend>() {
    let Some(mut counted) = counted::<B>().await else {
        return;
    };
    let modes: &[&str] = if B::NAME == "mysql" {
        &["", "NO_BACKSLASH_ESCAPES,ANSI_QUOTES"]
    } else {
        &[""]
    };
    let mut payload: Vec<u8> = (0..=255_u8).collect();
    payload.extend_from_slice(AWKWARD.as_bytes());
    let message = OutgoingMessage::new(AWKWARD, payload).header("x-awkward", AWKWARD);
    for (n, mode) in modes.iter().enumerate() {
        if B::NAME == "mysql" {
            counted
                .conn
                .batch_execute(&format!("SET SESSION sql_mode = '{mode}'"))
                .await
                .unwrap();
        }
        announce(
            &mut counted.conn,
            &format!("awkward-{n}"),
            std::slice::from_ref(&message),
        )
        .await
        .unwrap();
    }
    let relayed = relayed(&mut counted.direct).await;
    assert_eq!(relayed.len(), modes.len());
    for stored in &relayed {
        assert_as_sent(stored, &message);
    }
}

/// A message larger than the commit carries (16 KiB) is inserted at once,
/// its bytes bound: one round trip more, and stored as sent.
pub async fn a_message_larger_than_the_commit_carries_is_inserted_at_once<B: ServerBackend>() {
    let Some(mut counted) = counted::<B>().await else {
        return;
    };
    let small = OutgoingMessage::new("receipts", vec![b'\\'; 16 * 1024 - 64]);
    let large = OutgoingMessage::new("receipts", vec![b'\''; 16 * 1024 + 1]);
    for round in 0..2 {
        announce(
            &mut counted.conn,
            &format!("warm-{round}"),
            &[small.clone(), large.clone()],
        )
        .await
        .unwrap();
    }
    let (done, with_small) = flights(
        &counted.proxy,
        announce(&mut counted.conn, "small", std::slice::from_ref(&small)),
    )
    .await;
    done.unwrap();
    let (done, with_large) = flights(
        &counted.proxy,
        announce(&mut counted.conn, "large", std::slice::from_ref(&large)),
    )
    .await;
    done.unwrap();
    assert_eq!(with_large, with_small + 1, "the large one's insert");
    let relayed = relayed(&mut counted.direct).await;
    assert_eq!(relayed.len(), 6);
    assert_as_sent(&relayed[4], &small);
    assert_as_sent(&relayed[5], &large);
}

/// A delivery that records more than the commit carries (600 messages of
/// almost 16 KiB each: 19 MiB as hex, beyond MariaDB's default 16 MiB a
/// packet): the first MiB of them go with the commit, the rest at once,
/// and every one is stored as sent.
pub async fn many_messages_go_partly_with_the_commit_and_the_rest_at_once<B: ServerBackend>() {
    let Some(mut counted) = counted::<B>().await else {
        return;
    };
    let messages: Vec<OutgoingMessage> = (0..600_u32)
        .map(|n| {
            let mut payload = n.to_be_bytes().to_vec();
            payload.resize(16 * 1024 - 64, b'\\');
            OutgoingMessage::new("receipts", payload)
        })
        .collect();
    let (done, flown) = flights(
        &counted.proxy,
        announce(&mut counted.conn, "many", &messages),
    )
    .await;
    done.unwrap();
    println!("round trips of 600 messages: {flown}");
    assert!(flown > 500, "most go at once, a round trip each: {flown}");
    let mut relayed = relayed(&mut counted.direct).await;
    relayed.sort_by_key(|message| message.payload[..4].to_vec());
    assert_eq!(relayed.len(), messages.len());
    for (stored, sent) in relayed.iter().zip(&messages) {
        assert_as_sent(stored, sent);
    }
}

/// The server refuses the message's insert (a trigger) in the commit's
/// text: the delivery fails with the database's own error, to retry;
/// neither the claim, nor the effect, nor the message commits; the
/// session is as it was (no transaction open, `autocommit` on); and the
/// redelivery, once the server takes the message, is processed once.
pub async fn a_message_refused_at_the_commit_commits_nothing<B: ServerBackend>() {
    let Some(mut counted) = counted::<B>().await else {
        return;
    };
    let trigger = if B::NAME == "mysql" {
        "CREATE TRIGGER refuse_outbox BEFORE INSERT ON inbox_outbox FOR EACH ROW \
         BEGIN IF NEW.destination = 'refused' THEN \
         SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the outbox refuses it'; END IF; END"
    } else {
        "CREATE FUNCTION refuse_outbox() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN IF NEW.destination = 'refused' THEN \
         RAISE EXCEPTION 'the outbox refuses it'; END IF; RETURN NEW; END $$; \
         CREATE TRIGGER refuse_outbox BEFORE INSERT ON inbox_outbox FOR EACH ROW \
         EXECUTE FUNCTION refuse_outbox();"
    };
    counted.direct.batch_execute(trigger).await.unwrap();
    let refused = OutgoingMessage::new("refused", "x");
    announce(&mut counted.conn, "warm", &[]).await.unwrap();
    let (error, flown) = flights(
        &counted.proxy,
        announce(&mut counted.conn, "m-1", std::slice::from_ref(&refused)),
    )
    .await;
    let error = error.unwrap_err();
    let (AppError::Db(cause) | AppError::Inbox(InboxError::Database(cause))) = &error else {
        panic!("{error:?}")
    };
    assert!(matches!(cause, DieselError::DatabaseError(..)), "{cause:?}");
    assert!(
        cause.to_string().contains("the outbox refuses it"),
        "{cause}"
    );
    assert_eq!(inbox_runtime::recovery(cause), Recovery::Retry, "{cause:?}");
    println!("round trips of the refused delivery: {flown}");
    assert_nothing_committed(&mut counted.direct, "async.outgoing", "m-1").await;
    assert_no_transaction::<B>(&mut counted.conn).await;
    // The same connection carries on, and the redelivery is processed.
    let accepted = OutgoingMessage::new("receipts", "x");
    announce(&mut counted.conn, "m-1", std::slice::from_ref(&accepted))
        .await
        .unwrap();
    assert_eq!(effects(&mut counted.direct, "m-1").await, 1);
    assert_eq!(
        claims(&mut counted.direct, "async.outgoing", "m-1").await,
        1
    );
}

/// Writes its effect, then has the server roll its transaction back under
/// it (what InnoDB does to a deadlock's victim, whose error the body then
/// ignores), writes again and records a message.
#[idempotent(id = id, handler = "async.outgoing_rolled_back")]
async fn rolled_back_under_it<C>(conn: &mut C, id: &str) -> Result<(), AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    write_effect(conn, id, 0).await?;
    conn.batch_execute("ROLLBACK").await?;
    write_effect(conn, id, 1).await?;
    outbox::send_async(conn, &OutgoingMessage::new("receipts", "a ghost")).await?;
    Ok(())
}

/// MySQL/MariaDB: a transaction the server rolled back under the body
/// takes the message the body recorded after it: the commit's text, which
/// carries the message, finds the deadlock guard's savepoint gone and
/// fails, and the runner rolls back what the body wrote since (`autocommit`
/// stayed off). Nothing commits: no claim, no effect, no message.
pub async fn a_transaction_rolled_back_under_the_body_takes_its_message<B: ServerBackend>() {
    let Some(mut counted) = counted::<B>().await else {
        return;
    };
    let error = rolled_back_under_it(&mut counted.conn, "m-1")
        .await
        .expect_err("the transaction was lost");
    println!("{error:?}");
    assert_nothing_committed(&mut counted.direct, "async.outgoing_rolled_back", "m-1").await;
    assert_no_transaction::<B>(&mut counted.conn).await;
}

/// Records a message, then panics.
#[idempotent(id = id, handler = "async.outgoing_panics")]
async fn panics_after_recording<C>(conn: &mut C, id: &str) -> Result<(), AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    write_effect(conn, id, 0).await?;
    outbox::send_async(conn, &OutgoingMessage::new("receipts", "never sent")).await?;
    tokio::task::yield_now().await;
    panic!("after recording its message");
}

/// A body that panics after recording a message: the panic goes on to
/// the caller, nothing of the delivery commits, and what the body left
/// for the commit is gone with it: the next delivery on the connection
/// sends its own message only.
pub async fn a_panicking_body_takes_its_collected_message_with_it<B: ServerBackend>() {
    use futures_util::FutureExt;

    let Some(mut counted) = counted::<B>().await else {
        return;
    };
    let panicked = std::panic::AssertUnwindSafe(panics_after_recording(&mut counted.conn, "m-1"))
        .catch_unwind()
        .await;
    assert!(panicked.is_err(), "the body's panic reaches the caller");
    assert_nothing_committed(&mut counted.direct, "async.outgoing_panics", "m-1").await;
    assert_no_transaction::<B>(&mut counted.conn).await;
    let next = OutgoingMessage::new("receipts", "the next delivery's");
    announce(&mut counted.conn, "m-2", std::slice::from_ref(&next))
        .await
        .unwrap();
    let relayed = relayed(&mut counted.direct).await;
    assert_eq!(relayed.len(), 1, "{relayed:?}");
    assert_as_sent(&relayed[0], &next);
}

/// No transaction is open on `conn` (and on MySQL/MariaDB `autocommit` is
/// on again), as the server sees it.
async fn assert_no_transaction<B: ServerBackend>(conn: &mut B::AsyncConnection) {
    if B::NAME == "mysql" {
        let state = conn
            .bigint("SELECT @@in_transaction * 10 + @@autocommit AS value")
            .await;
        assert_eq!(state, 1, "no transaction (tens), autocommit (units)");
    } else {
        // PostgreSQL takes a savepoint only inside a transaction block.
        let refused = conn
            .batch_execute("SAVEPOINT outgoing_probe")
            .await
            .expect_err("no transaction block to take a savepoint in");
        assert!(
            refused.to_string().contains("transaction blocks"),
            "{refused}"
        );
    }
}

inbox_tests::backend_tests!(async only [postgres, mysql]:
    an_unkeyed_message_costs_no_round_trip_of_its_own,
    a_message_in_the_commits_text_keeps_every_byte,
    a_message_larger_than_the_commit_carries_is_inserted_at_once,
    a_message_refused_at_the_commit_commits_nothing,
    a_panicking_body_takes_its_collected_message_with_it,
    many_messages_go_partly_with_the_commit_and_the_rest_at_once;
    async only [mysql]:
    a_transaction_rolled_back_under_the_body_takes_its_message;
);

#[cfg(feature = "postgres")]
mod pipelined {
    #[test]
    fn on_the_pipelined_route_too() {
        inbox_tests::runtime::current_thread().block_on(super::on_the_pipelined_route_too());
    }
}
