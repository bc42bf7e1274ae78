//! The README's first example, as written: it compiles without a warning
//! (this file denies them), and it does what the README says against a real
//! PostgreSQL server. `tests/readme/first_example.rs` is that block of the
//! README, character for character (checked below).
#![cfg(feature = "postgres")]
#![deny(warnings)]

mod first_example;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use first_example::{accounts, apply_payment, PaymentReceived};
use inbox_tests::TestBackend as _;

#[test]
fn the_readme_shows_the_example_file_verbatim() {
    let readme = include_str!("../../../README.md");
    let block = readme
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README's first rust block");
    assert_eq!(block, include_str!("first_example.rs"));
}

#[test]
fn the_readme_example_applies_a_payment_once() {
    let Some(db) = inbox_tests::Postgres::open() else {
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
        Err(first_example::AppError::Inbox(error)) => assert!(!error.is_retryable()),
        other => panic!("an empty id is an invalid message, got {other:?}"),
    }
    conn.batch_execute("DROP TABLE accounts")
        .expect("drop the accounts table");
    let second = PaymentReceived {
        id: "pay-2".to_owned(),
        ..payment
    };
    match apply_payment(&mut conn, &second) {
        Err(first_example::AppError::Db(error)) => {
            assert_eq!(
                inbox_runtime::recovery(&error),
                inbox_runtime::Recovery::Retry
            )
        }
        other => panic!("a database error, got {other:?}"),
    }
}
