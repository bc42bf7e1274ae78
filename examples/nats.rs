//! The ledger consumer on NATS JetStream: exactly-once effects in
//! PostgreSQL behind an at-least-once stream, with explicit acks,
//! `ack_wait` redelivery, `max_deliver` and a dead-letter stream.
//!
//! ```text
//! cargo run --example nats --features brokers                  # 500 payments, a summary
//! cargo run --example nats --features brokers -- --soak 600    # ten minutes, a progress line
//! ```
//!
//! Needs NATS with JetStream (`nats-server -js`; `NATS_URL`, default
//! `nats://127.0.0.1:4222`) and PostgreSQL (`DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`). The run makes a schema of its
//! own (`ledger_<run>`) and streams of its own (`LEDGER_<RUN>` on subject
//! `ledger.<run>.payments` with durable pull consumer `ledger`, and the
//! dead-letter stream `LEDGER_<RUN>_DEAD`), and deletes them at the end
//! unless `--keep`. Other options: `--payments N`, `--consumers K`,
//! `--seed S` (the run repeats by its seed); `LEDGER_SOAK_SECONDS` is
//! `--soak`.
//!
//! What it does and proves: three consumers (tasks of this process, each
//! with its own connection and pool) apply payments with the `#[idempotent]`
//! handler `inbox_examples::brokers::ledger::apply_payment`, and ack, nak or
//! dead-letter-and-term each delivery only after the handler returned, as
//! `inbox_runtime::ack_decision` says (`inbox_examples::brokers::nats`).
//! The producer publishes some payments twice (the stream drops a re-publish
//! within its 2 s duplicate window; a later one reaches the consumers and
//! the inbox), some to an account that does not exist (rejected, dead at
//! once) or in a currency with no rate (dead after three attempts), and a
//! few messages without an id. A consumer is crashed (its deliveries come
//! again after `ack_wait`, 5 s) and another one's database connections are
//! cut while they work. At the end the summary checks the ledger against
//! what was published: every good payment applied exactly once, every
//! poison message in the inbox's dead letters and in the dead-letter stream,
//! no message that reached `max_deliver`, nothing left in the stream. The
//! chaos tests (`tests/tests/brokers/`) run the same consumer as
//! processes and kill them.

fn main() -> std::process::ExitCode {
    use inbox_examples::brokers::{nats, run};
    run::main::<nats::Nats>("NATS_URL", nats::DEFAULT_URL)
}
