//! One batch at a time: new ids processed once, a redelivered batch all
//! duplicates, results in the order given, copies of an id inside a batch,
//! the empty batch, and invalid ids that fail alone.

use inbox_runtime::{
    AckDecision, InboxError, KeyProblem, MAX_MESSAGE_ID_BYTES, MaxAttempts, Outcome, ack_decision,
    run_idempotent_batch, run_idempotent_batch_with,
};
use inbox_tests::{SqlRows, TestBackend};

use crate::support::*;

/// Twenty new ids: each body runs once and each is processed, with its
/// value; the same batch again, and again in another order, is all
/// duplicates, and no body runs.
pub fn new_ids_are_processed_and_redeliveries_are_duplicates<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let batch = ids("new", 20);
    let (report, runs) = apply_batch(&mut conn, &batch);
    assert_all_processed(&report, &batch);
    assert_eq!(
        (report.processed(), report.duplicates(), report.failed()),
        (20, 0, 0)
    );
    assert!(decisions(&report).iter().all(|d| *d == AckDecision::Ack));
    for id in &batch {
        assert_eq!(runs.get(id), Some(&1), "{id}: the body ran once");
        assert_eq!(effects(&mut observer, id), 1, "{id}");
        assert_eq!(claims(&mut observer, id), 1, "{id}");
    }
    assert_eq!(all_failure_rows(&mut observer), 0);

    let (again, runs) = apply_batch(&mut conn, &batch);
    assert_all_duplicates(&again);
    assert_eq!(again.duplicates(), 20);
    assert!(runs.is_empty(), "no body ran: {runs:?}");
    let mut reversed = batch.clone();
    reversed.reverse();
    let (reordered, runs) = apply_batch(&mut conn, &reversed);
    assert_all_duplicates(&reordered);
    assert!(runs.is_empty(), "no body ran: {runs:?}");
    assert!(decisions(&reordered).iter().all(|d| *d == AckDecision::Ack));
    assert_eq!(all_effects(&mut observer), 20);
    assert_eq!(all_claims(&mut observer), 20);
}

/// Results come in the order the messages were given, and the bodies run in
/// that order too, whatever the order of the ids (the claim sorts them),
/// with ids claimed before among them (`run_idempotent_batch`, the
/// default limit of attempts).
pub fn results_and_bodies_follow_the_input_order<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let before: Vec<String> = ["m-07", "m-02"].map(String::from).to_vec();
    let (report, _) = apply_batch(&mut conn, &before);
    assert_all_processed(&report, &before);

    let batch: Vec<String> = ["m-09", "m-02", "m-01", "m-07", "m-05", "m-10", "m-03"]
        .map(String::from)
        .to_vec();
    let mut order = Vec::new();
    let report = run_idempotent_batch(
        &mut conn,
        &handler(),
        &batch,
        |id| id,
        |conn, id: &String| -> Result<String, AppError> {
            order.push(id.clone());
            apply(conn, id)?;
            Ok(format!("value of {id}"))
        },
    );
    assert_eq!(order, ["m-09", "m-01", "m-05", "m-10", "m-03"]);
    let expected: Vec<Option<String>> = batch
        .iter()
        .map(|id| (!before.contains(id)).then(|| format!("value of {id}")))
        .collect();
    let got: Vec<Option<String>> = report
        .results()
        .iter()
        .map(|result| match result {
            Ok(Outcome::Processed(value)) => Some(value.clone()),
            Ok(Outcome::Duplicate) => None,
            Err(error) => panic!("{error}"),
        })
        .collect();
    assert_eq!(got, expected, "position by position");
    assert_eq!(all_effects(&mut observer), 7);
}

/// Copies of an id inside one batch: the first copy is claimed and
/// processed, the later copies are duplicates, and the body runs once.
pub fn copies_of_an_id_in_one_batch_run_once<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let batch: Vec<String> = ["a", "b", "a", "c", "b", "a"].map(String::from).to_vec();
    let (report, runs) = apply_batch(&mut conn, &batch);
    assert_eq!(
        endings(&report),
        [
            "processed",
            "processed",
            "duplicate",
            "processed",
            "duplicate",
            "duplicate"
        ]
    );
    assert_eq!(
        runs,
        Runs::from([("a".into(), 1), ("b".into(), 1), ("c".into(), 1)])
    );
    assert!(matches!(&report.results()[0], Ok(Outcome::Processed(v)) if v == "a"));
    assert!(matches!(&report.results()[3], Ok(Outcome::Processed(v)) if v == "c"));
    for id in ["a", "b", "c"] {
        assert_eq!(effects(&mut observer, id), 1, "{id}");
        assert_eq!(claims(&mut observer, id), 1, "{id}");
    }
    assert_eq!(all_claims(&mut observer), 3);
}

/// An empty batch: an empty report, no body, nothing stored.
pub fn an_empty_batch_reports_nothing<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let (report, runs) = apply_batch(&mut conn, &[]);
    assert!(report.is_empty());
    assert_eq!(
        (
            report.len(),
            report.processed(),
            report.duplicates(),
            report.failed()
        ),
        (0, 0, 0, 0)
    );
    assert!(runs.is_empty());
    assert_eq!(depth(&mut conn), 0);
    assert_eq!(all_claims(&mut db.connect()), 0);
}

/// Invalid ids (empty, too long, missing) mixed with good ones: each
/// invalid one gets its typed `InvalidMessageId` (dead-lettered), nothing
/// is stored for it and its body never runs; the good ones are processed.
pub fn invalid_ids_fail_alone<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let too_long = "x".repeat(MAX_MESSAGE_ID_BYTES + 1);
    let longest = "y".repeat(MAX_MESSAGE_ID_BYTES);
    let batch: Vec<Option<String>> = vec![
        Some("good-1".into()),
        Some(String::new()),
        None,
        Some("good-2".into()),
        Some(too_long.clone()),
        Some(longest.clone()),
        None,
        Some("good-3".into()),
    ];
    let mut runs = Vec::new();
    let report = run_idempotent_batch_with(
        &mut conn,
        &handler(),
        &batch,
        |id| id,
        MaxAttempts::limit(3),
        |conn, id: &Option<String>| -> Result<(), AppError> {
            let id = id.as_deref().expect("only valid ids reach the body");
            runs.push(id.to_owned());
            apply(conn, id)
        },
    );
    assert_eq!(runs, ["good-1", "good-2", longest.as_str(), "good-3"]);
    let problems: Vec<Option<String>> = report
        .results()
        .iter()
        .map(|result| match result {
            Ok(Outcome::Processed(())) => None,
            Err(AppError::Inbox(InboxError::InvalidMessageId { problem, .. })) => {
                Some(match problem {
                    KeyProblem::Empty => "empty".to_owned(),
                    KeyProblem::Missing => "missing".to_owned(),
                    KeyProblem::TooLong { bytes, .. } => format!("too long: {bytes}"),
                    other => format!("{other:?}"),
                })
            }
            other => panic!("unexpected: {other:?}"),
        })
        .collect();
    assert_eq!(
        problems,
        [
            None,
            Some("empty".to_owned()),
            Some("missing".to_owned()),
            None,
            Some(format!("too long: {}", MAX_MESSAGE_ID_BYTES + 1)),
            None,
            Some("missing".to_owned()),
            None,
        ]
    );
    let decisions: Vec<AckDecision> = report.results().iter().map(ack_decision).collect();
    assert_eq!(
        decisions,
        [
            AckDecision::Ack,
            AckDecision::DeadLetter,
            AckDecision::DeadLetter,
            AckDecision::Ack,
            AckDecision::DeadLetter,
            AckDecision::Ack,
            AckDecision::DeadLetter,
            AckDecision::Ack,
        ]
    );
    assert_eq!((report.processed(), report.failed()), (4, 4));
    assert_eq!(
        all_claims(&mut observer),
        4,
        "nothing stored for invalid ids"
    );
    assert_eq!(all_effects(&mut observer), 4);
    assert_eq!(claims(&mut observer, &longest), 1);
    assert_eq!(claims(&mut observer, &too_long), 0);
    assert_eq!(claims(&mut observer, ""), 0);
    assert_eq!(all_failure_rows(&mut observer), 0, "nothing counted");
}

/// Ids with the characters a claim statement could mistake (array and
/// list syntax, quotes, backslashes, `NULL`, spaces, case, accents) are
/// claimed as they are: each processed once, then each a duplicate.
pub fn ids_are_claimed_as_written<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let batch: Vec<String> = [
        "NULL",
        "null",
        "a,b",
        "{x}",
        "{\"y\"}",
        "'single'",
        "back\\slash",
        " padded ",
        "padded",
        "Case",
        "case",
        "é",
        "e\u{301}",
        "tab\tin",
        "(?, ?)",
        "$1",
    ]
    .map(String::from)
    .to_vec();
    let (report, runs) = apply_batch(&mut conn, &batch);
    assert_all_processed(&report, &batch);
    assert_eq!(runs.len(), batch.len(), "{runs:?}");
    let stored = observer.texts(&format!(
        "SELECT message_id AS value FROM inbox_messages WHERE handler = {}",
        literal(HANDLER)
    ));
    let (mut stored, mut expected) = (stored, batch.clone());
    stored.sort();
    expected.sort();
    assert_eq!(stored, expected, "stored as written");
    let mut reversed = batch.clone();
    reversed.reverse();
    let (again, runs) = apply_batch(&mut conn, &reversed);
    assert_all_duplicates(&again);
    assert!(runs.is_empty(), "{runs:?}");
}

inbox_tests::backend_tests!(
    ids_are_claimed_as_written,
    new_ids_are_processed_and_redeliveries_are_duplicates,
    results_and_bodies_follow_the_input_order,
    copies_of_an_id_in_one_batch_run_once,
    an_empty_batch_reports_nothing,
    invalid_ids_fail_alone,
);

/// On a PostgreSQL database whose encoding cannot hold an id's characters,
/// the database refuses that id's text: that message alone gets
/// `InvalidMessageId` (`RefusedByDatabase`), the others are processed.
#[cfg(feature = "postgres")]
mod refused_by_the_database {
    use diesel::PgConnection;
    use inbox_runtime::{InboxError, KeyProblem, MaxAttempts, Outcome};
    use inbox_tests::{PgEncodedDatabase, SqlRows};

    use crate::support::*;

    #[test]
    fn an_id_the_database_refuses_fails_alone() {
        let Some(db) = PgEncodedDatabase::create("LATIN1") else {
            return;
        };
        let mut conn: PgConnection = db.connect();
        let batch: Vec<String> = ["ok-1", "日本", "ok-2", "ok-0"].map(String::from).to_vec();
        let (report, runs) = run_batch(&mut conn, &batch, MaxAttempts::limit(3), |_, _| Ok(()));
        assert!(
            matches!(
                &report.results()[1],
                Err(AppError::Inbox(InboxError::InvalidMessageId {
                    problem: KeyProblem::RefusedByDatabase,
                    ..
                }))
            ),
            "{:?}",
            report.results()[1]
        );
        for position in [0, 2, 3] {
            assert!(
                matches!(&report.results()[position], Ok(Outcome::Processed(v)) if *v == batch[position]),
                "{position}: {:?}",
                report.results()[position]
            );
        }
        assert!(!runs.contains_key("日本"), "its body never ran");
        assert_eq!(
            conn.bigint("SELECT COUNT(*) AS value FROM inbox_messages"),
            3
        );
        assert_eq!(
            conn.bigint("SELECT COUNT(*) AS value FROM inbox_failures"),
            0
        );
    }
}
