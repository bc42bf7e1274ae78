//! Publishers for the brokers the runtime knows: RabbitMQ through lapin
//! (feature `outbox-lapin`), NATS JetStream through async-nats (feature
//! `outbox-nats`). Any other broker implements
//! [`Publisher`](super::Publisher) itself.

#[cfg(feature = "outbox-lapin")]
mod lapin;
#[cfg(feature = "outbox-nats")]
mod nats;

#[cfg(feature = "outbox-lapin")]
pub use self::lapin::LapinPublisher;
#[cfg(feature = "outbox-nats")]
pub use self::nats::JetStreamPublisher;
