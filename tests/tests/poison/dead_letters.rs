//! The operator surface: `summary`, `list` (pages oldest first, the cursor
//! through its text form), `revive` / `revive_all` (the next delivery runs
//! the body with a fresh count), `purge` / `purge_all` (the claim stays),
//! refused ids and page sizes; and, on PostgreSQL's generation layout, a
//! dead message whose claim sits in an archived generation.

use inbox_runtime::dead_letters::{self, Cursor, MAX_PAGE_SIZE};
use inbox_runtime::{InboxError, KeyProblem, MaxAttempts, run_idempotent_with};
use inbox_tests::TestBackend;

use crate::handlers::*;
use crate::support::*;

/// Makes `(handler, id)` dead on its first failure (`last_error`:
/// `"<id> failed"`).
fn make_dead<C>(conn: &mut C, handler_name: &str, id: &str)
where
    C: diesel::connection::LoadConnection<Backend: inbox_runtime::InboxBackend>,
{
    let result = run_idempotent_with(conn, key(handler_name, id), MaxAttempts::limit(1), |conn| {
        write_effect(conn, id, "dying")?;
        Err::<(), AppError>(AppError::Failed(format!("{id} failed")))
    });
    assert!(
        matches!(
            result,
            Err(AppError::Inbox(InboxError::AttemptsExhausted {
                attempts: 1,
                ..
            }))
        ),
        "{result:?}"
    );
}

/// Delivers `(handler, id)` with a body that must not run (a duplicate).
fn assert_skipped<C>(conn: &mut C, handler_name: &str, id: &str)
where
    C: diesel::connection::LoadConnection<Backend: inbox_runtime::InboxBackend>,
{
    let result = run_idempotent_with(conn, key(handler_name, id), MaxAttempts::limit(1), |_| {
        Err::<(), AppError>(AppError::Failed("the body ran".to_owned()))
    });
    assert!(
        result.is_ok(),
        "{handler_name}/{id} is a duplicate: {result:?}"
    );
}

fn ids_of(page: &dead_letters::DeadLetterPage) -> Vec<String> {
    page.letters.iter().map(|l| l.message_id.clone()).collect()
}

pub fn summary_and_pages_oldest_first<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut ops = db.connect();
    let b: Vec<String> = (0..7).map(|i| format!("b-{i}")).collect();
    for id in &b {
        make_dead(&mut conn, "ops.b", id);
    }
    for id in ["a-0", "a-1"] {
        let result = three(&mut conn, &Msg::rejecting(id, "bad"));
        assert!(result.is_err());
    }
    // Counted but alive: not a dead letter.
    let _ = run_idempotent_with(
        &mut conn,
        key("ops.b", "b-live"),
        MaxAttempts::limit(5),
        |_| Err::<(), AppError>(AppError::Failed("once".to_owned())),
    );

    let summary = dead_letters::summary(&mut ops).unwrap();
    let counts: Vec<(&str, u64)> = summary
        .iter()
        .map(|h| (h.handler.as_str(), h.dead))
        .collect();
    assert_eq!(counts, [("ops.b", 7), (THREE, 2)]);

    let mut seen = Vec::new();
    let mut after: Option<Cursor> = None;
    let mut sizes = Vec::new();
    loop {
        let page = dead_letters::list(&mut ops, &handler("ops.b"), after.as_ref(), 3).unwrap();
        sizes.push(page.letters.len());
        seen.extend(ids_of(&page));
        for letter in &page.letters {
            assert_eq!(letter.handler, "ops.b");
            assert_eq!(letter.attempts, 1);
            assert_eq!(letter.last_error, format!("{} failed", letter.message_id));
            assert!(!letter.rejected);
            assert!(letter.first_failed_at <= letter.last_failed_at);
            assert!(letter.last_failed_at <= letter.dead_at);
        }
        match page.next {
            // Through its text form, as a command-line tool would.
            Some(next) => {
                let text = next.to_string();
                let parsed: Cursor = text.parse().expect("the cursor reads back");
                assert_eq!(parsed, next);
                after = Some(parsed);
            }
            None => break,
        }
    }
    assert_eq!(sizes, [3, 3, 1]);
    assert_eq!(seen, b, "oldest first, each once");
    let first = dead_letters::list(&mut ops, &handler("ops.b"), None, 1).unwrap();
    assert_eq!(
        summary
            .iter()
            .find(|h| h.handler == "ops.b")
            .unwrap()
            .oldest_dead_at,
        first.letters[0].dead_at
    );

    // A page size that divides the count: one more, empty page.
    let whole = dead_letters::list(&mut ops, &handler("ops.b"), None, 7).unwrap();
    assert_eq!(ids_of(&whole), b);
    let rest = dead_letters::list(&mut ops, &handler("ops.b"), whole.next.as_ref(), 7).unwrap();
    assert!(rest.letters.is_empty() && rest.next.is_none());

    let rejected = dead_letters::list(&mut ops, &handler(THREE), None, MAX_PAGE_SIZE).unwrap();
    assert_eq!(ids_of(&rejected), ["a-0", "a-1"]);
    assert!(
        rejected
            .letters
            .iter()
            .all(|l| l.rejected && l.last_error == "bad")
    );
    assert!(rejected.next.is_none());

    for refused in [0, MAX_PAGE_SIZE + 1] {
        match dead_letters::list(&mut ops, &handler("ops.b"), None, refused) {
            Err(InboxError::InvalidBatchSize { requested, max }) => {
                assert_eq!((requested, max), (refused, MAX_PAGE_SIZE));
            }
            other => panic!("page size {refused}: {other:?}"),
        }
    }
    assert!("12:".parse::<Cursor>().is_ok());
    assert!("twelve:b-1".parse::<Cursor>().is_err());
    assert!("b-1".parse::<Cursor>().is_err());
}

pub fn revive_runs_the_body_again_with_a_fresh_count<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut ops = db.connect();
    for attempt in 1..=3 {
        let _ = three(&mut conn, &Msg::failing("rv-1", &format!("boom {attempt}")));
    }
    assert_eq!(
        failure_row::<B>(&mut ops, THREE, "rv-1"),
        exhausted(3, "boom 3")
    );
    assert_eq!(
        dead_letters::revive(&mut ops, &handler(THREE), ["rv-1"]).unwrap(),
        1
    );
    assert_eq!(failure_row::<B>(&mut ops, THREE, "rv-1"), None);
    assert_eq!(claims(&mut ops, THREE, "rv-1"), 0);
    assert!(dead_letters::summary(&mut ops).unwrap().is_empty());

    let result = three(&mut conn, &Msg::failing("rv-1", "again"));
    assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
    assert_eq!(
        failure_row::<B>(&mut ops, THREE, "rv-1"),
        counted(1, "again"),
        "a fresh count"
    );
    let fine = Msg::succeeding("rv-1");
    three(&mut conn, &fine).expect("processed after the revival");
    assert_eq!(fine.runs(), 1);
    assert_eq!(effects(&mut ops, "rv-1"), 1, "committed once");
    assert_eq!(claims(&mut ops, THREE, "rv-1"), 1);
    let again = Msg::succeeding("rv-1");
    three(&mut conn, &again).unwrap();
    assert_eq!(again.runs(), 0);
    // Processed now, not dead: reviving it changes nothing.
    assert_eq!(
        dead_letters::revive(&mut ops, &handler(THREE), ["rv-1"]).unwrap(),
        0
    );
    assert_eq!(claims(&mut ops, THREE, "rv-1"), 1);
}

/// `revive` and `purge` of ids that are not dead (processed, processed
/// after a failure, unknown) delete nothing.
pub fn revive_leaves_messages_that_are_not_dead_alone<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut ops = db.connect();
    three(&mut conn, &Msg::succeeding("ok-1")).unwrap();
    let _ = three(&mut conn, &Msg::failing("ok-2", "once"));
    three(&mut conn, &Msg::succeeding("ok-2")).unwrap();
    make_dead(&mut conn, "ops.other", "dead-1");
    let ids = ["ok-1", "ok-2", "unknown"];
    assert_eq!(
        dead_letters::revive(&mut ops, &handler(THREE), ids).unwrap(),
        0
    );
    assert_eq!(
        dead_letters::purge(&mut ops, &handler(THREE), ids).unwrap(),
        0
    );
    assert_eq!(
        dead_letters::revive_all(&mut ops, &handler(THREE)).unwrap(),
        0
    );
    assert_eq!(
        dead_letters::purge_all(&mut ops, &handler(THREE)).unwrap(),
        0
    );
    assert_eq!(claims(&mut ops, THREE, "ok-1"), 1);
    assert_eq!(claims(&mut ops, THREE, "ok-2"), 1);
    assert_eq!(
        failure_row::<B>(&mut ops, THREE, "ok-2"),
        counted(1, "once")
    );
    // Another handler's dead message with the same id is its own.
    assert_eq!(
        dead_letters::revive(&mut ops, &handler(THREE), ["dead-1"]).unwrap(),
        0
    );
    assert_eq!(claims(&mut ops, "ops.other", "dead-1"), 1);
    assert_eq!(all_effects(&mut ops), 2);
}

pub fn revive_all_and_purge_all_touch_one_handler<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut ops = db.connect();
    for id in ["a-0", "a-1", "a-2"] {
        make_dead(&mut conn, "ops.a", id);
    }
    for id in ["b-0", "b-1"] {
        make_dead(&mut conn, "ops.b", id);
    }
    assert_eq!(
        dead_letters::revive_all(&mut ops, &handler("ops.a")).unwrap(),
        3
    );
    for id in ["a-0", "a-1", "a-2"] {
        assert_eq!(claims(&mut ops, "ops.a", id), 0);
        assert_eq!(failure_row::<B>(&mut ops, "ops.a", id), None);
    }
    let b = dead_letters::list(&mut ops, &handler("ops.b"), None, 10).unwrap();
    assert_eq!(
        ids_of(&b),
        ["b-0", "b-1"],
        "the other handler's are untouched"
    );

    assert_eq!(
        dead_letters::purge_all(&mut ops, &handler("ops.b")).unwrap(),
        2
    );
    assert!(dead_letters::summary(&mut ops).unwrap().is_empty());
    for id in ["b-0", "b-1"] {
        assert_eq!(claims(&mut ops, "ops.b", id), 1, "the claim stays");
        assert_eq!(failure_row::<B>(&mut ops, "ops.b", id), None);
        assert_skipped(&mut conn, "ops.b", id);
    }
    // Revived: processed again.
    let result = run_idempotent_with(
        &mut conn,
        key("ops.a", "a-0"),
        MaxAttempts::limit(1),
        |conn| {
            write_effect(conn, "a-0", "revived")?;
            Ok::<(), AppError>(())
        },
    );
    assert!(result.is_ok());
    assert_eq!(effects(&mut ops, "a-0"), 1);
    assert_eq!(all_failure_rows(&mut ops), 0);
}

pub fn purge_keeps_the_claim_and_forgets_the_record<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut ops = db.connect();
    make_dead(&mut conn, THREE, "pg-1");
    make_dead(&mut conn, THREE, "pg-2");
    assert_eq!(
        dead_letters::purge(&mut ops, &handler(THREE), ["pg-1"]).unwrap(),
        1
    );
    assert_eq!(failure_row::<B>(&mut ops, THREE, "pg-1"), None);
    assert_eq!(claims(&mut ops, THREE, "pg-1"), 1);
    let later = Msg::succeeding("pg-1");
    three(&mut conn, &later).unwrap();
    assert_eq!(later.runs(), 0, "still skipped");
    assert_eq!(
        dead_letters::purge(&mut ops, &handler(THREE), ["pg-1"]).unwrap(),
        0
    );
    // Forgotten: no longer revivable, so skipped until retention prunes it.
    assert_eq!(
        dead_letters::revive(&mut ops, &handler(THREE), ["pg-1"]).unwrap(),
        0
    );
    assert_eq!(claims(&mut ops, THREE, "pg-1"), 1);
    let page = dead_letters::list(&mut ops, &handler(THREE), None, 10).unwrap();
    assert_eq!(ids_of(&page), ["pg-2"]);
}

/// Whether a refused id's problem is the expected one.
type ProblemIs = fn(&KeyProblem) -> bool;

pub fn invalid_ids_are_refused_and_change_nothing<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut ops = db.connect();
    make_dead(&mut conn, THREE, "iv-1");
    let too_long = "x".repeat(256);
    let cases: [(&str, &str, ProblemIs); 3] = [
        ("", "empty", |p| matches!(p, KeyProblem::Empty)),
        (&too_long, "too long", |p| {
            matches!(p, KeyProblem::TooLong { .. })
        }),
        ("a\0b", "NUL", |p| {
            matches!(p, KeyProblem::ContainsNul { .. })
        }),
    ];
    for (bad, what, expected) in cases {
        for result in [
            dead_letters::revive(&mut ops, &handler(THREE), ["iv-1", bad]),
            dead_letters::purge(&mut ops, &handler(THREE), ["iv-1", bad]),
        ] {
            match result {
                Err(InboxError::InvalidMessageId { problem, .. }) => {
                    assert!(expected(&problem), "{what}: {problem:?}")
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }
    assert_eq!(
        failure_row::<B>(&mut ops, THREE, "iv-1"),
        exhausted(1, "iv-1 failed"),
        "the valid id in the same call was not touched"
    );
    assert_eq!(claims(&mut ops, THREE, "iv-1"), 1);
}

inbox_tests::backend_tests!(
    summary_and_pages_oldest_first,
    revive_runs_the_body_again_with_a_fresh_count,
    revive_leaves_messages_that_are_not_dead_alone,
    revive_all_and_purge_all_touch_one_handler,
    purge_keeps_the_claim_and_forgets_the_record,
    invalid_ids_are_refused_and_change_nothing,
);

/// PostgreSQL's generation layout: a dead message's claim rotated into an
/// archived generation still makes redeliveries duplicates; reviving it
/// deletes the archived claim, and the next delivery processes it.
#[cfg(feature = "postgres")]
mod partitioned_layout {
    use std::time::Duration;

    use inbox_runtime::dead_letters;
    use inbox_runtime::prune::partitioned;
    use inbox_tests::{Postgres, SqlRows, TestBackend};

    use crate::handlers::*;
    use crate::support::*;

    fn archived(conn: &mut impl SqlRows, id: &str) -> i64 {
        conn.bigint(&format!(
            "SELECT COUNT(*) AS value FROM inbox_messages_archive \
             WHERE handler = 'poison.three' AND message_id = '{id}'"
        ))
    }

    #[test]
    fn a_dead_claim_in_an_archived_generation_is_revived() {
        let Some((db, mut conn)) = fresh::<Postgres>() else {
            return;
        };
        partitioned::setup(&mut conn).expect("the generation layout");
        let mut ops = db.connect();
        for attempt in 1..=3 {
            let _ = three(
                &mut conn,
                &Msg::failing("gen-1", &format!("boom {attempt}")),
            );
        }
        assert_eq!(claims(&mut ops, THREE, "gen-1"), 1);
        assert_eq!(
            partitioned::rotate(&mut ops, Duration::from_secs(10)).unwrap(),
            2
        );
        assert_eq!(claims(&mut ops, THREE, "gen-1"), 0, "no longer current");
        assert_eq!(archived(&mut ops, "gen-1"), 1, "archived in generation 1");
        let skipped = Msg::succeeding("gen-1");
        three(&mut conn, &skipped).unwrap();
        assert_eq!(skipped.runs(), 0, "the archived claim still deduplicates");

        assert_eq!(
            dead_letters::revive(&mut ops, &handler(THREE), ["gen-1"]).unwrap(),
            1
        );
        assert_eq!(archived(&mut ops, "gen-1"), 0);
        let fine = Msg::succeeding("gen-1");
        three(&mut conn, &fine).expect("processed again");
        assert_eq!(fine.runs(), 1);
        assert_eq!(effects(&mut ops, "gen-1"), 1);
        assert_eq!(
            claims(&mut ops, THREE, "gen-1"),
            1,
            "claimed in the current generation"
        );
        let again = Msg::succeeding("gen-1");
        three(&mut conn, &again).unwrap();
        assert_eq!(again.runs(), 0);
        assert_eq!(failure_row::<Postgres>(&mut ops, THREE, "gen-1"), None);
    }
}
