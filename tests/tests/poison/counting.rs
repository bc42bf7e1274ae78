//! Failed attempts counted across the rollback, the limit and the dead
//! state, an unbounded limit, the error text kept, and a message that
//! succeeds after failing.

use inbox_runtime::{
    AckDecision, InboxError, MAX_ERROR_TEXT_BYTES, MaxAttempts, ack_decision, dead_letters,
    run_idempotent_with,
};
use inbox_tests::TestBackend;

use crate::handlers::*;
use crate::support::*;

/// Each failed delivery rolls its effect back, leaves no claim, and counts
/// one attempt with its own error text, after the rollback.
pub fn a_failed_body_is_counted_across_its_rollback<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    for attempt in 1..=2 {
        let text = format!("provider down ({attempt})");
        let msg = Msg::failing("c-1", &text);
        let result = three(&mut conn, &msg);
        assert!(
            matches!(&result, Err(AppError::Failed(failed)) if *failed == text),
            "{result:?}"
        );
        assert_eq!(ack_decision(&result), AckDecision::Retry);
        assert_eq!(msg.runs(), 1, "the body ran");
        assert_eq!(effects(&mut observer, "c-1"), 0, "its effect rolled back");
        assert_eq!(
            claims(&mut observer, THREE, "c-1"),
            0,
            "no claim until dead"
        );
        assert_eq!(
            failure_row::<B>(&mut observer, THREE, "c-1"),
            counted(attempt, &text)
        );
    }
    // Another handler of the same id counts on its own.
    let other = unbounded(&mut conn, &Msg::failing("c-1", "audit failed"));
    assert!(matches!(other, Err(AppError::Failed(_))), "{other:?}");
    assert_eq!(
        failure_row::<B>(&mut observer, UNBOUNDED, "c-1"),
        counted(1, "audit failed")
    );
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "c-1"),
        counted(2, "provider down (2)")
    );
    // A Diesel error of the body's own (not a lock conflict, not a lost
    // connection) is a failed attempt too, with Diesel's text.
    let result = diesel_typed(&mut conn, &Msg::failing("c-2", "unused"));
    assert!(
        matches!(result, Err(diesel::result::Error::NotFound)),
        "{result:?}"
    );
    assert_eq!(ack_decision(&result), AckDecision::Retry);
    assert_eq!(
        failure_row::<B>(&mut observer, DIESEL_TYPED, "c-2"),
        counted(1, "Record not found")
    );
    assert_eq!(all_failure_rows(&mut observer), 3);
    assert_eq!(all_effects(&mut observer), 0);
    assert_eq!(all_claims(&mut observer), 0);

    // The connection is idle and works: the next delivery commits.
    let fine = Msg::succeeding("c-3");
    three(&mut conn, &fine).expect("processed");
    assert_eq!(effects(&mut observer, "c-3"), 1);
    assert_eq!(failure_row::<B>(&mut observer, THREE, "c-3"), None);
}

/// A long error text is kept cut at a character boundary, within the
/// bound, ending with `…`; the dead delivery reports the same text.
pub fn the_error_text_is_bounded_at_a_character_boundary<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    // 1,800 bytes of three-byte characters: byte 1,021 is inside one.
    let long = "日".repeat(600);
    let kept = format!("{}…", "日".repeat(340));
    assert!(kept.len() <= MAX_ERROR_TEXT_BYTES);
    for _ in 1..=2 {
        let _ = three(&mut conn, &Msg::failing("long-1", &long));
    }
    let row = failure_row::<B>(&mut observer, THREE, "long-1").expect("counted");
    assert_eq!(row.last_error, kept);
    let result = three(&mut conn, &Msg::failing("long-1", &long));
    match result.as_ref().map_err(AppError::inbox) {
        Err(Some(InboxError::AttemptsExhausted {
            attempts: 3,
            last_error,
        })) => assert_eq!(*last_error, kept),
        other => panic!("expected exhausted attempts, got {other:?}"),
    }
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "long-1"),
        exhausted(3, &kept)
    );
}

/// NUL characters (which PostgreSQL cannot store) are replaced, and the
/// text kept is still within the bound: the count is written on every
/// backend, and a rejection's reason too.
pub fn an_error_text_with_nul_characters_is_kept_within_the_bound<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let _ = three(&mut conn, &Msg::failing("nul-1", "a\0b"));
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "nul-1"),
        counted(1, "a\u{fffd}b")
    );

    let many = "\0".repeat(2_000);
    let result = three(&mut conn, &Msg::failing("nul-2", &many));
    assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
    let row = failure_row::<B>(&mut observer, THREE, "nul-2").expect("the attempt is counted");
    assert_eq!(row.attempts, 1);
    assert!(
        row.last_error.len() <= MAX_ERROR_TEXT_BYTES,
        "{} bytes kept",
        row.last_error.len()
    );
    assert!(row.last_error.ends_with('…'), "{:?}", row.last_error);
    assert!(
        row.last_error
            .trim_end_matches('…')
            .chars()
            .all(|c| c == '\u{fffd}')
    );

    let rejection = InboxError::rejected(&many);
    let InboxError::Rejected { reason } = &rejection else {
        unreachable!()
    };
    assert!(
        reason.len() <= MAX_ERROR_TEXT_BYTES,
        "{} bytes",
        reason.len()
    );
    let result = three(&mut conn, &Msg::rejecting("nul-3", &many));
    assert!(
        matches!(result, Err(AppError::Inbox(InboxError::Rejected { .. }))),
        "{result:?}"
    );
    let row = failure_row::<B>(&mut observer, THREE, "nul-3").expect("recorded");
    assert!(row.dead && row.rejected, "{row:?}");
    assert!(row.last_error.len() <= MAX_ERROR_TEXT_BYTES);
}

/// `max_attempts = 3`: two failures to retry, the third is fatal, the
/// fourth and later are duplicates whose body does not run.
pub fn the_third_failure_is_fatal<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    for attempt in 1..=2 {
        let msg = Msg::failing("l-1", &format!("boom {attempt}"));
        let result = three(&mut conn, &msg);
        assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
        assert_eq!(ack_decision(&result), AckDecision::Retry);
        assert_eq!(claims(&mut observer, THREE, "l-1"), 0);
    }
    let third = Msg::failing("l-1", "boom 3");
    let result = three(&mut conn, &third);
    assert_eq!(third.runs(), 1);
    match result.as_ref().map_err(AppError::inbox) {
        Err(Some(InboxError::AttemptsExhausted {
            attempts: 3,
            last_error,
        })) => assert_eq!(last_error, "boom 3"),
        other => panic!("expected exhausted attempts, got {other:?}"),
    }
    assert_eq!(ack_decision(&result), AckDecision::DeadLetter);
    assert_eq!(
        result.unwrap_err().inbox().map(InboxError::recovery),
        Some(inbox_runtime::Recovery::Never)
    );
    assert_eq!(effects(&mut observer, "l-1"), 0, "rolled back");
    assert_eq!(claims(&mut observer, THREE, "l-1"), 1, "claimed as dead");
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "l-1"),
        exhausted(3, "boom 3")
    );

    for later in [
        Msg::failing("l-1", "boom 4"),
        Msg::failing("l-1", "boom 5"),
        Msg::succeeding("l-1"),
    ] {
        let result = three(&mut conn, &later);
        assert!(result.is_ok(), "a duplicate: {result:?}");
        assert_eq!(ack_decision(&result), AckDecision::Ack);
        assert_eq!(later.runs(), 0, "a dead message's body does not run");
    }
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "l-1"),
        exhausted(3, "boom 3"),
        "duplicates count nothing"
    );
    assert_eq!(effects(&mut observer, "l-1"), 0);
}

/// `max_attempts = unbounded`: twenty failures counted, never dead; the
/// next success commits.
pub fn unbounded_failures_are_counted_and_never_fatal<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    for attempt in 1..=20 {
        let msg = Msg::failing("u-1", &format!("boom {attempt}"));
        let result = unbounded(&mut conn, &msg);
        assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
        assert_eq!(ack_decision(&result), AckDecision::Retry);
        assert_eq!(msg.runs(), 1);
    }
    assert_eq!(
        failure_row::<B>(&mut observer, UNBOUNDED, "u-1"),
        counted(20, "boom 20")
    );
    assert_eq!(claims(&mut observer, UNBOUNDED, "u-1"), 0);
    assert!(dead_letters::summary(&mut observer).unwrap().is_empty());

    let fine = Msg::succeeding("u-1");
    unbounded(&mut conn, &fine).expect("processed");
    assert_eq!(fine.runs(), 1);
    assert_eq!(effects(&mut observer, "u-1"), 1);
    assert_eq!(claims(&mut observer, UNBOUNDED, "u-1"), 1);
}

/// `run_idempotent_with` takes its limit per call: one attempt, two.
pub fn run_idempotent_with_takes_the_limit_it_is_given<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let deliver = |conn: &mut B::Connection, id: &str, limit: MaxAttempts| {
        run_idempotent_with(conn, key("poison.with", id), limit, |conn| {
            write_effect(conn, id, "with")?;
            Err::<(), AppError>(AppError::Failed(format!("{id} failed")))
        })
    };
    let once = deliver(&mut conn, "w-1", MaxAttempts::limit(1));
    assert!(
        matches!(
            once.as_ref().map_err(AppError::inbox),
            Err(Some(InboxError::AttemptsExhausted { attempts: 1, .. }))
        ),
        "{once:?}"
    );
    assert_eq!(
        failure_row::<B>(&mut observer, "poison.with", "w-1"),
        exhausted(1, "w-1 failed")
    );

    let first = deliver(&mut conn, "w-2", MaxAttempts::limit(2));
    assert!(matches!(first, Err(AppError::Failed(_))), "{first:?}");
    let second = deliver(&mut conn, "w-2", MaxAttempts::limit(2));
    assert!(
        matches!(
            second.as_ref().map_err(AppError::inbox),
            Err(Some(InboxError::AttemptsExhausted { attempts: 2, .. }))
        ),
        "{second:?}"
    );
    assert_eq!(claims(&mut observer, "poison.with", "w-2"), 1);
    assert_eq!(all_effects(&mut observer), 0);
}

/// A limit lowered between deliveries (a redeploy): the next failure is
/// fatal. The error reports the limit the count reached, as
/// `InboxError::AttemptsExhausted::attempts` documents; the record keeps the
/// count itself.
pub fn a_lowered_limit_makes_the_next_failure_fatal<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let deliver = |conn: &mut B::Connection, limit: MaxAttempts| {
        run_idempotent_with(conn, key("poison.with", "low-1"), limit, |_conn| {
            Err::<(), AppError>(AppError::Failed("still failing".to_owned()))
        })
    };
    for _ in 0..3 {
        let result = deliver(&mut conn, MaxAttempts::limit(5));
        assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
    }
    let result = deliver(&mut conn, MaxAttempts::limit(2));
    assert_eq!(
        failure_row::<B>(&mut observer, "poison.with", "low-1"),
        exhausted(4, "still failing")
    );
    assert!(
        matches!(
            result.as_ref().map_err(AppError::inbox),
            Err(Some(InboxError::AttemptsExhausted { attempts: 2, .. }))
        ),
        "the limit reached, as documented: {result:?}"
    );
    let page = dead_letters::list(&mut observer, &handler("poison.with"), None, 10).unwrap();
    assert_eq!(page.letters[0].attempts, 4, "the count, in the record");
}

/// Two failures, then a success: committed once. The failure row stays as
/// it was (two attempts, not dead): the runtime does not touch
/// `inbox_failures` on success. It is not a dead letter, and reviving it
/// leaves the processed claim alone.
pub fn success_after_failures_commits_once_and_keeps_the_count<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    for attempt in 1..=2 {
        let result = three(&mut conn, &Msg::failing("s-1", &format!("boom {attempt}")));
        assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
    }
    let fine = Msg::succeeding("s-1");
    let result = three(&mut conn, &fine);
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(ack_decision(&result), AckDecision::Ack);
    assert_eq!(fine.runs(), 1);
    assert_eq!(effects(&mut observer, "s-1"), 1, "committed once");
    assert_eq!(claims(&mut observer, THREE, "s-1"), 1);
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "s-1"),
        counted(2, "boom 2"),
        "the count stays after the success"
    );
    assert!(dead_letters::summary(&mut observer).unwrap().is_empty());
    let page = dead_letters::list(&mut observer, &handler(THREE), None, 10).unwrap();
    assert!(page.letters.is_empty() && page.next.is_none());

    let again = Msg::failing("s-1", "never runs");
    assert!(three(&mut conn, &again).is_ok());
    assert_eq!(again.runs(), 0, "a duplicate");
    assert_eq!(
        dead_letters::revive(&mut observer, &handler(THREE), ["s-1"]).unwrap(),
        0
    );
    assert_eq!(claims(&mut observer, THREE, "s-1"), 1, "the claim is kept");
    assert_eq!(effects(&mut observer, "s-1"), 1);
}

inbox_tests::backend_tests!(
    a_failed_body_is_counted_across_its_rollback,
    the_error_text_is_bounded_at_a_character_boundary,
    an_error_text_with_nul_characters_is_kept_within_the_bound,
    the_third_failure_is_fatal,
    unbounded_failures_are_counted_and_never_fatal,
    run_idempotent_with_takes_the_limit_it_is_given,
    success_after_failures_commits_once_and_keeps_the_count,
    a_lowered_limit_makes_the_next_failure_fatal,
);
