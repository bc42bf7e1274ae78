//! The transactional outbox: what a handler sends, recorded in its own
//! transaction and published after the commit, so that a chain of services
//! is exactly-once hop by hop.
//!
//! The inbox makes a handler's database effects happen once. A handler
//! that also *sends* (an event for the next service, a reply, a command)
//! has no safe place to publish from: inside the body, a rollback or a
//! redelivery publishes again and a message can announce an effect that
//! never committed; after the commit, a crash in between loses it. The
//! outbox records the message in the handler's transaction instead:
//!
//! - [`send`] / [`send_async`]: inside the transaction (an `#[idempotent]`
//!   body's, or any Diesel transaction), the message is written to
//!   `inbox_outbox` with an id of its own ([`OutboxId`], time-ordered). It
//!   commits with the claim and the body's writes, or vanishes with them.
//! - [`Relay`]: publishes committed messages through a [`Publisher`]
//!   ([`BlockingPublisher`]), marks them sent once the broker confirmed
//!   them, retries what the broker refused and gives up on it after a
//!   bound ([`dead`], [`revive`], [`discard`]). Several relays share the
//!   work; messages with the same ordering key are published in commit
//!   order.
//! - [`BackgroundRelay`]: the relay on a thread or a tokio task, woken on
//!   commit on PostgreSQL ([`wake_on_commit`](BackgroundRelay::wake_on_commit));
//!   [`LapinPublisher`] and [`JetStreamPublisher`] publish to RabbitMQ and
//!   NATS JetStream (features `outbox-lapin`, `outbox-nats`).
//! - The consumer of the next hop deduplicates by the message's id (its
//!   own inbox, or the broker's duplicate window): a relay killed between
//!   the broker's confirmation and its mark publishes the message again,
//!   under the same id.
//!
//! The schema (`inbox_outbox`, `inbox_outbox_keys`) comes with
//! [`setup`](crate::setup) and the migrations, beside the inbox's.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use diesel::prelude::*;
//! use inbox_runtime::outbox::{self, OutgoingMessage};
//!
//! #[inbox_runtime::idempotent(id = payment_id, handler = "docs.outbox")]
//! fn apply_payment(
//!     conn: &mut SqliteConnection,
//!     payment_id: &str,
//! ) -> Result<(), inbox_runtime::InboxError> {
//!     // … the ledger's writes …
//!     let receipt = OutgoingMessage::new("receipts", payment_id).ordering_key("account-1");
//!     outbox::send(conn, &receipt)?;
//!     Ok(())
//! }
//!
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! inbox_runtime::setup(&mut conn)?;
//! apply_payment(&mut conn, "p-1")?;
//! apply_payment(&mut conn, "p-1")?; // a redelivery: a duplicate, nothing recorded
//! assert_eq!(outbox::backlog(&mut conn)?.pending, 1);
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod continuing;
mod dead;
mod headers;
mod id;
mod message;
#[cfg(feature = "postgres")]
mod notify;
mod publisher;
mod publishers;
mod relay;
mod runner;
mod trace;
mod write;

pub use continuing::{Traceparent, continuing, continuing_async};
pub use dead::{Backlog, DeadMessage, backlog, dead, discard, revive};
pub use id::OutboxId;
pub use message::{MAX_HEADER_VALUE_BYTES, MAX_NAME_BYTES, OutgoingMessage};
#[cfg(feature = "postgres")]
pub use notify::{disable_commit_notifications, enable_commit_notifications};
pub use publisher::{BlockingPublisher, OutboxMessage, PublishError, Publisher};
#[cfg(feature = "outbox-nats")]
pub use publishers::JetStreamPublisher;
#[cfg(feature = "outbox-lapin")]
pub use publishers::LapinPublisher;
#[doc(hidden)]
pub use relay::lease_statement;
pub use relay::{MAX_RELAY_BATCH, Relay, RelayReport};
pub use runner::{BackgroundRelay, RelayRound, RelayRoundError};
pub use write::send;
#[cfg(feature = "async")]
pub use write::send_async;
