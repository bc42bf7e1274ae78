//! # inbox: idempotent message handlers on Diesel
//!
//! Brokers deliver at least once: after a retry, a timeout or a rebalance the
//! same message arrives again. The Inbox pattern turns that into exactly-once
//! *effects*: the handler records the producer-assigned message id in an inbox
//! table in the same database transaction as its effects, and a primary key on
//! the id makes a second delivery a no-op.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use diesel::prelude::*;
//! use inbox_runtime::{idempotent, Outcome};
//!
//! struct PaymentReceived { id: String, cents: i64 }
//!
//! #[idempotent(id = msg.id, handler = "billing.apply_payment")]
//! fn apply_payment(conn: &mut SqliteConnection, msg: &PaymentReceived) -> QueryResult<Outcome<i64>> {
//!     diesel::sql_query("UPDATE account SET cents = cents + ?")
//!         .bind::<diesel::sql_types::BigInt, _>(msg.cents)
//!         .execute(conn)?;
//!     Ok(Outcome::Processed(msg.cents))
//! }
//!
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! inbox_runtime::setup(&mut conn)?;
//! diesel::sql_query("CREATE TABLE account (cents BIGINT NOT NULL)").execute(&mut conn)?;
//! diesel::sql_query("INSERT INTO account VALUES (0)").execute(&mut conn)?;
//!
//! let msg = PaymentReceived { id: "pay-1".into(), cents: 250 };
//! assert_eq!(apply_payment(&mut conn, &msg)?, Outcome::Processed(250));
//! assert_eq!(apply_payment(&mut conn, &msg)?, Outcome::Duplicate); // redelivery: no effect
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## What the attribute does
//! `#[idempotent(id = <expr>)]` keeps the function's signature and wraps its
//! body in [`run_idempotent`]: one Diesel transaction that first claims
//! `(handler, id)` with a single `INSERT … ON CONFLICT DO NOTHING` (`INSERT
//! IGNORE` on MySQL). A duplicate skips the body; `Err` or a panic rolls the
//! claim back with everything else. Inside the body, the connection parameter
//! is the transaction's connection.
//!
//! Arguments:
//! - `id = msg.id` (or `id = "msg.id"`): the producer-assigned id. It must be
//!   rooted in a handler parameter other than the connection: `Uuid::new_v4()`,
//!   `now()`, literals and statics are compile errors, since a value the
//!   consumer makes up differs on every delivery; so are fields the broker
//!   sets per delivery (an AMQP `delivery_tag`, a JetStream
//!   `consumer_sequence`, a delivery count, a receive time, an SQS
//!   `receipt_handle`), and the error names the stable id to use instead.
//!   Its type must implement [`MessageId`]; an `Option` of an id is one,
//!   and `None` (a message without an id) fails with
//!   [`KeyProblem::Missing`], which is not retried.
//! - `handler = "billing.apply_payment"`: the deduplication scope. Defaults to
//!   the function's path; an explicit, stable name survives refactoring.
//!   Required on methods (a `self` receiver or `Self` in the signature),
//!   whose path would be shared with same-named methods of other types.
//! - `conn = name`: the connection parameter, by default the first `&mut`
//!   Diesel connection (else the first connection taken by value, else the
//!   first `&mut` parameter).
//! - `outside_transaction = name` (or `[a, b]`): a second connection or a
//!   pool the body may write through on purpose. Without it, a parameter
//!   whose type is a second Diesel connection or a pool, and `pool.get()` in
//!   the body, are compile errors: what is written through them is not part
//!   of the handler's transaction.
//! - `max_attempts = 3` (or `max_attempts = unbounded`): how many failed
//!   attempts a message gets before it is recorded as dead (see
//!   [`MaxAttempts`]; default [`default_max_attempts`]).
//! - `claim_wait = "2s"` (or `claim_wait = unbounded`): how long the claim
//!   waits for another delivery of the same id still in flight before the
//!   delivery fails with [`InboxError::InProgress`] (redeliver later; see
//!   [`ClaimWait`]; default [`default_claim_wait`]).
//! - `shared_scope`: this handler shares its scope with other handlers on
//!   purpose (versions of one handler, one handler for two connection
//!   types); without it, two handlers of one scope are refused at run time
//!   (see [`registry`]). Needs `handler = "…"`.
//! - `fingerprint = msg.body`: the message's payload, whose fingerprint is
//!   stored with the claim; a later delivery of the id with another payload
//!   fails with [`InboxError::Conflict`] instead of being skipped (text and
//!   bytes; with the `serde` feature any `Serialize` value; rooted in a
//!   message parameter, like `id`).
//! - `store_result` (feature `serde`): the body's result is stored with the
//!   claim and returned to later deliveries of the id without running the
//!   body; the handler returns `Result<`[`StoredOutcome<T>`](StoredOutcome)`, E>`.
//! - `crate = "path::to::inbox_runtime"`: for a renamed dependency.
//!
//! The handler returns `Result<R, E>` where `R` is `()` or [`Outcome<T>`]
//! (see [`OnDuplicate`]) and `E` is a [`HandlerError`] (a
//! `std::error::Error` that takes Diesel's and the inbox's errors).
//!
//! ## Poison messages
//! A body that fails (its own error, or a panic) is rolled back, and the
//! failed attempt is counted in a short transaction of its own; after
//! `max_attempts` the message is recorded as dead and later deliveries skip
//! it. [`InboxError::rejected`] makes a message dead at once (a business
//! rejection). [`dead_letters`] lists, revives and purges dead messages.
//! [`ack_decision`] turns a handler's result into the broker's decision:
//! ack, retry, or dead-letter.
//!
//! ## Batches
//! [`run_idempotent_batch`] handles a batch of messages (what Kafka, NATS
//! and SQS consumers receive) in one transaction, with one statement claiming
//! every id, and reports a result per message; a failing message is split
//! out and handled alone, so the others commit.
//! [`run_idempotent_batch_bulk`] gives one body all the new messages (one
//! statement can write every effect). `run_idempotent_batch_async` and
//! `run_idempotent_batch_bulk_async` are the same on diesel-async
//! connections.
//!
//! ## Errors
//! [`InboxError::recovery`] and [`recovery`] (for a plain
//! `diesel::result::Error`) tell a consumer whether to redeliver on the same
//! connection ([`Recovery::Retry`]), replace the connection first
//! ([`Recovery::Reconnect`]), or dead-letter the message
//! ([`Recovery::Never`]). A panic at any depth of the body, a failed
//! statement whose error the body ignored (PostgreSQL), and a transaction the
//! database rolled back behind the handler's back never end in `Ok`: see
//! [`run_idempotent`].
//!
//! ## What it does not do
//! It protects effects written through the transaction's connection: not
//! what is written through a second connection or a pool, nor the work of a
//! handler called on connection `b` inside a transaction on `a`. A call
//! to another system from the body (HTTP, e-mail, a second database) is not
//! rolled back and may be repeated after a failure: pass the message id to it
//! as an idempotency key. The inbox does not make the broker exactly-once
//! either: acknowledge after the handler returns, and keep ids longer than the
//! broker's longest redelivery window.
//!
//! ## Async handlers
//! With the `async` feature, `#[idempotent]` on an `async fn` runs on
//! diesel-async connections (and deadpool / bb8 pools) with the same
//! semantics; see [`run_idempotent_async`] for the steps and what a cancelled
//! handler future leaves behind.
//!
//! ## Features
//! `postgres`, `sqlite`, `mysql` (backends), `r2d2` (pooled connections),
//! `uuid` ([`MessageId`] for `uuid::Uuid`), `lapin` and `async-nats`
//! ([`MessageId`] for lapin's `ShortString` and async-nats' `HeaderValue`,
//! the types of the AMQP `message_id` property and of the JetStream
//! `Nats-Msg-Id` header), `outbox-lapin` and `outbox-nats` (the outbox's
//! publishers: [`outbox::LapinPublisher`] for RabbitMQ,
//! [`outbox::JetStreamPublisher`] for NATS JetStream), `serde`
//! (fingerprints of any `Serialize` payload, stored results,
//! `OutgoingMessage::json`), `migrations` (embedded Diesel
//! migrations), `async` (diesel-async handlers), `async-postgres`,
//! `async-mysql` (`async` with the backend and diesel-async's driver for it),
//! `deadpool`, `bb8` (its pools),
//! `tokio` (the background pruner and outbox relay as tokio tasks),
//! `partitioned`
//! (PostgreSQL's generation layout, `prune::partitioned`), `log` (pruner
//! runs and relay rounds through the `log` facade), `tracing` (a span per delivery and
//! events through `tracing`) and `metrics` (counters and histograms through
//! the `metrics` facade): see [`observe`] for every span field, event and
//! metric. `testing` adds `inbox_runtime::testing`: a check, for your own
//! tests, that a handler is idempotent.
//!
//! ## Retention
//! [`RetentionPolicy`] and [`Prune`] forget ids older than a window in short
//! batches; see [`prune`] for the background pruners and, on PostgreSQL
//! (feature `partitioned`), the generation layout that drops whole
//! partitions. [`retention`] also parses and formats the durations of
//! configuration files (`7d`, `36h`).

#![cfg_attr(docsrs, feature(doc_cfg))]
// A link to an item behind a feature a build lacks cannot resolve there
// (`LapinPublisher` in a build without `outbox-lapin`). Links are checked
// where every item exists: the docs.rs build (`--cfg docsrs`, every
// feature), which CI runs with `-D warnings`; a build with fewer features
// shows such a link as text, and warns of nothing else either (CI builds
// each backend's docs alone with `-D warnings`).
#![cfg_attr(not(docsrs), allow(rustdoc::broken_intra_doc_links))]

extern crate self as inbox_runtime;

mod ack;
mod attempts;
mod backend;
#[cfg(any(feature = "r2d2", feature = "tokio"))]
pub mod background;
mod backoff;
mod batch;
mod call_key;
mod claim;
pub mod dead_letters;
mod delivery;
mod digest;
mod duration;
mod error;
mod execution;
mod failure;
pub mod fingerprint;
mod key;
#[cfg(test)]
mod layering;
mod message_id;
pub mod observe;
mod options;
pub mod outbox;
mod outcome;
pub mod prune;
mod recovery;
pub mod registry;
pub mod retention;
mod scope;
mod stored;
mod text;

#[cfg(feature = "migrations")]
pub mod migrations;
pub mod schema;
#[cfg(feature = "testing")]
pub mod testing;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

/// Makes a Diesel message handler idempotent; see the [crate documentation](crate).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::idempotent;
///
/// struct Shipped { order_id: u64 }
///
/// #[idempotent(id = msg.order_id, handler = "shipping.on_shipped")]
/// fn on_shipped(conn: &mut SqliteConnection, msg: &Shipped) -> QueryResult<()> {
///     Ok(())
/// }
/// # }
/// ```
pub use inbox_macros::idempotent;

pub use ack::{AckDecision, Acknowledge, ack_decision};
pub use attempts::MaxAttempts;
pub use backend::InboxBackend;
pub use backoff::Backoff;
pub use batch::{
    BatchReport, MAX_BATCH_MESSAGES, run_idempotent_batch, run_idempotent_batch_bulk,
    run_idempotent_batch_bulk_with, run_idempotent_batch_with,
};
#[cfg(feature = "async")]
pub use batch::{
    run_idempotent_batch_async, run_idempotent_batch_async_with, run_idempotent_batch_bulk_async,
    run_idempotent_batch_bulk_async_with,
};
pub use call_key::CallKey;
pub use claim::Claim;
#[doc(hidden)]
pub use claim::ClaimStatement;
#[cfg(feature = "async")]
#[doc(hidden)]
pub use delivery::asynchronous::begin_claimed;
#[cfg(feature = "async")]
pub use delivery::asynchronous::{
    ClaimedTransaction, claim_async, run_idempotent_async, run_idempotent_async_storing,
    run_idempotent_async_with,
};
pub use delivery::blocking::{claim, run_idempotent, run_idempotent_storing, run_idempotent_with};
pub use error::{
    HandlerError, InboxError, KeyProblem, OutgoingProblem, PayloadConflict, Recovery,
    RetentionProblem, StoredResultProblem,
};
pub use execution::CLAIM_ATTEMPTS;
pub use fingerprint::{Fingerprint, Fingerprinted};
pub use key::{ClaimKey, HandlerName, MAX_HANDLER_BYTES, MAX_MESSAGE_ID_BYTES};
pub use message_id::MessageId;
pub use options::{
    ClaimWait, Options, default_claim_wait, default_max_attempts, set_default_claim_wait,
    set_default_max_attempts,
};
#[cfg(feature = "async")]
pub use options::{
    DEFAULT_ABANDONED_TRANSACTION_TIMEOUT, abandoned_transaction_timeout,
    set_abandoned_transaction_timeout,
};
pub use outcome::{OnDuplicate, Outcome, StoredOutcome};
pub use prune::{Prune, PruneError, PruneReport};
pub use recovery::{is_lock_conflict, recovery};
pub use retention::{MAX_RETENTION, RetentionPolicy};
pub use schema::setup;
pub use stored::{MAX_STORED_RESULT_BYTES, StoredResult};
pub use text::MAX_ERROR_TEXT_BYTES;
