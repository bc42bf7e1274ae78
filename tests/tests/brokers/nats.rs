//! The chaos run on NATS JetStream (explicit acks, `ack_wait`
//! redelivery, `max_deliver`, a dead-letter stream): see
//! `inbox_examples::brokers::nats`.

use inbox_examples::brokers::nats::{self, Nats};

use crate::chaos::{self, Target};

impl Target for Nats {
    const CLI: &'static str = "nats";
    const URL_VARIABLE: &'static str = "INBOX_TEST_NATS_URL";
    const DEFAULT_URL: &'static str = nats::DEFAULT_URL;
}

#[test]
fn consumers_killed_at_every_step_apply_each_payment_once() {
    chaos::run::<Nats>(&chaos::SHORT);
}
