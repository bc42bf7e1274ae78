//! A value a body's code finds in a thread-local slot while the body runs:
//! a blocking body runs in one call (or its future's first poll), an async
//! one across its polls, perhaps on several threads, so the value is put in
//! the slot for each poll and the slot's previous value back after it (also
//! when the body panics). What a delivery's body finds this way: the
//! messages whose body runs (`delivery::current`), the statements it defers
//! to the commit (`delivery::deferred`), the trace its outgoing messages
//! continue (`outbox::continuing`).

use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::thread::LocalKey;

/// A slot's value, replaced until [`take`](Self::take) or drop, when the
/// value it replaced is put back.
pub(crate) struct Installed<T: 'static> {
    slot: &'static LocalKey<RefCell<T>>,
    previous: Option<T>,
}

impl<T: 'static> Installed<T> {
    /// Puts `value` in `slot`.
    pub(crate) fn new(slot: &'static LocalKey<RefCell<T>>, value: T) -> Self {
        let previous = slot.with(|slot| slot.replace(value));
        Installed {
            slot,
            previous: Some(previous),
        }
    }

    /// Puts the replaced value back: the installed one, as the code that
    /// ran meanwhile left it.
    pub(crate) fn take(mut self) -> T
    where
        T: Default,
    {
        let previous = self.previous.take().unwrap_or_default();
        self.slot.with(|slot| slot.replace(previous))
    }
}

impl<T: 'static> Drop for Installed<T> {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            self.slot.with(|slot| *slot.borrow_mut() = previous);
        }
    }
}

/// `body`, with `slot` holding a clone of `value` while each of its polls
/// runs.
pub(crate) async fn polled_with<T, F>(
    slot: &'static LocalKey<RefCell<T>>,
    value: T,
    body: F,
) -> F::Output
where
    T: Clone + 'static,
    F: Future,
{
    let mut body = pin!(body);
    poll_fn(|cx| {
        let _installed = Installed::new(slot, value.clone());
        body.as_mut().poll(cx)
    })
    .await
}
