//! Chaos on real brokers (issue 9): the ledger consumer of
//! `inbox_examples::brokers` run as `K` OS processes (the `chaos-consumer`
//! binary) against a real RabbitMQ (`rabbitmq.rs`) or NATS JetStream
//! (`nats.rs`) and a real PostgreSQL, while the test kills them with
//! SIGKILL and restarts them:
//!
//! - **mid-transaction**: the consumer stops inside the handler's
//!   transaction (after the balance update, before the ledger entry); the
//!   test sees its connection `idle in transaction`, then kills it;
//! - **after commit, before ack**: the consumer stops after the handler
//!   committed (the payment applied, or made dead) and before the broker is
//!   told; the test kills it, and later sees the redelivery absorbed (a
//!   duplicate, or dead again);
//! - **at a random moment**, while a wave is being consumed;
//! - **idle**: when everything published so far is settled and the
//!   consumer holds no delivery;
//!
//! and cuts one consumer's database connections (`pg_terminate_backend`)
//! while it is inside a transaction: the delivery is retried, and the same
//! process goes on applying payments on new connections.
//!
//! The producer publishes waves of payments with stable ids, publishes a
//! share of them again, and mixes in poison messages (rejected: an unknown
//! account; exhausted: a currency with no rate, three attempts) and
//! messages without an id. At the end it replays every poison message (a
//! producer replaying its outbox): each copy must be dead-lettered again,
//! not acknowledged. After the chaos the queue is drained, the
//! consumers are stopped, and `inbox_examples::brokers::check::verify`
//! proves the run: every good payment applied exactly once (0 lost, 0
//! doubled), every balance right, every poison message dead in the inbox
//! and each of its copies once in the broker's dead-letter queue, with no
//! effect, nothing left in the queue. The test prints what it did:
//! messages published, kills by kind, redeliveries, duplicates absorbed,
//! dead letters, effects counted against expected.
//!
//! The suite `outbox_hop` (feature `outbox-brokers`) carries the chain one
//! hop further, with the receipts this consumer records through the outbox.
//!
//! Each run has queues or streams of its own (named after the run) and a
//! PostgreSQL schema of its own, removed at the end; everything is on
//! 127.0.0.1, bounded in messages and time (well under a minute).
//!
//! Needs RabbitMQ (`INBOX_TEST_AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`), NATS with JetStream
//! (`INBOX_TEST_NATS_URL`, default `nats://127.0.0.1:4222`) and PostgreSQL
//! (the harness's). An unreachable broker skips the test with a
//! `skipped:` line, or fails it with `INBOX_TEST_REQUIRE_BROKERS=1` (set by
//! `cargo xtask test`).
//!
//! Run: `cargo test -p inbox-tests --features brokers --test brokers`
//! (the report goes to stderr uncaptured). `INBOX_CHAOS_SEED=<seed>` (the
//! report prints it) repeats a run's payments and choices, not its timing;
//! `INBOX_CHAOS_TRACE=1` prints every consumer event as it comes.
#![cfg(feature = "brokers")]
#![allow(missing_docs)]

mod chaos;
mod nats;
mod rabbitmq;
