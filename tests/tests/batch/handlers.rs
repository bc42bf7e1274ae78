//! An `#[idempotent]` function used as the body of a batch (the natural way
//! to reuse a handler): called for the message whose body runs, under the
//! batch's own scope, it finds its id claimed by the batch's transaction and
//! must run, not skip its body as a duplicate (which would acknowledge the
//! message with no effect). Called for another id of the batch, it is a
//! duplicate: that message's own body runs it.

use diesel::connection::LoadConnection;
use inbox_runtime::{InboxBackend, MaxAttempts, Outcome, idempotent, run_idempotent_batch_with};
use inbox_tests::TestBackend;

use crate::support::*;

/// The batch's per-message handler, under the batch's scope.
#[idempotent(id = id, handler = "batch.apply", shared_scope)]
pub fn apply_handler<C>(conn: &mut C, id: &String) -> Result<(), AppError>
where
    C: LoadConnection<Backend: InboxBackend>,
{
    apply(conn, id)
}

/// The handler of the same scope, applying `other`'s effect as well.
#[idempotent(id = other, handler = "batch.apply", shared_scope)]
pub fn apply_other<C>(conn: &mut C, other: &String) -> Result<(), AppError>
where
    C: LoadConnection<Backend: InboxBackend>,
{
    apply(conn, other)
}

pub fn an_idempotent_handler_is_a_batch_body<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let batch = ids("handler", 5);
    let run = |conn: &mut B::Connection| {
        run_idempotent_batch_with(
            conn,
            &handler(),
            &batch,
            |id| id,
            MaxAttempts::limit(3),
            |conn, id: &String| apply_handler(conn, id),
        )
    };
    let report = run(&mut conn);
    assert_eq!(report.processed(), 5, "{:?}", report.results());
    for id in &batch {
        assert_eq!(
            effects(&mut conn, id),
            1,
            "{id}: the handler's body ran once"
        );
        assert_eq!(claims(&mut conn, id), 1);
    }
    let again = run(&mut conn);
    assert_eq!(again.duplicates(), 5);
    assert_eq!(all_effects(&mut conn), 5);
    // On its own, the handler still deduplicates.
    assert!(apply_handler(&mut conn, &batch[0]).is_ok());
    assert_eq!(effects(&mut conn, &batch[0]), 1);
}

/// A message run on its own (a batch of one, or a message split off after
/// a failure) runs the handler used as its body too.
pub fn an_idempotent_handler_runs_when_its_message_runs_alone<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let single = ids("alone", 1);
    let report = run_idempotent_batch_with(
        &mut conn,
        &handler(),
        &single,
        |id| id,
        MaxAttempts::limit(3),
        |conn, id: &String| apply_handler(conn, id),
    );
    assert_eq!(report.processed(), 1, "{:?}", report.results());
    assert_eq!(effects(&mut conn, &single[0]), 1, "the handler's body ran");

    // Split off: fails in the batch, succeeds alone.
    let batch = ids("split-off", 3);
    let mut failed_once = false;
    let report = run_idempotent_batch_with(
        &mut conn,
        &handler(),
        &batch,
        |id| id,
        MaxAttempts::limit(3),
        |conn, id: &String| {
            if *id == batch[1] && !failed_once {
                failed_once = true;
                return Err(AppError::Failed("once"));
            }
            apply_handler(conn, id)
        },
    );
    assert_eq!(report.processed(), 3, "{:?}", report.results());
    for id in &batch {
        assert_eq!(
            effects(&mut conn, id),
            1,
            "{id}: the handler's body ran once"
        );
    }
}

pub fn a_handler_for_another_id_of_the_batch_is_a_duplicate<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let batch = ids("other", 2);
    // The first message's body also calls the handler for the second id,
    // which the batch claimed for the second message's body.
    let report = run_idempotent_batch_with(
        &mut conn,
        &handler(),
        &batch,
        |id| id,
        MaxAttempts::limit(3),
        |conn, id: &String| {
            if *id == batch[0] {
                apply_other(conn, &batch[1])?;
            }
            apply_handler(conn, id)
        },
    );
    assert!(
        report
            .results()
            .iter()
            .all(|result| matches!(result, Ok(Outcome::Processed(())))),
        "{:?}",
        report.results()
    );
    for id in &batch {
        assert_eq!(effects(&mut conn, id), 1, "{id}: applied once");
    }
}

inbox_tests::backend_tests! {
    an_idempotent_handler_is_a_batch_body,
    an_idempotent_handler_runs_when_its_message_runs_alone,
    a_handler_for_another_id_of_the_batch_is_a_duplicate;
}
