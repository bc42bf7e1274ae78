//! [`JetStreamPublisher`]: the relay's messages to NATS JetStream through
//! async-nats, each acknowledged by its stream.

use std::fmt;

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use async_nats::jetstream::{self, context::PublishErrorKind};

use crate::outbox::publisher::{OutboxMessage, PublishError, Publisher};

/// A [`Publisher`] for NATS JetStream through async-nats (feature
/// `outbox-nats`).
///
/// Each message is published to the subject named by its
/// [`destination`](OutboxMessage::destination), with its headers and the
/// header `Nats-Msg-Id` set to its [`OutboxId`](crate::outbox::OutboxId):
/// JetStream drops a second publish of the id within the stream's
/// duplicate window (`duplicate_window`, two minutes by default), and past
/// it the consumer's inbox does (`#[idempotent(id = message.headers…)]`).
///
/// A round's messages are published together, then their acks awaited. `Ok`
/// for a message its stream acknowledged (a duplicate the stream dropped
/// too: it holds the first copy).
///
/// [Refused](PublishError::refused) (counted, retried with a backoff, dead
/// after the relay's `max_attempts`): a destination that is no subject
/// (empty, with whitespace, an empty token, a wildcard; never sent), no
/// stream for the subject (no responders: also seen for a moment while a
/// stream elects a leader), a message over the server's or the stream's
/// size limit, a conflict the message's own headers asked for
/// (`Nats-Expected-Last-Msg-Id`), and any other error the stream answers
/// about the message (a sealed stream, say).
///
/// [Unavailable](PublishError::unavailable) (given back uncounted; the
/// relay backs off): no ack in time, a broken or closed connection, too
/// many acks pending, and a stream that cannot store now (full with
/// `discard: new`, insufficient resources, a failing store, JetStream not
/// enabled). The async-nats client reconnects on its own.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use inbox_runtime::outbox::JetStreamPublisher;
///
/// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
/// let publisher = JetStreamPublisher::new(async_nats::jetstream::new(client));
/// // BackgroundRelay::new(Relay::new()).spawn_task(pool, publisher, |round| …);
/// # let _ = publisher;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct JetStreamPublisher {
    context: jetstream::Context,
}

impl JetStreamPublisher {
    /// A publisher through `context` (`async_nats::jetstream::new(client)`;
    /// its timeout bounds the wait for each ack).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), async_nats::ConnectError> {
    /// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
    /// let publisher = inbox_runtime::outbox::JetStreamPublisher::new(async_nats::jetstream::new(client));
    /// # let _ = publisher;
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(context: jetstream::Context) -> JetStreamPublisher {
        JetStreamPublisher { context }
    }
}

impl fmt::Debug for JetStreamPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamPublisher").finish_non_exhaustive()
    }
}

impl Publisher for JetStreamPublisher {
    async fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let mut sent = Vec::with_capacity(messages.len());
        for message in messages {
            // A destination that is no subject is never sent: the server
            // would close the connection on it, failing the round's others.
            if let Some(problem) = subject_problem(&message.destination) {
                sent.push(Err(PublishError::refused(format!(
                    "`{}` is not a NATS subject: {problem}",
                    message.destination
                ))));
                continue;
            }
            let publish = self.context.publish_with_headers(
                message.destination.clone(),
                headers(message),
                message.payload.clone().into(),
            );
            sent.push(publish.await.map_err(|error| answer(message, &error)));
        }
        // The acks awaited together: a stream that stops answering costs a
        // round one ack timeout, not one per message.
        futures_util::future::join_all(sent.into_iter().zip(messages).map(
            |(publish, message)| async move {
                match publish {
                    Ok(ack) => ack
                        .await
                        .map(|_| ())
                        .map_err(|error| answer(message, &error)),
                    Err(answer) => Err(answer),
                }
            },
        ))
        .await
    }
}

/// Why `subject` cannot be published to, if it cannot: NATS subjects are
/// dot-separated tokens, none empty, without whitespace, and a publish names
/// no wildcard (`*`, `>`).
fn subject_problem(subject: &str) -> Option<&'static str> {
    if subject.is_empty() {
        return Some("it is empty");
    }
    if subject.chars().any(char::is_whitespace) {
        return Some("it contains whitespace");
    }
    for token in subject.split('.') {
        match token {
            "" => return Some("it has an empty token (a leading, trailing or double dot)"),
            "*" | ">" => return Some("a publish names no wildcard"),
            _ => {}
        }
    }
    None
}

/// The JetStream headers of `message`.
fn headers(message: &OutboxMessage) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in &message.headers {
        headers.append(name.as_str(), value.as_str());
    }
    headers.insert(NATS_MESSAGE_ID, message.id.to_string().as_str());
    headers
}

/// What a failed publish of `message` means for the relay.
fn answer(message: &OutboxMessage, error: &jetstream::context::PublishError) -> PublishError {
    let refused =
        |why: String| PublishError::refused(format!("{why} (subject `{}`)", message.destination));
    match error.kind() {
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::MaxAckPending => PublishError::unavailable(error.to_string()),
        PublishErrorKind::StreamNotFound => PublishError::refused(format!(
            "no stream captures the subject `{}`",
            message.destination
        )),
        // The message's own size, or a conflict its own headers asked for
        // (`Nats-Expected-Last-Msg-Id`, `Nats-Expected-Last-Sequence`).
        PublishErrorKind::MaxPayloadExceeded
        | PublishErrorKind::WrongLastMessageId
        | PublishErrorKind::WrongLastSequence => refused(error.to_string()),
        // The stream's own answer: a full or failing store takes the
        // message later; what it says of this message, never.
        _ => match api_error(error) {
            Some(api) if stream_cannot_take_now(api.error_code()) => {
                PublishError::unavailable(format!("{error}: {api}"))
            }
            Some(api) => refused(format!("{error}: {api}")),
            // No answer from a stream (the client's own failure: its
            // connection closed, an ack it could not read).
            None => PublishError::unavailable(error.to_string()),
        },
    }
}

/// The JetStream API error a failed publish carries, if the stream answered
/// with one.
fn api_error(error: &jetstream::context::PublishError) -> Option<&jetstream::Error> {
    std::error::Error::source(error)?.downcast_ref::<jetstream::Error>()
}

/// Whether the stream refused for want of room or of a working store: it
/// can take the message once consumers catch up or the server recovers.
fn stream_cannot_take_now(code: jetstream::ErrorCode) -> bool {
    use jetstream::ErrorCode;
    [
        ErrorCode::STREAM_STORE_FAILED,
        ErrorCode::INSUFFICIENT_RESOURCES,
        ErrorCode::ACCOUNT_RESOURCES_EXCEEDED,
        ErrorCode::STORAGE_RESOURCES_EXCEEDED,
        ErrorCode::MEMORY_RESOURCES_EXCEEDED,
        ErrorCode::TEMP_STORAGE_FAILED,
        ErrorCode::STREAM_MAX_STREAM_BYTES_EXCEEDED,
        ErrorCode::JETSTREAM_NOT_ENABLED,
        ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT,
    ]
    .contains(&code)
}

#[cfg(test)]
mod tests {
    use super::subject_problem;

    #[test]
    fn subjects_are_dot_separated_tokens_without_whitespace_or_wildcards() {
        assert_eq!(subject_problem("orders.receipts"), None);
        assert_eq!(subject_problem("a"), None);
        assert_eq!(subject_problem("ünïcode.ok"), None);
        for bad in [
            "",
            "not a subject",
            "tab\there",
            "line\nbreak",
            ".lead",
            "trail.",
            "a..b",
            "a.*",
            ">",
        ] {
            assert!(subject_problem(bad).is_some(), "{bad:?}");
        }
    }
}
