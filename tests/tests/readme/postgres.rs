//! The README's example against a real PostgreSQL server.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_tests::{Postgres, TestBackend};

use crate::first_example::{PaymentReceived, accounts, apply_payment};

#[test]
fn the_readme_example_applies_a_payment_once() {
    let Some(db) = Postgres::open() else {
        return;
    };
    let mut conn = db.connect();
    conn.batch_execute(
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
         INSERT INTO accounts VALUES (7, 100);",
    )
    .expect("create the accounts table");
    let payment = PaymentReceived {
        id: "pay-1".to_owned(),
        account: 7,
        amount: 25,
    };
    apply_payment(&mut conn, &payment).expect("the first delivery");
    apply_payment(&mut conn, &payment).expect("the redelivery is a no-op");
    let balance: i64 = accounts::table
        .find(7)
        .select(accounts::balance)
        .get_result(&mut conn)
        .expect("read the balance");
    assert_eq!(balance, 125, "applied exactly once");
    let empty_id = PaymentReceived {
        id: String::new(),
        account: 7,
        amount: 25,
    };
    match apply_payment(&mut conn, &empty_id) {
        Err(crate::first_example::AppError::Inbox(error)) => assert!(!error.is_retryable()),
        other => panic!("an empty id is an invalid message, got {other:?}"),
    }
    conn.batch_execute("DROP TABLE accounts")
        .expect("drop the accounts table");
    let second = PaymentReceived {
        id: "pay-2".to_owned(),
        ..payment
    };
    match apply_payment(&mut conn, &second) {
        Err(crate::first_example::AppError::Db(error)) => {
            assert_eq!(
                inbox_runtime::recovery(&error),
                inbox_runtime::Recovery::Retry
            )
        }
        other => panic!("a database error, got {other:?}"),
    }
}
