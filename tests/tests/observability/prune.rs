//! Pruning batches: rows counted by table, and by handler for a batch over
//! one handler.

use diesel::RunQueryDsl;
use inbox_runtime::{HandlerName, Prune, RetentionPolicy};
use inbox_tests::{TestBackend, statement};
use tracing::Level;

use crate::capture::*;

fn pruned(labels: &[(&str, &str)]) -> String {
    key("inbox_pruned_rows_total", labels)
}

pub fn pruned_rows_are_counted<B: TestBackend>() {
    let Some(db) = B::open() else {
        return;
    };
    let mut conn = db.connect();
    let old = B::ago_sql(30 * 86_400);
    for (handler, id) in [("a", "1"), ("a", "2"), ("a", "3"), ("b", "1"), ("b", "2")] {
        statement(format!(
            "INSERT INTO inbox_messages (handler, message_id, received_at) VALUES ('{handler}', '{id}', {old})"
        ))
        .execute(&mut conn)
        .unwrap();
    }
    statement("INSERT INTO inbox_messages (handler, message_id) VALUES ('a', 'fresh')")
        .execute(&mut conn)
        .unwrap();
    let policy = || RetentionPolicy::parse("7d", "1d").unwrap();

    // One handler, in batches of two: 2 + 1 rows.
    let only_a = Prune::new(policy().only(HandlerName::new("a").unwrap())).batch_size(2);
    let (report, seen, metrics) = observed(|| only_a.run(&mut conn));
    assert_eq!(report.expect("pruned").rows_deleted, 3);
    assert_metrics(
        &metrics,
        &[
            (pruned(&[("table", "inbox_messages"), ("handler", "a")]), 3),
            // The same pass over the failure records: nothing to prune.
            (pruned(&[("table", "inbox_failures"), ("handler", "a")]), 0),
        ],
        &[],
    );
    let batches: Vec<_> = seen
        .events_named("inbox.pruned")
        .into_iter()
        .map(|event| {
            assert_eq!(event.level, Level::DEBUG);
            assert_eq!(event.span, None);
            event.fields.clone()
        })
        .collect();
    let batch = |table: &str, rows: u64, handler: Option<&str>| {
        let mut fields = Fields::from([
            ("inbox.table".to_owned(), s(table)),
            ("inbox.rows".to_owned(), Value::U64(rows)),
            ("message".to_owned(), s("a pruning batch committed")),
        ]);
        if let Some(handler) = handler {
            fields.insert("inbox.handler".to_owned(), s(handler));
        }
        fields
    };
    assert_eq!(
        batches,
        [
            batch("inbox_messages", 2, Some("a")),
            batch("inbox_messages", 1, Some("a")),
            batch("inbox_failures", 0, Some("a")),
        ]
    );

    // Every handler: a full batch of b's two rows, then an empty one.
    let all = Prune::new(policy()).batch_size(2);
    let (report, seen, metrics) = observed(|| all.run(&mut conn));
    assert_eq!(report.expect("pruned").rows_deleted, 2);
    assert_metrics(
        &metrics,
        &[
            (pruned(&[("table", "inbox_messages")]), 2),
            (pruned(&[("table", "inbox_failures")]), 0),
            // The outbox's one pass (it has no handlers): nothing sent yet.
            (pruned(&[("table", "inbox_outbox")]), 0),
        ],
        &[],
    );
    let batches: Vec<_> = seen
        .events_named("inbox.pruned")
        .into_iter()
        .map(|event| event.fields.clone())
        .collect();
    assert_eq!(
        batches,
        [
            batch("inbox_messages", 2, None),
            batch("inbox_messages", 0, None),
            batch("inbox_failures", 0, None),
            batch("inbox_outbox", 0, None),
        ]
    );
}

inbox_tests::backend_tests!(only [sqlite, postgres]: pruned_rows_are_counted);
