//! A body that panics in a batch: the messages before it commit, its
//! attempt is counted, the panic propagates, the messages after it do not
//! run, and the connection is usable afterwards (no transaction open).

use std::panic::{AssertUnwindSafe, catch_unwind};

use inbox_runtime::MaxAttempts;
use inbox_tests::TestBackend;

use crate::support::*;

fn a_panic_at<B: TestBackend>(position: usize) {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let batch = ids(&format!("panic-at-{position}"), 10);
    let panicking = batch[position].clone();
    let mut runs = Runs::new();
    let caught = catch_unwind(AssertUnwindSafe(|| {
        run_batch(&mut conn, &batch, MaxAttempts::limit(5), |conn, id| {
            *runs.entry(id.to_owned()).or_default() += 1;
            apply(conn, id)?;
            if id == panicking {
                panic!("deliberate panic on {id}");
            }
            Ok(())
        })
    }));
    let payload = match caught {
        Err(payload) => payload,
        Ok((report, _)) => panic!("the panic became a report: {report:?}"),
    };
    assert_eq!(
        panic_text(&*payload),
        format!("deliberate panic on {panicking}"),
        "the body's panic is resumed"
    );
    assert_eq!(depth(&mut conn), 0, "no transaction left open");
    for (index, id) in batch.iter().enumerate() {
        let committed = i64::from(index < position);
        assert_eq!(effects(&mut observer, id), committed, "{id}");
        assert_eq!(claims(&mut observer, id), committed, "{id}");
        if index > position {
            assert_eq!(runs.get(id), None, "{id}: after the panic, not run");
        }
    }
    assert_eq!(runs.get(&panicking), Some(&2), "in the batch, then alone");
    assert_eq!(
        failure_row::<B>(&mut observer, &panicking),
        counted(
            1,
            &format!("the handler panicked: deliberate panic on {panicking}")
        ),
        "its attempt is counted"
    );
    assert_eq!(all_failure_rows(&mut observer), 1);

    // The same connection redelivers the batch: the ones before are
    // duplicates, the rest are processed.
    let (report, runs) = apply_batch(&mut conn, &batch);
    for (index, (ending, id)) in endings(&report).iter().zip(&batch).enumerate() {
        let expected = if index < position {
            "duplicate"
        } else {
            "processed"
        };
        assert_eq!(ending, expected, "{id}");
    }
    assert_eq!(runs.len(), 10 - position);
    assert_eq!(all_effects(&mut observer), 10);
    assert_eq!(depth(&mut conn), 0);
}

pub fn a_panic_first_is_counted_and_resumed<B: TestBackend>() {
    a_panic_at::<B>(0);
}

pub fn a_panic_in_the_middle_is_counted_and_resumed<B: TestBackend>() {
    a_panic_at::<B>(4);
}

pub fn a_panic_last_is_counted_and_resumed<B: TestBackend>() {
    a_panic_at::<B>(9);
}

inbox_tests::backend_tests!(
    a_panic_first_is_counted_and_resumed,
    a_panic_in_the_middle_is_counted_and_resumed,
    a_panic_last_is_counted_and_resumed,
);
