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
//! Its arguments (`id`, `handler`, `conn`, `outside_transaction`,
//! `max_attempts`, `claim_wait`, `fingerprint`, `store_result`,
//! `shared_scope`, `crate`) and the return types it accepts are documented
//! in one place: [`idempotent`].
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
mod short_text;
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

/// Makes a Diesel message handler idempotent (the Inbox pattern).
///
/// The attribute keeps the function's signature and rewrites its body so it
/// runs inside one Diesel transaction that first claims `(handler, id)` in
/// the inbox table ([`run_idempotent`], or [`run_idempotent_async`] for an
/// `async fn`). A duplicate delivery skips the body; an `Err` or a panic
/// rolls everything back, the claim included, so the redelivery is
/// processed again. This page is the reference of its arguments; the
/// semantics are in the [crate documentation](crate) and the guide
/// (`docs/src/` in the repository).
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
///
/// # Arguments
///
/// Arguments are `name = value`, separated by commas, except the flags
/// `store_result` and `shared_scope`; each may be given once. Unknown,
/// repeated or malformed arguments are compile errors, all mistakes of one
/// attribute reported together.
///
/// ```ignore
/// #[idempotent(id = msg.id)]
/// #[idempotent(id = "msg.envelope.message_id", handler = "billing.apply_payment")]
/// #[idempotent(id = format!("{}:{}", msg.producer, msg.sequence), conn = tx)]
/// #[idempotent(id = msg.id, handler = "orders.reserve", max_attempts = 3, claim_wait = "500ms")]
/// #[idempotent(id = req.key, handler = "billing.charge", fingerprint = req.body, store_result)]
/// #[idempotent(id = msg.id, handler = "shipping.cancel", shared_scope)]
/// #[idempotent(id = msg.id, outside_transaction = [audit, pool])]
/// #[idempotent(id = msg.id, crate = "my_reexport::inbox_runtime")]
/// ```
///
/// - **`id = <expression>`** (required; quoted or not: `id = msg.id` and
///   `id = "msg.id"` are the same): the producer-assigned message id, the
///   same on every delivery of one message. It must be rooted in a handler
///   parameter other than the connection: `msg.id`, `msg.id()`,
///   `msg.headers["id"]`, `format!("{}:{}", msg.a, msg.b)`. Compile errors:
///   a value the consumer makes up (`Uuid::new_v4()`, `now()`,
///   `rand::random()`, a literal, a `static` or `const`), an id taken from
///   the connection parameter, and a field the broker sets per delivery (an
///   AMQP `delivery_tag` or `redelivered`, a JetStream `consumer_sequence`
///   or the `delivered` count of `info()`, a delivery count such as
///   `delivery_count`, `redelivery_count`, `num_delivered`,
///   `delivery_attempt`, `receive_count` or `approximate_receive_count`, a
///   receive time such as `received_at`, `receive_time`, `received_time`,
///   `receive_timestamp` or `received_timestamp`, an acknowledgement handle
///   such as `receipt_handle`, `lock_token` or `ack_id`), whose error names
///   the stable id to use instead; names that may be stable (`timestamp`,
///   `offset`, `attempt`) are not refused. Its type must implement
///   [`MessageId`]: strings, UTF-8 bytes, integers, `uuid::Uuid` (feature
///   `uuid`), lapin's `ShortString` (feature `lapin`, so
///   `id = delivery.properties.message_id()` works), async-nats'
///   `HeaderValue` (feature `async-nats`), and `Option`s of them; a type that
///   cannot be a message id (`f64`, a struct) is a compile error. The
///   expression is evaluated once, before the transaction. At run time a
///   `None` id ([`KeyProblem::Missing`]), bytes that are not UTF-8
///   ([`KeyProblem::NotUtf8`]), an empty id, one longer than
///   [`MAX_MESSAGE_ID_BYTES`] (255) or one with a NUL character fail with
///   [`InboxError::InvalidMessageId`] before any transaction: nothing is
///   written, the body does not run, and [`ack_decision`] dead-letters it.
/// - **`handler = "<name>"`**: the deduplication scope, a string literal:
///   two handlers that receive the same message each process it once.
///   Default: the function's path, `module_path!()` and its name. **Required
///   on methods** (a `self` receiver, or `Self` anywhere in the signature):
///   `impl A { fn handle }` and `impl B { fn handle }` in one module would
///   share that default and skip each other's messages, so the attribute
///   refuses to guess. Name associated functions without `self` too: the
///   attribute cannot tell them from free functions. Prefer an explicit,
///   stable name for long-lived services: renaming or moving the function
///   otherwise changes the scope, and the ids claimed under the old one are
///   forgotten. An empty name, one over [`MAX_HANDLER_BYTES`] (255) or one
///   with a NUL character is a compile error. Two handlers declaring one
///   scope are refused at run time ([`InboxError::SharedScope`]) unless all
///   of them say `shared_scope`; see [`registry`].
/// - **`conn = <parameter>`**: the connection parameter. Default: the first
///   `&mut` parameter whose type is a Diesel connection (`&mut PgConnection`,
///   `&mut PooledConnection<..>`, `&mut C` with `C: Connection`), else the
///   first connection taken by value (r2d2's or bb8's `PooledConnection<..>`,
///   deadpool's `Object<..>`), else the first `&mut` parameter of another
///   type. The attribute judges by the type's name: behind a type alias with
///   another name (`conn: Conn` by value), say `conn = conn`. A `conn = …`
///   that names no parameter is a compile error. Inside the body the
///   parameter is `&mut` to the transaction's connection, also when the
///   function takes it by value: write `.execute(conn)`, not
///   `.execute(&mut conn)`.
/// - **`outside_transaction = <name>`** or **`= [<name>, …]`**: the
///   parameters, or pools the body takes connections from, that are meant to
///   reach outside the handler's transaction. Without it, a parameter whose
///   type is a second Diesel connection or a pool (`&mut PgConnection`,
///   `AsyncPgConnection`, `PooledConnection<..>`, deadpool's `Object<..>`,
///   `&Pool<..>`, `&DbPool`, also inside `Arc`, `Box` or `Mutex`), and
///   `pool.get()` (or `self.pool.get()`, `POOL.get()`) in the body, are
///   compile errors: what is written through them commits on its own, is not
///   rolled back when the handler fails, and is written again on a
///   redelivery. Each name must be a parameter, or a pool the body calls
///   `.get()` on. The check judges by names: a pool behind a type alias or a
///   struct with another name (`type Pools = Pool<..>`, `state: &AppState`),
///   code inside macro calls in the body, and helper functions that open a
///   connection of their own are not seen.
/// - **`max_attempts = <n>`** or **`max_attempts = unbounded`**: how many
///   failed attempts a message gets before it is recorded as dead: a whole
///   number from 1 (it must fit in a `u32`; 0 is a compile error) or
///   `unbounded`. Default: [`default_max_attempts`], 5 unless
///   [`set_default_max_attempts`] changed it. See [`MaxAttempts`] and
///   [`dead_letters`].
/// - **`claim_wait = "<duration>"`**, **`claim_wait = unbounded`** or
///   **`claim_wait = <expression>`**: how long the claim waits for another
///   delivery of the same id that is still in flight. A duration is a whole
///   number of `ms`, `s` or `m` (`"500ms"`, `"2s"`, `"1m"`); `unbounded`
///   waits for the first delivery to end; any other expression is a
///   [`ClaimWait`] evaluated on each delivery (a setting of the service's:
///   `claim_wait = req.claim_wait`). Past the wait the delivery fails with
///   [`InboxError::InProgress`]: nothing ran, nothing is counted, and
///   [`ack_decision`] says `RetryLater`. Default: [`default_claim_wait`],
///   2 s unless [`set_default_claim_wait`] changed it.
/// - **`fingerprint = <expression>`**: the message's payload
///   (`fingerprint = msg.body`). Its [`Fingerprint`] is stored with the
///   claim, and a later delivery of the same id with a different payload
///   fails with [`InboxError::Conflict`] (dead-letter; the body does not
///   run) instead of being skipped as a duplicate. Text and bytes (`&str`,
///   `String`, `&[u8]`, `Vec<u8>`); with the `serde` feature, any
///   `serde::Serialize` value (see [`fingerprint`] for the encoding). Like
///   `id`, it must be rooted in a message parameter and not be a
///   per-delivery field.
/// - **`trace = <expression>`**: the incoming message's W3C trace context
///   header (`trace = msg.traceparent`: `&str`, `String` or an `Option` of
///   one, see [`outbox::Traceparent`]). Every message the body records
///   through the outbox that names no trace of its own continues that
///   trace, with a span of its own (the body runs in
///   [`outbox::continuing`], or [`outbox::continuing_async`]). A missing
///   or invalid header continues nothing.
/// - **`store_result`** (a flag, no value; feature `serde`): the body's
///   result is stored with the claim (as JSON, at most
///   [`MAX_STORED_RESULT_BYTES`]) and returned to later deliveries of the id
///   without running the body. The return type is then
///   `Result<`[`StoredOutcome<T>`](StoredOutcome)`, E>` with
///   `T: Serialize + DeserializeOwned`.
/// - **`shared_scope`** (a flag, no value; needs `handler = "…"`, else a
///   compile error): this handler shares its scope with other handlers on
///   purpose (versions of one handler, one handler written for two
///   connection types). Without it, two handlers declaring one scope are
///   refused at run time with [`InboxError::SharedScope`].
/// - **`crate = "<path>"`** (quoted or not): the path to `inbox_runtime`,
///   for a renamed or re-exported dependency.
///
/// # The function
///
/// A free function, a method (`&self`, `&mut self`, with `handler = "…"`),
/// a trait method implementation (the signature is kept), a generic handler
/// (`C: diesel::connection::LoadConnection` with `C::Backend:`
/// [`InboxBackend`]), or, with the `async` feature, an `async fn` on a
/// diesel-async connection (`#[async_trait]` methods are refused: write the
/// trait with a native `async fn`). On `AsyncPgConnection` named as such,
/// the `BEGIN` is sent in one flight with the claim (see
/// `run_idempotent_async`). It returns `Result<R, E>`:
///
/// - `R = ()`: a duplicate returns `Ok(())`.
/// - `R = `[`Outcome<T>`](Outcome): the body returns
///   `Ok(Outcome::Processed(value))` (or `Ok(value.into())`), a duplicate
///   returns `Ok(Outcome::Duplicate)`.
/// - `R = `[`StoredOutcome<T>`](StoredOutcome), with `store_result`.
/// - Any other `R` is a compile error: a skipped body has no value to
///   return (see [`OnDuplicate`]).
/// - `E` must be a [`HandlerError`]: `std::error::Error + 'static`,
///   `From<diesel::result::Error>` and `From<`[`InboxError`]`>`;
///   `diesel::result::Error` itself qualifies ([`InboxError::find_in`]
///   recovers the inbox error). The runtime and [`ack_decision`] look for the
///   inbox's and Diesel's errors along the error's `source()` chain: wrap
///   them with thiserror's `#[from]` (plain or `#[error(transparent)]`) or
///   return them from `source()`.
///
/// Other compile errors: no connection parameter; a connection held by
/// shared reference (`conn: &PgConnection`); a pool where the connection
/// should be; an owned parameter that may be a connection behind a type
/// alias (name it with `conn = …`); a connection type that is not a Diesel
/// connection of a supported backend; a return type that is not `Result`;
/// an error type that cannot carry inbox errors; a `const fn`; an
/// `async fn` without the `async` feature.
pub use inbox_macros::idempotent;

pub use ack::{AckDecision, Acknowledge, ack_decision};
pub use attempts::MaxAttempts;
pub use backend::InboxBackend;
#[cfg(feature = "postgres")]
#[doc(hidden)]
pub use backend::postgres::PipelinedClaimStatement;
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
