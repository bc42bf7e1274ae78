//! An HTTP service whose `POST /payments` honours the `Idempotency-Key`
//! request header (feature `http`): axum on hyper's HTTP/1.1 server, blocking
//! Diesel on an r2d2 pool of PostgreSQL connections inside
//! `tokio::task::spawn_blocking`.
//!
//! It follows the IETF httpapi draft "The Idempotency-Key HTTP Header Field"
//! (draft-ietf-httpapi-idempotency-key-header, an Internet-Draft, not an
//! RFC) and Stripe's semantics. The whole of the idempotency is one
//! attribute on the handler that creates the payment,
//! [`payments::create_payment`]:
//!
//! ```text
//! #[idempotent(id = req.key, handler = "http.create_payment", fingerprint = req.body, store_result, …)]
//! ```
//!
//! One transaction claims the key in `inbox_messages` together with the
//! SHA-256 fingerprint of the raw body bytes, inserts the payment, and
//! stores the response (status and JSON body) with the claim; they commit
//! together or not at all.
//!
//! | request | response |
//! |---|---|
//! | new key | `201` with the payment, stored with the key |
//! | same key, same body, first request done | the stored response (same status, same body bytes) and `Idempotent-Replayed: true` |
//! | same key, different body (byte for byte) | `422`, problem `idempotency-key-reused`; nothing runs |
//! | same key while the first request is in flight | the claim waits for it, up to [`Config::claim_wait`] (2 s, the handler's `claim_wait`); the replay (or `422`) if the first finishes meanwhile, else the runtime's `InProgress`, answered `409` `request-in-progress` with `Retry-After: 1` |
//! | no `Idempotency-Key` | `400` `idempotency-key-missing` |
//! | an empty key, one over 255 bytes, a repeated or malformed header | `400` `idempotency-key-invalid` |
//! | a body that is not a payment request (JSON syntax, types, fields) | `400` `malformed-request`; the key is not claimed |
//! | a payment the service refuses (account not 1–64 characters, amount not 1 to [`MAX_AMOUNT_CENTS`](payments::MAX_AMOUNT_CENTS), currency not three uppercase letters) | `422` `invalid-payment`; the key is not claimed |
//! | a body over [`MAX_BODY_BYTES`](server::MAX_BODY_BYTES) (16 KiB) | `413`, axum's own answer; the key is not claimed |
//! | a used key whose response cannot be replayed (claimed by something other than this handler, no response stored; or stored by another version of the service, no longer readable) | `409` `idempotency-key-used`; nothing runs again |
//! | no database connection, a connection lost before the commit | `503` `database-unavailable` with `Retry-After: 1`; nothing committed |
//! | a connection lost during the commit | `503` `database-unavailable` with `Retry-After: 1`; the outcome is unknown: a retry with the same key replays the payment or makes it |
//!
//! Validation failures are not stored: they happen before the claim, so a
//! corrected request may reuse the key (Stripe likewise saves no result
//! when a request fails validation before the endpoint starts executing).
//! A failure inside the transaction rolls the claim back with the payment:
//! the key stays free, and the retry runs anew (the handler's
//! `max_attempts = unbounded`: the client decides how often to retry, and
//! a key is never recorded as dead).
//!
//! Errors are `application/problem+json` (RFC 9457) with a `type` of
//! `/problems/<slug>`.

pub mod key;
pub mod payments;
pub mod problem;
pub mod server;

pub use self::payments::{create_payment, CreatePayment, HANDLER};
pub use self::server::{Config, PaymentsService, Server};

/// Any error of the setup.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
