//! PostgreSQL only: the handler's backend is killed in the middle of the body.

use diesel::dsl::sql;
use diesel::prelude::*;
use diesel::sql_types::Bool;
use inbox_runtime::{Outcome, idempotent};
use inbox_tests::{Postgres, TestBackend as _, connection_id};

use crate::handlers::{APPLY, apply};
use crate::support::*;

/// A delivery whose body, when `kill_pid` is set, has the handler's own
/// backend terminated between its two effects.
struct Doomed {
    id: String,
    kill_pid: Option<i64>,
}

/// `conn = conn`: the first `&mut` parameter is the connection that kills,
/// not the one the body writes through.
#[idempotent(id = msg.id, handler = "e2e.fault", conn = conn, outside_transaction = killer)]
fn killed_mid_body(
    killer: &mut PgConnection,
    conn: &mut PgConnection,
    msg: &Doomed,
) -> Result<Outcome<()>, AppError> {
    conn.record_effect("e2e.fault", &msg.id, 0, "step 1")?;
    if let Some(pid) = msg.kill_pid {
        // Waits (up to 5 s) until the backend is gone.
        let terminated: bool =
            diesel::select(sql::<Bool>(&format!("pg_terminate_backend({pid}, 5000)")))
                .get_result(killer)?;
        if !terminated {
            return Err(AppError::Failed(
                "pg_terminate_backend did not terminate the backend",
            ));
        }
    }
    conn.record_effect("e2e.fault", &msg.id, 0, "step 2")?;
    Ok(Outcome::Processed(()))
}

#[test]
fn backend_killed_mid_body_leaves_nothing_and_redelivery_processes() {
    let Some((db, mut conn)) = fresh::<Postgres>() else {
        return;
    };
    let mut killer = db.connect();
    let pid = connection_id::<Postgres>(&mut conn);
    let doomed = Doomed {
        id: "fault-1".to_owned(),
        kill_pid: Some(pid),
    };
    let err = killed_mid_body(&mut killer, &mut conn, &doomed)
        .expect_err("the handler's connection died");
    println!("fault postgres: handler error after pg_terminate_backend({pid}): {err:?}");
    assert!(
        matches!(err, AppError::Db(_)),
        "a database error, got {err:?}"
    );
    // The server's reason reaches the caller, not only the broken
    // transaction manager it left behind.
    assert!(
        !matches!(
            err,
            AppError::Db(diesel::result::Error::BrokenTransactionManager)
        ),
        "the cause is kept: {err:?}"
    );
    if let AppError::Db(error) = &err {
        assert_eq!(
            inbox_runtime::recovery(error),
            inbox_runtime::Recovery::Reconnect
        );
    }

    // The dead connection keeps failing cleanly (no panic, no hang).
    let again = killed_mid_body(
        &mut killer,
        &mut conn,
        &Doomed {
            id: "fault-1".to_owned(),
            kill_pid: None,
        },
    );
    println!("fault postgres: the dead connection then returns {again:?}");
    assert!(again.is_err(), "{again:?}");
    drop(conn);

    // Nothing was committed: no claim, no effect.
    let mut fresh_conn = db.connect();
    assert_eq!(fresh_conn.inbox_rows(), NO_ROWS);
    assert_eq!(fresh_conn.all_effects(), NO_EFFECTS);
    let gone: i64 = diesel::select(sql::<diesel::sql_types::BigInt>(&format!(
        "(SELECT count(*) FROM pg_stat_activity WHERE pid = {pid})"
    )))
    .get_result(&mut fresh_conn)
    .unwrap();
    assert_eq!(gone, 0, "the killed backend is gone");

    // The redelivery, on a fresh connection, processes once.
    let redelivery = Doomed {
        id: "fault-1".to_owned(),
        kill_pid: None,
    };
    assert_eq!(
        killed_mid_body(&mut killer, &mut fresh_conn, &redelivery).unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(
        killed_mid_body(&mut killer, &mut fresh_conn, &redelivery).unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(fresh_conn.inbox_count("e2e.fault", "fault-1"), 1);
    let notes: Vec<String> = fresh_conn
        .all_effects()
        .into_iter()
        .map(|(_, _, note)| note)
        .collect();
    assert_eq!(
        notes,
        ["step 1", "step 2"],
        "the redelivery's effects, once"
    );
}

/// A server whose encoding cannot represent an id refuses it (22P05): that is
/// a malformed message for this server, never a retryable failure, and
/// nothing is written.
#[test]
fn an_id_the_server_encoding_cannot_store_is_an_invalid_message() {
    let Some(db) = inbox_tests::PgEncodedDatabase::create("LATIN1") else {
        return;
    };
    let mut conn = db.connect();
    diesel::sql_query(effects_ddl::<Postgres>())
        .execute(&mut conn)
        .expect("create the effects table");
    let msg = Msg::new("price-in-€");
    let error = apply(&mut conn, &msg).expect_err("LATIN1 has no euro sign");
    let inbox = error.inbox().expect("an inbox error, not a database one");
    assert!(
        matches!(
            inbox,
            inbox_runtime::InboxError::InvalidMessageId {
                problem: inbox_runtime::KeyProblem::RefusedByDatabase,
                ..
            }
        ),
        "{inbox:?}"
    );
    assert_eq!(inbox.recovery(), inbox_runtime::Recovery::Never);
    assert!(!inbox.is_retryable());
    assert_eq!(msg.runs.get(), 0, "the body did not run");
    assert_eq!(conn.inbox_rows(), NO_ROWS);
    // The connection goes on: an id the server can store is processed.
    let fine = Msg::new("price-in-eur");
    apply(&mut conn, &fine).expect("processed");
    assert_eq!(conn.inbox_count(APPLY, "price-in-eur"), 1);
}
