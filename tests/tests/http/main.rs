//! `Idempotency-Key` over real HTTP: the service of `inbox_examples::http`
//! (axum, blocking Diesel on an r2d2 pool) on a free port of 127.0.0.1,
//! driven by a raw HTTP/1.1 client (`client.rs`), against a PostgreSQL
//! schema of each test's own. Every test asserts the responses (status,
//! body, `Idempotent-Replayed`, problem type) and the database after them:
//! the payment rows per key and the keys claimed in the inbox.
//!
//! - `sequential.rs`: key present or absent × same or different body, once
//!   the first request is done; invalid keys and bodies; a database that
//!   cannot be reached;
//! - `in_flight.rs`: retries while the first request is still in its
//!   transaction (it holds its claim: `Config::hold`), finishing within the
//!   claim wait (the replay, or 422) or not (409);
//! - `concurrent.rs`: N parallel requests with one key, with one body
//!   (one payment, identical 201s or 409s, no 5xx) and with different
//!   bodies (one payment, the others 422 or 409);
//! - `external_call.rs`: the service as another handler's payment
//!   provider: a consumer that dies after its call and before its commit
//!   calls again on each redelivery with the key `CallKey` derives, and is
//!   charged once (with a fresh key per call: once per delivery).
//!
//! PostgreSQL unreachable: each test prints the harness's `skipped:` line
//! and passes, unless `INBOX_REQUIRE_DATABASES=1`.
//!
//! Run: `cargo test -p inbox-tests --features http --test http`.
#![cfg(feature = "http")]
#![allow(missing_docs)]

mod client;
mod concurrent;
mod external_call;
mod in_flight;
mod sequential;
mod support;
