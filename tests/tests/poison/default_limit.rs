//! The process-wide default limit (`set_default_max_attempts`): five unless
//! changed, read by handlers without a limit of their own (and by
//! `run_idempotent`), ignored by handlers that name theirs.
//!
//! The default is process-global. In this binary only the `defaulted`
//! handlers and `run_idempotent` read it, and only the tests of this module
//! use them; they hold [`DEFAULT_LOCK`] while they change it, and restore
//! it on the way out (also when they fail).

use std::sync::{Mutex, MutexGuard, PoisonError};

use inbox_runtime::{
    InboxError, MaxAttempts, default_max_attempts, run_idempotent, set_default_max_attempts,
};
use inbox_tests::TestBackend;

use crate::handlers::*;
use crate::support::*;

static DEFAULT_LOCK: Mutex<()> = Mutex::new(());

/// The default to themselves, back at `MaxAttempts::DEFAULT` when dropped.
struct DefaultHeld {
    _lock: MutexGuard<'static, ()>,
}

impl DefaultHeld {
    fn take() -> Self {
        let lock = DEFAULT_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
        set_default_max_attempts(MaxAttempts::DEFAULT);
        DefaultHeld { _lock: lock }
    }
}

impl Drop for DefaultHeld {
    fn drop(&mut self) {
        set_default_max_attempts(MaxAttempts::DEFAULT);
    }
}

fn exhausted_after(result: &Result<(), AppError>) -> Option<u32> {
    match result.as_ref().map_err(AppError::inbox) {
        Err(Some(InboxError::AttemptsExhausted { attempts, .. })) => Some(*attempts),
        _ => None,
    }
}

pub fn the_process_default_applies_to_handlers_without_a_limit<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let _held = DefaultHeld::take();
    assert_eq!(default_max_attempts(), MaxAttempts::limit(5));

    for attempt in 1..=4 {
        let result = defaulted(&mut conn, &Msg::failing("d-1", &format!("boom {attempt}")));
        assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
    }
    let fifth = defaulted(&mut conn, &Msg::failing("d-1", "boom 5"));
    assert_eq!(exhausted_after(&fifth), Some(5), "{fifth:?}");
    assert_eq!(
        failure_row::<B>(&mut observer, DEFAULTED, "d-1"),
        exhausted(5, "boom 5")
    );

    set_default_max_attempts(MaxAttempts::limit(2));
    let first = defaulted(&mut conn, &Msg::failing("d-2", "boom 1"));
    assert!(matches!(first, Err(AppError::Failed(_))), "{first:?}");
    let second = defaulted(&mut conn, &Msg::failing("d-2", "boom 2"));
    assert_eq!(exhausted_after(&second), Some(2), "{second:?}");
    // `run_idempotent` reads it too.
    let deliver = |conn: &mut B::Connection| {
        run_idempotent(conn, key("poison.plain", "d-3"), |_conn| {
            Err::<(), AppError>(AppError::Failed("plain".to_owned()))
        })
    };
    assert!(matches!(deliver(&mut conn), Err(AppError::Failed(_))));
    assert_eq!(exhausted_after(&deliver(&mut conn)), Some(2));
    // A handler that names its limit ignores the default.
    for attempt in 1..=2 {
        let result = three(&mut conn, &Msg::failing("d-4", &format!("boom {attempt}")));
        assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
    }
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "d-4"),
        counted(2, "boom 2")
    );

    set_default_max_attempts(MaxAttempts::Unbounded);
    for attempt in 1..=7 {
        let result = defaulted(&mut conn, &Msg::failing("d-5", &format!("boom {attempt}")));
        assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
    }
    assert_eq!(
        failure_row::<B>(&mut observer, DEFAULTED, "d-5"),
        counted(7, "boom 7")
    );
    assert_eq!(claims(&mut observer, DEFAULTED, "d-5"), 0);
}

#[cfg(feature = "async")]
pub async fn the_process_default_applies_to_async_handlers_without_a_limit<B: TestBackend>() {
    use crate::handlers_async::{defaulted_async, three_async};

    let Some((db, _conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let mut conn = db.connect_async().await;
    let _held = DefaultHeld::take();
    for attempt in 1..=4 {
        let result =
            defaulted_async(&mut conn, &Msg::failing("ad-1", &format!("boom {attempt}"))).await;
        assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
    }
    let fifth = defaulted_async(&mut conn, &Msg::failing("ad-1", "boom 5")).await;
    assert_eq!(exhausted_after(&fifth), Some(5), "{fifth:?}");

    set_default_max_attempts(MaxAttempts::limit(1));
    let first = defaulted_async(&mut conn, &Msg::failing("ad-2", "boom 1")).await;
    assert_eq!(exhausted_after(&first), Some(1), "{first:?}");
    let named = three_async(&mut conn, &Msg::failing("ad-3", "boom 1")).await;
    assert!(matches!(named, Err(AppError::Failed(_))), "{named:?}");
    assert_eq!(
        failure_row::<B>(&mut observer, DEFAULTED, "ad-2"),
        exhausted(1, "boom 1")
    );
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "ad-3"),
        counted(1, "boom 1")
    );
}

inbox_tests::backend_tests!(the_process_default_applies_to_handlers_without_a_limit);

#[cfg(feature = "async")]
mod asynchronous {
    use super::the_process_default_applies_to_async_handlers_without_a_limit;

    inbox_tests::backend_tests!(async only [postgres, mysql]:
        the_process_default_applies_to_async_handlers_without_a_limit,
    );
}
