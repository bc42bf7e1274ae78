//! The transactional outbox (`inbox_runtime::outbox`) against real
//! databases: PostgreSQL, MariaDB/MySQL and SQLite.
//!
//! - `write`: a message is recorded in the caller's transaction and gone
//!   with its rollback; refused outside a transaction and when malformed,
//!   with nothing written; an `#[idempotent]` handler's duplicate and failed
//!   attempt record nothing; an ordering key numbers its messages densely
//!   in commit order, its writers taking turns;
//! - `relay`: a relay publishes committed messages once and marks them
//!   sent; one message per key per round, in key order; a refused message
//!   is retried, then dead, holding back its own key only, and revived or
//!   discarded; an unavailable broker gets the messages back uncounted; a
//!   relay killed mid-round leaves them leased until the lease runs out,
//!   then another relay publishes them under the same ids; three relays at
//!   once publish every message exactly once, each key in order;
//! - `pruning`: sent messages are pruned by the retention policy's window
//!   with the inbox's rows; pending and dead ones never are;
//! - `background`: the relay on a thread over an r2d2 pool drains the
//!   backlog, waits when idle unless told to run now, backs off while the
//!   broker is unavailable and survives a panicking publisher;
//!   `background_task`: the same as a tokio task over a deadpool pool;
//! - `asynchronous`: the same writing and relaying on diesel-async
//!   connections;
//! - `brokers` (feature `outbox-brokers`): the runtime's publishers on a
//!   real RabbitMQ and NATS JetStream: the outbox id as the broker's message
//!   id, unroutable messages and missing exchanges or streams refused, then
//!   dead, an unreachable broker uncounted, a closed channel reopened, a
//!   second publish of an id dropped by JetStream.
//!
//! Run: `INBOX_REQUIRE_DATABASES=1 cargo test -p inbox-tests --all-features --test outbox`

#![allow(missing_docs)]

mod support;

#[cfg(feature = "async")]
mod asynchronous;
mod background;
#[cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
mod background_task;
#[cfg(feature = "outbox-brokers")]
mod brokers;
mod pruning;
mod relay;
mod with_commit;
mod write;
