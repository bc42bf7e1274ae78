//! Bad policies and settings are rejected with clear, typed errors before
//! anything touches a database.

use std::time::Duration;

use inbox_runtime::retention::parse_duration;
use inbox_runtime::{InboxError, Prune, RetentionPolicy, RetentionProblem};

use crate::support::*;

fn problem<T: std::fmt::Debug>(result: Result<T, InboxError>) -> (RetentionProblem, String) {
    match result {
        Err(error @ InboxError::InvalidRetention { .. }) => {
            assert!(
                !error.is_retryable(),
                "a configuration error is not retryable"
            );
            let text = error.to_string();
            let InboxError::InvalidRetention { problem, .. } = error else {
                unreachable!()
            };
            (problem, text)
        }
        other => panic!("expected InvalidRetention, got {other:?}"),
    }
}

#[test]
fn zero_window_is_rejected() {
    let (found, text) = problem(RetentionPolicy::new(Duration::ZERO, secs(DAY)));
    assert_eq!(found, RetentionProblem::ZeroWindow);
    assert_eq!(
        text,
        "invalid retention setting: the retention window is zero, so every id could be pruned as soon as it is claimed"
    );
    assert_eq!(problem_of_text("0s", "1d"), RetentionProblem::ZeroWindow);
}

#[test]
fn negative_window_is_rejected() {
    assert_eq!(problem_of_text("-7d", "1d"), RetentionProblem::Negative);
    assert_eq!(problem_of_text("7d", "-1h"), RetentionProblem::Negative);
    let (_, text) = problem(parse_duration("-7d"));
    assert_eq!(text, "invalid retention setting: the duration is negative");
}

#[test]
fn window_shorter_than_the_redelivery_window_is_rejected() {
    let (found, text) = problem(RetentionPolicy::new(secs(HOUR), secs(3 * DAY)));
    assert_eq!(
        found,
        RetentionProblem::ShorterThanRedelivery {
            keep: secs(HOUR),
            redelivery_window: secs(3 * DAY)
        }
    );
    assert_eq!(
        text,
        "invalid retention setting: the retention window (1h) is shorter than the redelivery window (3d): \
         ids would be pruned while their messages can still be redelivered, and those redeliveries would be \
         processed again"
    );
    // Per handler too, naming the handler.
    let (_, text) = problem(
        policy(7 * DAY, 2 * DAY)
            .with_handler(handler("billing.apply"), secs(DAY))
            .check(),
    );
    assert!(
        text.starts_with(
            "invalid retention setting for handler `billing.apply`: the retention window (1d)"
        ),
        "{text}"
    );
}

#[test]
fn zero_redelivery_window_and_absurd_lengths_are_rejected() {
    assert_eq!(
        problem_of_text("7d", "0s"),
        RetentionProblem::ZeroRedeliveryWindow
    );
    assert!(matches!(
        problem_of_text("40000d", "1d"),
        RetentionProblem::TooLong { .. }
    ));
    assert!(matches!(
        problem_of_text("7d", "40000d"),
        RetentionProblem::TooLong { .. }
    ));
}

#[test]
fn unparsable_durations_are_rejected() {
    for text in ["", "7", "7 days", "1.5d", "seven", "7dd", "d7"] {
        let (found, message) = problem(parse_duration(text));
        assert!(
            matches!(found, RetentionProblem::Unparsable { .. }),
            "{text:?}: {found:?}"
        );
        assert!(message.contains("is not a duration"), "{message}");
    }
}

#[test]
fn bad_batch_sizes_are_rejected() {
    let prune = Prune::new(policy(7 * DAY, DAY));
    let error = prune.clone().batch_size(0).check().unwrap_err();
    assert!(
        matches!(
            error,
            InboxError::InvalidBatchSize {
                requested: 0,
                max: 100_000
            }
        ),
        "{error:?}"
    );
    assert!(
        !error.is_retryable(),
        "a configuration error is not retryable"
    );
    assert_eq!(
        error.to_string(),
        "invalid pruning batch size: 0 is not between 1 and 100000"
    );
    assert!(prune.clone().batch_size(100_001).check().is_err());
    assert!(prune.batch_size(100_000).check().is_ok());
}

#[test]
fn good_policies_read_back() {
    let policy = RetentionPolicy::parse("7d", "36h").unwrap();
    assert_eq!(policy.keep(), secs(7 * DAY));
    assert_eq!(policy.redelivery_window(), secs(36 * HOUR));
    assert_eq!(
        policy.to_string(),
        "keep ids for 7d (redelivery window 36h)"
    );
}

fn problem_of_text(keep: &str, redelivery_window: &str) -> RetentionProblem {
    problem(RetentionPolicy::parse(keep, redelivery_window)).0
}

/// The generation layout's settings (PostgreSQL only).
#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    #[test]
    fn bad_generation_settings_are_rejected() {
        use inbox_runtime::prune::partitioned::{MAX_GENERATIONS, Maintenance};
        let maintenance = || Maintenance::new(policy(7 * DAY, DAY)).unwrap();
        for count in [0, MAX_GENERATIONS + 1, 30] {
            let (found, text) = problem(maintenance().generations(count));
            assert_eq!(
                found,
                RetentionProblem::GenerationCount {
                    requested: count,
                    max: MAX_GENERATIONS
                }
            );
            assert!(
                text.contains("looks its id up in each archived generation"),
                "{text}"
            );
        }
        for count in 1..=MAX_GENERATIONS {
            let period = maintenance().generations(count).unwrap().period();
            assert_eq!(period, secs(7 * DAY) / count, "{count} generations");
        }
        let (found, text) = problem(Maintenance::new(policy(7 * DAY, DAY).only(handler("h"))));
        assert_eq!(found, RetentionProblem::HandlerScopeNeedsBatches);
        assert!(text.contains("cannot prune one handler only"), "{text}");
        // The longest window: its period stays within what the database's
        // interval arithmetic holds.
        let longest =
            inbox_runtime::RetentionPolicy::new(inbox_runtime::MAX_RETENTION, secs(DAY)).unwrap();
        let maintenance = Maintenance::new(longest).unwrap().generations(1).unwrap();
        assert_eq!(maintenance.period(), inbox_runtime::MAX_RETENTION);
    }
}
