//! Pooled<B> connections, and the runtime used without the attribute:
//! `claim` and `run_idempotent`.

use diesel::prelude::*;

use crate::handlers::*;
use crate::support::*;

use inbox_runtime::{Claim, Outcome, claim, run_idempotent};
use inbox_tests::DieselBackend;

pub fn pooled_connection_by_reference<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let pool = db.pool(2);
    let mut pooled: Pooled<B> = pool.get().expect("a pooled connection");
    let first = Msg::new("pool-1");
    assert_eq!(
        pooled_by_ref(&mut pooled, &first).unwrap(),
        Outcome::Processed(())
    );
    let again = Msg::new("pool-1");
    assert_eq!(
        pooled_by_ref(&mut pooled, &again).unwrap(),
        Outcome::Duplicate
    );
    assert_eq!((first.runs.get(), again.runs.get()), (1, 0));
    let err = pooled_by_ref(&mut pooled, &Msg::new("")).expect_err("bad id");
    assert!(
        err.inbox().is_some_and(|e| e.is_invalid_message()),
        "{err:?}"
    );
    drop(pooled);
    assert_eq!(conn.effects_for("pool-1"), 1);
    assert_eq!(conn.inbox_count("e2e.pooled", "pool-1"), 1);
}

pub fn pooled_connection_by_value<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let pool = db.pool(1);
    let get = || -> Pooled<B> { pool.get().expect("the pooled connection came back") };
    let first = Msg::new("pool-2");
    assert_eq!(
        pooled_by_value(get(), &first).unwrap(),
        Outcome::Processed(())
    );
    let again = Msg::new("pool-2");
    assert_eq!(pooled_by_value(get(), &again).unwrap(), Outcome::Duplicate);
    let third = Msg::new("pool-2");
    assert_eq!(
        pooled_by_mut_value(get(), &third).unwrap(),
        Outcome::Duplicate
    );
    let other = Msg::new("pool-3");
    assert_eq!(
        pooled_by_mut_value(get(), &other).unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(
        (
            first.runs.get(),
            again.runs.get(),
            third.runs.get(),
            other.runs.get()
        ),
        (1, 0, 0, 1)
    );
    let state = pool.state();
    assert_eq!(
        (state.connections, state.idle_connections),
        (1, 1),
        "the handler gave the connection back to the pool"
    );
    let mut back = get();
    assert!(
        !in_transaction(&mut back),
        "returned without an open transaction"
    );
    drop(back);
    assert_eq!(
        conn.all_effects(),
        vec![
            (
                "e2e.pooled".to_owned(),
                "pool-2".to_owned(),
                "by_value".to_owned()
            ),
            (
                "e2e.pooled".to_owned(),
                "pool-3".to_owned(),
                "by_mut_value".to_owned()
            ),
        ]
    );
}

pub fn claim_outside_a_transaction_is_refused<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let k = key("e2e.claim", "c-1");
    let err = claim(&mut conn, &k).expect_err("no transaction is open");
    assert!(
        matches!(err, diesel::result::Error::NotInTransaction),
        "{err:?}"
    );
    assert_eq!(conn.inbox_rows(), NO_ROWS, "nothing recorded");

    // Inside a transaction that rolls back: claimed, then gone.
    let rolled_back: QueryResult<()> = conn.transaction(|conn| {
        assert_eq!(claim(conn, &k)?, Claim::Claimed);
        assert_eq!(claim(conn, &k)?, Claim::Duplicate);
        Err(diesel::result::Error::RollbackTransaction)
    });
    assert!(rolled_back.is_err());
    assert_eq!(conn.inbox_rows(), NO_ROWS);

    // Inside a transaction that commits: durable.
    conn.transaction(|conn| {
        assert_eq!(claim(conn, &k)?, Claim::Claimed);
        QueryResult::Ok(())
    })
    .unwrap();
    let mut other = db.connect();
    let again = other
        .transaction(|conn| claim(conn, &k))
        .expect("claim on another connection");
    assert_eq!(again, Claim::Duplicate);
    assert_eq!(
        other.inbox_rows(),
        vec![("e2e.claim".to_owned(), "c-1".to_owned())]
    );
    assert_connection_usable(&mut conn);
}

pub fn run_idempotent_directly_behaves_like_the_attribute<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let body_runs = std::cell::Cell::new(0);
    let direct =
        |conn: &mut B::Connection, id: &str, mode: Mode| -> Result<Outcome<usize>, AppError> {
            run_idempotent(conn, key(APPLY, id), |conn| {
                body_runs.set(body_runs.get() + 1);
                conn.record_effect(APPLY, id, 1, "direct")?;
                match mode {
                    Mode::Fail => Err(AppError::Failed("direct body failed")),
                    Mode::Panic => std::panic::panic_any(DeliberatePanic("direct")),
                    _ => Ok(Outcome::Processed(id.len())),
                }
            })
        };

    // Claimed directly, then a duplicate for the attribute (same name).
    assert_eq!(
        direct(&mut conn, "r-1", Mode::Apply).unwrap(),
        Outcome::Processed(3)
    );
    assert_eq!(
        direct(&mut conn, "r-1", Mode::Apply).unwrap(),
        Outcome::Duplicate
    );
    let via_macro = Msg::new("r-1");
    apply(&mut conn, &via_macro).unwrap();
    assert_eq!(via_macro.runs.get(), 0);

    // Claimed by the attribute, then a duplicate directly.
    apply(&mut conn, &Msg::new("r-2")).unwrap();
    assert_eq!(
        direct(&mut conn, "r-2", Mode::Apply).unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(body_runs.get(), 1);

    // Err and panic roll back; a redelivery processes.
    assert!(matches!(
        direct(&mut conn, "r-3", Mode::Fail),
        Err(AppError::Failed(_))
    ));
    let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        direct(&mut conn, "r-3", Mode::Panic)
    }))
    .expect_err("the panic is resumed");
    assert_eq!(payload.downcast_ref(), Some(&DeliberatePanic("direct")));
    assert_connection_usable(&mut conn);
    assert_eq!(conn.inbox_count(APPLY, "r-3"), 0);
    assert_eq!(conn.effects_for("r-3"), 0);
    assert_eq!(
        direct(&mut conn, "r-3", Mode::Apply).unwrap(),
        Outcome::Processed(3)
    );
    assert_eq!(body_runs.get(), 4);

    // Nested in an outer transaction that rolls back.
    let outer: Result<(), AppError> = conn.transaction(|conn| {
        assert_eq!(direct(conn, "r-4", Mode::Apply)?, Outcome::Processed(3));
        Err(AppError::Failed("outer rolls back"))
    });
    assert!(outer.is_err());
    assert_eq!(
        direct(&mut conn, "r-4", Mode::Apply).unwrap(),
        Outcome::Processed(3)
    );

    for id in ["r-1", "r-2", "r-3", "r-4"] {
        assert_eq!(conn.effects_for(id), 1, "{id}");
        assert_eq!(conn.inbox_count(APPLY, id), 1, "{id}");
    }
}

pub fn teardown_and_migrations_manage_the_same_table<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    apply(&mut conn, &Msg::new("m-1")).expect("processed");
    inbox_runtime::schema::teardown(&mut conn).expect("drop the inbox");
    let without_inbox = Msg::new("m-1");
    let err = apply(&mut conn, &without_inbox).expect_err("no inbox table");
    assert!(matches!(err, AppError::Db(_)), "{err:?}");
    assert_eq!(without_inbox.runs.get(), 0);
    assert_connection_usable(&mut conn);

    let embedded = diesel::migration::MigrationSource::<DieselBackend<B>>::migrations(
        &<DieselBackend<B> as inbox_runtime::migrations::EmbeddedInboxMigrations>::MIGRATIONS,
    )
    .expect("the embedded migrations")
    .len();
    assert_eq!(
        inbox_runtime::migrations::run_pending(&mut conn).unwrap(),
        embedded,
        "every embedded migration runs on an empty database"
    );
    assert_eq!(
        inbox_runtime::migrations::run_pending(&mut conn).unwrap(),
        0
    );
    inbox_runtime::setup(&mut conn).expect("setup after the migration is harmless");
    // A new inbox has forgotten every id, as documented for teardown.
    let first = Msg::new("m-1");
    apply(&mut conn, &first).expect("processed again");
    let again = Msg::new("m-1");
    apply(&mut conn, &again).expect("duplicate");
    assert_eq!((first.runs.get(), again.runs.get()), (1, 0));
    assert_eq!(
        conn.inbox_rows(),
        vec![(APPLY.to_owned(), "m-1".to_owned())]
    );
    let age = received_age_micros::<B>(&mut conn, APPLY, "m-1");
    assert!((-1_000_000..300_000_000).contains(&age), "age {age} µs");
}

inbox_tests::backend_tests!(
    pooled_connection_by_reference,
    pooled_connection_by_value,
    claim_outside_a_transaction_is_refused,
    run_idempotent_directly_behaves_like_the_attribute,
    teardown_and_migrations_manage_the_same_table,
);
