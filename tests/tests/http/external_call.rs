//! A handler whose body calls another service: the example's payment
//! service stands in for a payment provider. The consumer's own handler
//! (`shop.settle`, on a PostgreSQL schema of its own) charges the order
//! through `POST /payments` with an `Idempotency-Key` derived by
//! `CallKey` from its scope, the order's id and the step, then records the
//! provider's payment id in its transaction. It dies after the call and
//! before its commit (a panic; its connection killed under it); each
//! redelivery calls again with the same key, and the provider answers with
//! the first call's payment: one charge, recorded once. The control: the
//! same deliveries with a fresh key per call charge three times.

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_runtime::{CallKey, InboxError, Outcome, idempotent};
use inbox_tests::{Postgres, SqlRows, TestBackend};

use crate::client::Response;
use crate::support::{Service, payment};

diesel::table! {
    shop_orders (order_id) {
        order_id -> Text,
        provider_payment -> BigInt,
    }
}

/// What the body does after the provider answered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum After {
    Commit,
    Panic,
    LoseConnection,
}

#[derive(Debug, thiserror::Error)]
enum ShopError {
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
    #[error(transparent)]
    Inbox(#[from] InboxError),
}

struct Order {
    id: String,
    account: String,
    cents: i64,
}

/// How the body keys its call: derived (the fix) or fresh per call (the
/// mistake).
#[derive(Clone, Copy)]
enum Keys {
    Derived,
    Fresh,
}

#[idempotent(id = order.id, handler = "shop.settle")]
fn settle(
    conn: &mut PgConnection,
    order: &Order,
    provider: &Service,
    keys: Keys,
    after: After,
    calls: &RefCell<Vec<Response>>,
) -> Result<Outcome<()>, ShopError> {
    let key = match keys {
        Keys::Derived => CallKey::of("shop.settle", &order.id, "charge")?.to_string(),
        Keys::Fresh => uuid::Uuid::new_v4().to_string(),
    };
    let response = provider.post(Some(&key), &payment(&order.account, order.cents));
    assert_eq!(response.status, 201, "{}", response.body);
    let payment_id: i64 = response
        .body
        .split("\"id\":")
        .nth(1)
        .and_then(|rest| rest.split([',', '}']).next())
        .and_then(|id| id.trim().parse().ok())
        .expect("the payment's id");
    calls.borrow_mut().push(response);
    diesel::insert_into(shop_orders::table)
        .values((
            shop_orders::order_id.eq(&order.id),
            shop_orders::provider_payment.eq(payment_id),
        ))
        .execute(conn)?;
    match after {
        After::Commit => {}
        After::Panic => panic!("deliberate: the consumer dies after the call"),
        After::LoseConnection => {
            // The server ends this very connection: the commit cannot come.
            let _ = conn.batch_execute("SELECT pg_terminate_backend(pg_backend_pid())");
        }
    }
    Ok(Outcome::Processed(()))
}

/// Delivers `order` three times: dying after the call (a panic), losing
/// the connection after the call, then committing; then once more (a
/// duplicate). Returns the provider's responses.
fn deliver_until_committed(
    db: &Postgres,
    provider: &Service,
    order: &Order,
    keys: Keys,
) -> Vec<Response> {
    let calls = RefCell::new(Vec::new());
    let mut conn = db.connect();
    let died = catch_unwind(AssertUnwindSafe(|| {
        settle(&mut conn, order, provider, keys, After::Panic, &calls)
    }));
    assert!(died.is_err(), "the first delivery dies after its call");

    let mut conn = db.connect();
    let lost = settle(
        &mut conn,
        order,
        provider,
        keys,
        After::LoseConnection,
        &calls,
    );
    assert!(
        lost.is_err(),
        "the second delivery loses its connection: {lost:?}"
    );

    let mut conn = db.connect();
    let outcome = settle(&mut conn, order, provider, keys, After::Commit, &calls).unwrap();
    assert_eq!(outcome, Outcome::Processed(()));
    let outcome = settle(&mut conn, order, provider, keys, After::Commit, &calls).unwrap();
    assert_eq!(outcome, Outcome::Duplicate, "a duplicate calls nobody");
    calls.into_inner()
}

fn shop(db: &Postgres) {
    db.connect()
        .batch_execute(
            "CREATE TABLE shop_orders (order_id TEXT PRIMARY KEY, provider_payment BIGINT NOT NULL)",
        )
        .unwrap();
}

#[test]
fn a_redelivered_call_with_its_derived_key_charges_once() {
    inbox_tests::quiet_deliberate_panics();
    let Some(provider) = Service::start() else {
        return;
    };
    let Some(db) = Postgres::open() else { return };
    shop(&db);
    let order = Order {
        id: "order-7".into(),
        account: "acct-1".into(),
        cents: 4_200,
    };
    let calls = deliver_until_committed(&db, &provider, &order, Keys::Derived);
    assert_eq!(calls.len(), 3, "three deliveries ran the body");
    let key = CallKey::of("shop.settle", "order-7", "charge").unwrap();
    assert_eq!(provider.payments(key.as_str()), 1, "one charge");
    assert_eq!(provider.all_payments(), 1);
    assert_eq!(
        calls[0].header("idempotent-replayed"),
        None,
        "the first call charged"
    );
    for replay in &calls[1..] {
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
        assert_eq!(replay.body, calls[0].body, "the first call's payment");
    }
    let recorded = db
        .connect()
        .bigints("SELECT provider_payment AS value FROM shop_orders");
    assert_eq!(recorded.len(), 1, "the order settled once");
    assert!(calls[0].body.contains(&format!("\"id\":{}", recorded[0])));
}

#[test]
fn the_control_a_fresh_key_per_call_charges_every_delivery() {
    inbox_tests::quiet_deliberate_panics();
    let Some(provider) = Service::start() else {
        return;
    };
    let Some(db) = Postgres::open() else { return };
    shop(&db);
    let order = Order {
        id: "order-8".into(),
        account: "acct-1".into(),
        cents: 4_200,
    };
    let calls = deliver_until_committed(&db, &provider, &order, Keys::Fresh);
    assert_eq!(calls.len(), 3);
    assert_eq!(provider.all_payments(), 3, "every delivery charged again");
    assert_eq!(
        db.connect()
            .bigint("SELECT count(*) AS value FROM shop_orders"),
        1
    );
}
