//! Recording outgoing messages: in the caller's transaction, or not at all.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use diesel::Connection;
use diesel::connection::LoadConnection;
use diesel::r2d2::R2D2Connection;
use inbox_runtime::outbox::{self, OutgoingMessage, Relay};
use inbox_runtime::{InboxBackend, InboxError, OutgoingProblem, Recovery, idempotent};
use inbox_tests::{AppError, SqlRows, TestBackend};

use crate::support::*;

inbox_tests::backend_tests! {
    recorded_with_the_transaction_and_gone_with_its_rollback,
    refused_outside_a_transaction_with_nothing_written,
    a_malformed_message_is_refused_before_anything_is_written,
    a_handler_records_once_and_its_failed_attempt_records_nothing,
    a_key_is_numbered_densely_in_commit_order;
    only [postgres, mysql]: writers_of_one_key_take_turns_until_commit;
    only [postgres]: an_unkeyed_message_enters_the_position_id_and_pending_indexes_only;
    only [sqlite]: every_outbox_index_but_the_ids_is_partial;
}

pub fn recorded_with_the_transaction_and_gone_with_its_rollback<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let ids = send_all(
        &mut conn,
        &[
            OutgoingMessage::new("receipts", "one").header("traceparent", "00-aa-bb-01"),
            OutgoingMessage::new("receipts", vec![0_u8, 159, 255]),
        ],
    );
    assert_eq!(ids.len(), 2);
    assert!(ids[0] < ids[1]);
    assert_eq!(rows(&mut conn), 2);

    let rolled_back: Result<(), InboxError> = conn.transaction(|conn| {
        outbox::send(conn, &OutgoingMessage::new("receipts", "ghost"))?;
        Err(InboxError::Database(
            diesel::result::Error::RollbackTransaction,
        ))
    });
    assert!(rolled_back.is_err());
    assert_eq!(rows(&mut conn), 2, "the rolled-back message is gone");
    let backlog = outbox::backlog(&mut conn).unwrap();
    assert_eq!((backlog.pending, backlog.dead), (2, 0));
    assert!(backlog.oldest_pending_micros.is_some());
    let stored = conn.texts("SELECT id AS value FROM inbox_outbox ORDER BY position");
    assert_eq!(stored, [ids[0].to_string(), ids[1].to_string()]);
}

pub fn refused_outside_a_transaction_with_nothing_written<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let error = outbox::send(&mut conn, &OutgoingMessage::new("receipts", "x")).unwrap_err();
    assert!(
        matches!(error, InboxError::OutsideTransaction { .. }),
        "{error:?}"
    );
    assert_eq!(error.recovery(), Recovery::Never);
    assert!(
        error.to_string().contains("must run inside a transaction"),
        "{error}"
    );
    assert_eq!(rows(&mut conn), 0);
}

pub fn a_malformed_message_is_refused_before_anything_is_written<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let cases = [
        (
            OutgoingMessage::new("", "x"),
            OutgoingProblem::Empty {
                field: "destination",
            },
        ),
        (
            OutgoingMessage::new("q", "x").ordering_key("k".repeat(256)),
            OutgoingProblem::TooLong {
                field: "ordering key",
                bytes: 256,
                max: 255,
            },
        ),
        (
            OutgoingMessage::new("q", "x").header("a", "b\r\nc"),
            OutgoingProblem::Forbidden {
                field: "header value",
                character: '\r',
            },
        ),
    ];
    for (message, expected) in cases {
        let result: Result<(), InboxError> = conn.transaction(|conn| {
            // A good message first: the refusal must not leave it behind.
            outbox::send(conn, &OutgoingMessage::new("q", "good"))?;
            outbox::send(conn, &message)?;
            Ok(())
        });
        match result {
            Err(InboxError::InvalidOutgoingMessage { problem }) => assert_eq!(problem, expected),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(rows(&mut conn), 0);
    // The longest accepted texts are stored whole.
    let longest = OutgoingMessage::new("d".repeat(255), "x")
        .ordering_key("é".repeat(127))
        .header("h".repeat(255), "v".repeat(4096));
    send_all(&mut conn, &[longest]);
    assert_eq!(
        conn.bigint("SELECT COUNT(*) AS value FROM inbox_outbox WHERE ordering_key IS NOT NULL"),
        1
    );
}

/// What `announce` does with its message.
#[derive(Clone, Copy, PartialEq)]
pub enum Then {
    Commit,
    Fail,
}

#[idempotent(id = id, handler = "outbox.announce")]
fn announce<C>(conn: &mut C, id: &str, then: Then) -> Result<(), AppError>
where
    C: LoadConnection + R2D2Connection,
    C::Backend: InboxBackend,
{
    outbox::send(
        conn,
        &OutgoingMessage::new("receipts", id).ordering_key("account"),
    )?;
    match then {
        Then::Commit => Ok(()),
        Then::Fail => Err(AppError::Failed("after recording its message")),
    }
}

pub fn a_handler_records_once_and_its_failed_attempt_records_nothing<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    announce(&mut conn, "m-1", Then::Commit).unwrap();
    announce(&mut conn, "m-1", Then::Commit).unwrap();
    assert_eq!(rows(&mut conn), 1, "the duplicate recorded nothing");
    assert!(announce(&mut conn, "m-2", Then::Fail).is_err());
    assert_eq!(rows(&mut conn), 1, "the failed attempt recorded nothing");
    announce(&mut conn, "m-2", Then::Commit).unwrap();
    assert_eq!(key_seqs(&mut conn, "account"), [1, 2]);
}

pub fn a_key_is_numbered_densely_in_commit_order<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    send_all(
        &mut conn,
        &[keyed("a", "a1"), keyed("b", "b1"), keyed("a", "a2")],
    );
    let rolled_back: Result<(), InboxError> = conn.transaction(|conn| {
        outbox::send(conn, &keyed("a", "lost"))?;
        Err(InboxError::Database(
            diesel::result::Error::RollbackTransaction,
        ))
    });
    assert!(rolled_back.is_err());
    send_all(&mut conn, &[keyed("a", "a3")]);
    assert_eq!(
        key_seqs(&mut conn, "a"),
        [1, 2, 3],
        "no gap for the rollback"
    );
    assert_eq!(key_seqs(&mut conn, "b"), [1]);
}

/// A second writer of a key waits for the first one's transaction: it gets
/// the next number after a commit, and the same number after a rollback.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub fn writers_of_one_key_take_turns_until_commit<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    for first_commits in [true, false] {
        let mut first = db.connect();
        let (recorded, wait) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        let holder = thread::spawn(move || {
            let result: Result<(), InboxError> = first.transaction(|conn| {
                outbox::send(conn, &keyed("k", "first"))?;
                recorded.send(()).unwrap();
                released.recv().unwrap();
                if first_commits {
                    Ok(())
                } else {
                    Err(InboxError::Database(
                        diesel::result::Error::RollbackTransaction,
                    ))
                }
            });
            assert_eq!(result.is_ok(), first_commits);
        });
        wait.recv().unwrap();
        let mut second = db.connect();
        let (done, finished) = mpsc::channel();
        let writer = thread::spawn(move || {
            send_all(&mut second, &[keyed("k", "second")]);
            done.send(()).unwrap();
        });
        assert!(
            finished.recv_timeout(Duration::from_millis(300)).is_err(),
            "the second writer waits for the first one's transaction"
        );
        release.send(()).unwrap();
        holder.join().unwrap();
        finished
            .recv_timeout(Duration::from_secs(10))
            .expect("then it records");
        writer.join().unwrap();
    }
    let mut conn = db.connect();
    assert_eq!(key_seqs(&mut conn, "k"), [1, 2, 3]);
    let mut broker = Broker::default();
    while !Relay::new()
        .run_once(&mut conn, &mut broker)
        .unwrap()
        .is_idle()
    {}
    assert_eq!(broker.payloads(), ["first", "second", "second"]);
}

/// A handler pays for every index entry its message makes: on PostgreSQL
/// an unkeyed message enters three (an index no row entered is its
/// metapage alone, one page), and a keyed one the key's two as well.
pub fn an_unkeyed_message_enters_the_position_id_and_pending_indexes_only<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let entered = |conn: &mut B::Connection| -> Vec<String> {
        conn.texts(
            "SELECT c.relname AS value FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
             WHERE i.indrelid = 'inbox_outbox'::regclass \
             AND pg_relation_size(c.oid) > current_setting('block_size')::int ORDER BY 1",
        )
    };
    assert!(
        entered(&mut conn).is_empty(),
        "a new outbox's indexes are empty"
    );
    let unkeyed: Vec<OutgoingMessage> = (0..50)
        .map(|n| OutgoingMessage::new("receipts", format!("m{n}")).header("kind", "receipt"))
        .collect();
    send_all(&mut conn, &unkeyed);
    assert_eq!(
        entered(&mut conn),
        [
            "inbox_outbox_id_key",
            "inbox_outbox_pending_idx",
            "inbox_outbox_pkey"
        ]
    );
    send_all(&mut conn, &[keyed("account-1", "k1")]);
    assert_eq!(
        entered(&mut conn),
        [
            "inbox_outbox_id_key",
            "inbox_outbox_key_seq_unique",
            "inbox_outbox_key_unsent_idx",
            "inbox_outbox_pending_idx",
            "inbox_outbox_pkey"
        ]
    );
}

/// SQLite's counterpart of the check above, on the schema: apart from the
/// id's (a `UNIQUE` column, an index without SQL), every index of the
/// outbox names the rows it holds, so an unkeyed message enters the id's
/// and the pending one only.
pub fn every_outbox_index_but_the_ids_is_partial<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let whole = conn.texts(
        "SELECT name AS value FROM sqlite_master WHERE type = 'index' \
         AND tbl_name = 'inbox_outbox' AND (sql IS NULL OR sql NOT LIKE '%WHERE%') ORDER BY 1",
    );
    assert_eq!(whole, ["sqlite_autoindex_inbox_outbox_1"], "the id's only");
    let partial = conn.bigint(
        "SELECT COUNT(*) AS value FROM sqlite_master WHERE type = 'index' \
         AND tbl_name = 'inbox_outbox' AND sql LIKE '%WHERE%'",
    );
    assert_eq!(partial, 5);
}
