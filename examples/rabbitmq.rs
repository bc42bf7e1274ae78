//! The ledger consumer on RabbitMQ: exactly-once effects in PostgreSQL
//! behind an at-least-once broker, with manual acks, publisher confirms and
//! a dead-letter exchange.
//!
//! ```text
//! cargo run --example rabbitmq --features brokers                  # 500 payments, a summary
//! cargo run --example rabbitmq --features brokers -- --soak 600    # ten minutes, a progress line
//! ```
//!
//! Needs RabbitMQ (`AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`)
//! and PostgreSQL (`DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`). The run makes a schema of its
//! own (`ledger_<run>`) and queues of its own (`ledger.<run>.payments`,
//! `ledger.<run>.dead`, exchange `ledger.<run>.dead-letter`), and deletes
//! them at the end unless `--keep`. Other options: `--payments N`,
//! `--consumers K`, `--seed S` (the run repeats by its seed);
//! `LEDGER_SOAK_SECONDS` is `--soak`.
//!
//! What it does and proves: three consumers (tasks of this process, each
//! with its own connection and pool) apply payments with the `#[idempotent]`
//! handler `inbox_examples::brokers::ledger::apply_payment`, and ack, nack or
//! reject each delivery only after the handler returned, as
//! `inbox_runtime::ack_decision` says (`inbox_examples::brokers::rabbitmq`).
//! The producer publishes some payments twice, some to an account that does
//! not exist (rejected, dead at once) or in a currency with no rate (dead
//! after three attempts), and a few messages without an id. A consumer is
//! crashed and another one's database connections are cut while they work.
//! At the end the summary checks the ledger against what was published:
//! every good payment applied exactly once, every poison message in the
//! inbox's dead letters and in the dead-letter queue, nothing left in the
//! queue. The chaos tests (`tests/tests/brokers/`) run the same
//! consumer as processes and kill them.

fn main() -> std::process::ExitCode {
    use inbox_examples::brokers::{rabbitmq, run};
    run::main::<rabbitmq::RabbitMq>("AMQP_URL", rabbitmq::DEFAULT_URL)
}
