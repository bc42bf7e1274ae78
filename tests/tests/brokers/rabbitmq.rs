//! The chaos run on RabbitMQ (manual acks, publisher confirms, a
//! dead-letter exchange): see `inbox_examples::brokers::rabbitmq`.

use inbox_examples::brokers::rabbitmq::{self, RabbitMq};

use crate::chaos::{self, Target};

impl Target for RabbitMq {
    const CLI: &'static str = "rabbitmq";
    const URL_VARIABLE: &'static str = "INBOX_TEST_AMQP_URL";
    const DEFAULT_URL: &'static str = rabbitmq::DEFAULT_URL;
}

#[test]
fn consumers_killed_at_every_step_apply_each_payment_once() {
    chaos::run::<RabbitMq>(&chaos::SHORT);
}
