//! A handler's outgoing message is written with its commit (on PostgreSQL,
//! by a statement sent in the `COMMIT`'s round trip): stored exactly as
//! sent, gone with a failed or panicking body, gone with a savepoint of the
//! body's that rolls back while the handler's own message stays, and a
//! message that cannot be written fails the commit without committing
//! anything. The same behaviour on every backend, blocking and async.

use std::panic::{AssertUnwindSafe, catch_unwind};

use diesel::connection::LoadConnection;
use diesel::connection::SimpleConnection;
use diesel::r2d2::R2D2Connection;
use inbox_runtime::outbox::{self, OutboxId, OutgoingMessage, Relay};
use inbox_runtime::{InboxBackend, InboxError, Outcome, Recovery, idempotent};
use inbox_tests::{AppError, SqlRows, TestBackend};

use crate::support::*;

inbox_tests::backend_tests! {
    a_handlers_message_is_stored_exactly_as_sent,
    a_failed_or_panicking_body_leaves_no_message,
    a_savepoint_that_rolls_back_takes_its_message_and_leaves_the_handlers,
    keyed_and_unkeyed_messages_of_one_handler_are_all_written;
    only [postgres]: a_message_that_cannot_be_written_fails_the_commit_and_commits_nothing;
}

/// Text a literal in SQL must survive: quotes, backslashes, a dollar sign,
/// a semicolon and comment marks, and characters outside ASCII.
const AWKWARD: &str = r#"it's a \ "test"; -- $1 $$ /* é ✓ */ E'\x00'"#;

/// Every byte value, twice.
fn every_byte() -> Vec<u8> {
    (0..=255_u8).chain(0..=255_u8).collect()
}

/// What a test's handler does after recording its messages.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum End {
    Commit,
    Fail,
    Panic,
}

#[idempotent(id = id, handler = "outbox.with_commit")]
fn handle<C>(
    conn: &mut C,
    id: &str,
    messages: &[OutgoingMessage],
    end: End,
) -> Result<Outcome<Vec<OutboxId>>, AppError>
where
    C: LoadConnection + R2D2Connection,
    C::Backend: InboxBackend,
{
    let mut ids = Vec::new();
    for message in messages {
        ids.push(outbox::send(conn, message)?);
    }
    match end {
        End::Commit => Ok(Outcome::Processed(ids)),
        End::Fail => Err(AppError::Failed("after recording its messages")),
        End::Panic => panic!("after recording its messages"),
    }
}

/// Publishes everything pending: what the broker got, in order.
fn relay_all<C>(conn: &mut C) -> Vec<outbox::OutboxMessage>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    let relay = Relay::new();
    let mut broker = Broker::default();
    while !relay.run_once(conn, &mut broker).unwrap().is_idle() {}
    broker.confirmed.lock().unwrap().clone()
}

pub fn a_handlers_message_is_stored_exactly_as_sent<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let messages = [
        OutgoingMessage::new(AWKWARD, every_byte())
            .header("x-awkward", AWKWARD)
            .header("traceparent", "00-aa-bb-01"),
        OutgoingMessage::new("receipts", Vec::new()),
        OutgoingMessage::new("receipts", vec![b'\\'; 20_000]),
    ];
    let ids = handle(&mut conn, "m-1", &messages, End::Commit)
        .unwrap()
        .processed()
        .unwrap();
    assert!(ids[0] < ids[1] && ids[1] < ids[2], "{ids:?}");
    let published = relay_all(&mut conn);
    assert_eq!(published.len(), 3);
    let mut published_ids: Vec<String> = published.iter().map(|m| m.id.to_string()).collect();
    published_ids.sort();
    let sent_ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
    assert_eq!(published_ids, sent_ids);
    for (id, message) in ids.iter().zip(&messages) {
        let stored = published
            .iter()
            .find(|published| published.id == *id)
            .unwrap();
        assert_eq!(stored.destination, message.destination());
        assert_eq!(stored.payload, message.payload());
        assert_eq!(stored.headers, message.headers());
    }
    // A duplicate records nothing.
    assert!(
        handle(&mut conn, "m-1", &messages, End::Commit)
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(
        rows(&mut conn),
        0,
        "relayed (and deleted), none recorded again"
    );
}

pub fn a_failed_or_panicking_body_leaves_no_message<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let messages = [OutgoingMessage::new("receipts", "ghost")];
    assert!(handle(&mut conn, "m-1", &messages, End::Fail).is_err());
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        handle(&mut conn, "m-1", &messages, End::Panic)
    }));
    assert!(panicked.is_err());
    assert_eq!(rows(&mut conn), 0, "no message for a body that failed");
    assert_eq!(
        conn.bigint("SELECT COUNT(*) AS value FROM inbox_messages"),
        0,
        "no claim either: the redelivery runs"
    );
    let outcome = handle(&mut conn, "m-1", &messages, End::Commit).unwrap();
    assert_eq!(outcome.processed().map(|ids| ids.len()), Some(1));
    assert_eq!(rows(&mut conn), 1);
}

#[idempotent(id = id, handler = "outbox.with_savepoint")]
fn with_savepoint<C>(conn: &mut C, id: &str) -> Result<(), AppError>
where
    C: LoadConnection + R2D2Connection,
    C::Backend: InboxBackend,
{
    outbox::send(conn, &OutgoingMessage::new("receipts", "before"))?;
    let inner: Result<(), InboxError> = conn.transaction(|conn| {
        outbox::send(conn, &OutgoingMessage::new("receipts", "rolled back"))?;
        Err(InboxError::Database(
            diesel::result::Error::RollbackTransaction,
        ))
    });
    assert!(inner.is_err());
    conn.transaction(|conn| {
        outbox::send(conn, &OutgoingMessage::new("receipts", "kept savepoint"))
    })?;
    outbox::send(conn, &OutgoingMessage::new("receipts", "after"))?;
    let _ = id;
    Ok(())
}

pub fn a_savepoint_that_rolls_back_takes_its_message_and_leaves_the_handlers<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    with_savepoint(&mut conn, "m-1").unwrap();
    let mut payloads: Vec<String> = relay_all(&mut conn)
        .into_iter()
        .map(|m| String::from_utf8(m.payload).unwrap())
        .collect();
    payloads.sort();
    assert_eq!(payloads, ["after", "before", "kept savepoint"]);
}

pub fn keyed_and_unkeyed_messages_of_one_handler_are_all_written<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let messages = [
        keyed("account-1", "k1"),
        OutgoingMessage::new("receipts", "u1"),
        keyed("account-1", "k2"),
        OutgoingMessage::new("receipts", "u2"),
    ];
    assert!(
        handle(&mut conn, "m-1", &messages, End::Commit)
            .unwrap()
            .is_processed()
    );
    assert_eq!(key_seqs(&mut conn, "account-1"), [1, 2]);
    let payloads: Vec<String> = relay_all(&mut conn)
        .into_iter()
        .map(|m| String::from_utf8(m.payload).unwrap())
        .collect();
    assert_eq!(payloads.len(), 4, "{payloads:?}");
    let k1 = payloads.iter().position(|p| p == "k1").unwrap();
    let k2 = payloads.iter().position(|p| p == "k2").unwrap();
    assert!(k1 < k2, "the key's order: {payloads:?}");
}

/// The message's insert fails at the commit (a trigger refuses it): the
/// delivery fails as database trouble, to retry (not a statement the body
/// ignored, not a failed attempt of the message), nothing of it commits,
/// and the connection carries on.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub fn a_message_that_cannot_be_written_fails_the_commit_and_commits_nothing<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    conn.batch_execute(
        "CREATE FUNCTION refuse_outbox() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'the outbox refuses %', NEW.destination; END $$; \
         CREATE TRIGGER refuse_outbox BEFORE INSERT ON inbox_outbox FOR EACH ROW \
         WHEN (NEW.destination = 'refused') EXECUTE FUNCTION refuse_outbox();",
    )
    .unwrap();
    let messages = [OutgoingMessage::new("refused", "x")];
    let error = handle(&mut conn, "m-1", &messages, End::Commit).unwrap_err();
    // The database's own error (not `IgnoredStatementFailure`, which would
    // blame the body), to retry.
    let AppError::Db(cause) = &error else {
        panic!("{error:?}")
    };
    assert!(
        matches!(cause, diesel::result::Error::DatabaseError(..)),
        "{cause:?}"
    );
    assert_eq!(inbox_runtime::recovery(cause), Recovery::Retry, "{cause:?}");
    assert!(
        cause.to_string().contains("the outbox refuses refused"),
        "{cause}"
    );
    assert_eq!(rows(&mut conn), 0);
    assert_eq!(
        conn.bigint("SELECT COUNT(*) AS value FROM inbox_messages"),
        0,
        "the claim did not commit"
    );
    assert_eq!(
        conn.bigint("SELECT COUNT(*) AS value FROM inbox_failures"),
        0,
        "not counted as a failed attempt of the message"
    );
    // The connection is sound: the next delivery commits.
    let ids = handle(
        &mut conn,
        "m-2",
        &[OutgoingMessage::new("receipts", "ok")],
        End::Commit,
    )
    .unwrap();
    assert_eq!(ids.processed().map(|ids| ids.len()), Some(1));
    assert_eq!(rows(&mut conn), 1);
}
