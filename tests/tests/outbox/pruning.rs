//! Sent outgoing messages are pruned with the inbox, by the policy's
//! window; pending and dead ones never are.

use diesel::connection::SimpleConnection;
use inbox_runtime::outbox::{self, OutgoingMessage, Relay};
use inbox_runtime::{Backoff, Prune, RetentionPolicy};
use inbox_tests::{SqlRows, TestBackend};

use crate::support::*;

inbox_tests::backend_tests!(sent_messages_are_pruned_by_the_window_and_no_others);

pub fn sent_messages_are_pruned_by_the_window_and_no_others<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    send_all(
        &mut conn,
        &[
            keyed("k", "k1"),
            OutgoingMessage::new("receipts", "u1"),
            OutgoingMessage::new("receipts", "u2"),
            OutgoingMessage::new("nowhere", "dead"),
        ],
    );
    // Kept once sent, for the pruner's window.
    let relay = Relay::new()
        .keep_sent(true)
        .max_attempts(1)
        .backoff(Backoff {
            first: std::time::Duration::ZERO,
            max: std::time::Duration::ZERO,
        });
    let mut broker = Broker {
        refuse_destination: Some("nowhere"),
        ..Broker::default()
    };
    let report = relay.run_once(&mut conn, &mut broker).unwrap();
    assert_eq!((report.published, report.dead), (3, 1), "{report:?}");
    send_all(
        &mut conn,
        &[
            keyed("k", "k2"),
            OutgoingMessage::new("receipts", "pending"),
        ],
    );
    // Every row recorded and dead two days ago; two of the sent ones sent
    // then, the third just now.
    conn.batch_execute(&format!(
        "UPDATE inbox_outbox SET created_at = {ago}; \
         UPDATE inbox_outbox SET dead_at = {ago} WHERE dead_at IS NOT NULL; \
         UPDATE inbox_outbox SET sent_at = {ago} WHERE sent_at IS NOT NULL AND destination = 'receipts' \
         AND ordering_key IS NULL",
        ago = B::ago_sql(2 * 86_400)
    ))
    .unwrap();

    let report = Prune::new(RetentionPolicy::parse("1d", "1d").unwrap())
        .run(&mut conn)
        .unwrap();
    assert_eq!(report.outbox_rows_deleted, 2, "{report:?}");
    assert!(
        report.to_string().contains("2 sent outgoing messages"),
        "{report}"
    );
    assert_eq!(
        rows(&mut conn),
        4,
        "k1 (sent since), the dead one, k2 and the pending one"
    );
    assert_eq!(outbox::backlog(&mut conn).unwrap().dead, 1);

    // The key goes on where it was: k2 is its second message.
    assert_eq!(key_seqs(&mut conn, "k"), [1, 2]);
    broker.confirmed.lock().unwrap().clear();
    while !relay.run_once(&mut conn, &mut broker).unwrap().is_idle() {}
    assert_eq!(broker.payloads(), ["k2", "pending"]);
    assert_eq!(
        conn.bigint("SELECT COUNT(*) AS value FROM inbox_outbox WHERE sent_at IS NULL"),
        1
    );
}
