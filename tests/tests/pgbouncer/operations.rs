//! The runtime's other paths through transaction pooling, statement cache
//! off, behind a pooler that moves a client's consecutive transactions from
//! one server connection to the next (round robin over two): batches, a
//! poison message's attempts and its dead letter, pruning.

use std::time::Duration;

use diesel::connection::{CacheSize, SimpleConnection as _};
use diesel::prelude::*;
use diesel::sql_types::Text;
use inbox_runtime::{
    AckDecision, ClaimKey, HandlerName, InboxError, MaxAttempts, Outcome, Prune, RetentionPolicy,
    ack_decision, dead_letters, run_idempotent_batch, run_idempotent_with,
};
use inbox_tests::SqlRows as _;

use super::{effects, spread, through};

fn insert_effect(conn: &mut PgConnection, id: &str) -> QueryResult<()> {
    diesel::sql_query("INSERT INTO effects (id) VALUES ($1)")
        .bind::<Text, _>(id)
        .execute(conn)
        .map(drop)
}

/// A batch of 100 messages, then the same batch again on another client:
/// every id processed once, then every one a duplicate.
#[test]
fn batches_work_through_transaction_pooling() {
    let Some((server, bouncer)) = spread() else {
        return;
    };
    let handler = HandlerName::new("pgbouncer.batch").unwrap();
    let ids: Vec<String> = (0..100).map(|n| format!("batch-{n}")).collect();
    for (round, client) in [(1, "first"), (2, "second")] {
        let mut conn = through(&bouncer, CacheSize::Disabled);
        let report = run_idempotent_batch(
            &mut conn,
            &handler,
            &ids,
            |id| id.as_str(),
            |conn, id| insert_effect(conn, id),
        );
        let decisions: Vec<AckDecision> = report.results().iter().map(ack_decision).collect();
        assert!(
            decisions.iter().all(|d| *d == AckDecision::Ack),
            "{client} client: {decisions:?}"
        );
        let expected = if round == 1 { (100, 0) } else { (0, 100) };
        assert_eq!(
            (report.processed(), report.duplicates()),
            expected,
            "{client} client"
        );
    }
    let counts = effects(&server);
    assert_eq!(counts.len(), 100);
    assert!(counts.values().all(|count| *count == 1));
}

/// A message whose body always fails, delivered by a new client each time:
/// its attempts are counted across the rollbacks (each in a short
/// transaction of its own), the third is the last, and the message is then
/// dead: listed, skipped like a duplicate, revived, processed once.
#[test]
fn a_poison_message_is_counted_and_dead_lettered_through_transaction_pooling() {
    let Some((server, bouncer)) = spread() else {
        return;
    };
    let handler = HandlerName::new("pgbouncer.poison").unwrap();
    let deliver = |fails: bool| {
        let mut conn = through(&bouncer, CacheSize::Disabled);
        let key = ClaimKey::new(handler.clone(), "poison-1").unwrap();
        run_idempotent_with(&mut conn, key, MaxAttempts::limit(3), |conn| {
            if fails {
                return Err(InboxError::Database(
                    diesel::result::Error::RollbackTransaction,
                ));
            }
            insert_effect(conn, "poison-1")?;
            Ok(Outcome::Processed(()))
        })
    };
    for attempt in 1..=2 {
        let error = deliver(true).expect_err("the body fails");
        assert_eq!(
            ack_decision(&Err::<(), _>(error)),
            AckDecision::Retry,
            "attempt {attempt}"
        );
    }
    let last = deliver(true).expect_err("the third attempt fails for good");
    assert!(
        matches!(last, InboxError::AttemptsExhausted { attempts: 3, .. }),
        "{last:?}"
    );
    assert_eq!(deliver(false).unwrap(), Outcome::Duplicate, "dead: skipped");
    let mut conn = through(&bouncer, CacheSize::Disabled);
    let page = dead_letters::list(&mut conn, &handler, None, 10).unwrap();
    assert_eq!(page.letters.len(), 1, "{page:?}");
    assert_eq!(
        dead_letters::revive(&mut conn, &handler, ["poison-1"]).unwrap(),
        1
    );
    assert_eq!(deliver(false).unwrap(), Outcome::Processed(()));
    assert_eq!(effects(&server).get("poison-1"), Some(&1));
}

/// Pruning in batches through transaction pooling: every expired claim
/// (and failure record) goes, in batches, and the run is caught up.
#[test]
fn pruning_works_through_transaction_pooling() {
    let Some((server, bouncer)) = spread() else {
        return;
    };
    let mut direct = PgConnection::establish(&server.url()).expect("connect directly");
    direct
        .batch_execute(
            "INSERT INTO inbox_messages (handler, message_id, received_at) \
             SELECT 'pgbouncer.prune', 'old-' || n, now() - interval '30 days' \
             FROM generate_series(1, 1000) AS n; \
             INSERT INTO inbox_messages (handler, message_id) \
             SELECT 'pgbouncer.prune', 'new-' || n FROM generate_series(1, 10) AS n",
        )
        .expect("claims to prune");
    let policy = RetentionPolicy::new(Duration::from_secs(7 * 86_400), Duration::from_secs(86_400))
        .expect("a policy");
    let mut conn = through(&bouncer, CacheSize::Disabled);
    let report = Prune::new(policy)
        .batch_size(100)
        .run(&mut conn)
        .expect("a pruning run");
    assert_eq!(
        (report.rows_deleted, report.caught_up),
        (1000, true),
        "{report}"
    );
    assert!(report.batches >= 10, "{report}");
    assert_eq!(
        direct.bigint("SELECT COUNT(*) AS value FROM inbox_messages"),
        10,
        "only the claims inside the window are left"
    );
}

/// diesel-async through transaction pooling: tokio-postgres prepares each
/// statement by name and executes it in a second exchange, which a pooler
/// spreading transactions over its server connections sends elsewhere
/// when no transaction is open, so `establish` (its setup statements) or a
/// statement outside a transaction fails with "prepared statement … does
/// not exist"; a query error of that kind says `Reconnect`. What the
/// guide's PgBouncer chapter tells diesel-async users, pinned: if a
/// release of diesel-async stops doing it, this test fails and the chapter
/// is to be changed.
#[cfg(feature = "async")]
#[test]
fn diesel_async_outside_a_transaction_meets_missing_prepared_statements() {
    use diesel_async::{AsyncConnection, AsyncPgConnection};
    use inbox_runtime::{Recovery, recovery};

    let Some((_server, bouncer)) = spread() else {
        return;
    };
    let url = bouncer.url_of("postgres");
    let failures: Vec<String> = inbox_tests::runtime::current_thread().block_on(async {
        let mut failures = Vec::new();
        for _ in 0..10 {
            match AsyncPgConnection::establish(&url).await {
                Err(error) => failures.push(format!("establish: {error}")),
                Ok(mut conn) => {
                    conn.set_prepared_statement_cache_size(CacheSize::Disabled);
                    for _ in 0..3 {
                        let select = diesel::sql_query("SELECT 1");
                        let executed = diesel_async::RunQueryDsl::execute(select, &mut conn).await;
                        if let Err(error) = executed {
                            assert_eq!(recovery(&error), Recovery::Reconnect, "{error}");
                            failures.push(format!("statement: {error}"));
                        }
                    }
                }
            }
        }
        failures
    });
    println!("diesel-async outside a transaction, behind round robin: {failures:?}");
    assert!(
        failures
            .iter()
            .any(|failure| failure.contains("prepared statement")),
        "every establish and statement worked: {failures:?}"
    );
}
