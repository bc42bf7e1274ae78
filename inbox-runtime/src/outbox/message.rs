//! What a handler sends: [`OutgoingMessage`], checked before it is written.

use super::trace::Trace;
use crate::error::{InboxError, OutgoingProblem};

/// The longest destination, ordering key or header name, in bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// The longest header value, in bytes.
pub const MAX_HEADER_VALUE_BYTES: usize = 4096;

/// A message to send, recorded with [`send`](super::send) in the caller's
/// transaction and published by a [`Relay`](super::Relay) once that
/// transaction committed.
///
/// - `destination`: where the publisher sends it (a RabbitMQ routing key or
///   queue, a NATS subject, a Kafka topic: the [`Publisher`](super::Publisher)
///   decides what it means), 1 to 255 bytes.
/// - `ordering_key` (optional): messages with the same key are published
///   in the order their transactions committed, one at a time, and a key
///   whose message cannot be published waits without holding back the
///   others. Messages without a key are published as soon as possible, in
///   no promised order.
/// - headers: names 1 to 255 bytes without `:`, line breaks or NUL;
///   values up to 4096 bytes without line breaks or NUL (what both AMQP and
///   NATS headers carry).
/// - the payload: bytes, or a JSON value ([`json`](Self::json), feature
///   `serde`).
///
/// Nothing is checked until [`send`](super::send), which refuses a bad
/// message with [`InboxError::InvalidOutgoingMessage`] before writing.
///
/// ```
/// use inbox_runtime::outbox::OutgoingMessage;
///
/// let message = OutgoingMessage::new("billing.receipts", r#"{"payment":"p-1"}"#)
///     .ordering_key("account-42")
///     .header("content-type", "application/json");
/// assert_eq!(message.destination(), "billing.receipts");
/// assert_eq!(message.key(), Some("account-42"));
/// assert_eq!(message.headers().len(), 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingMessage {
    destination: String,
    ordering_key: Option<String>,
    headers: Vec<(String, String)>,
    payload: Vec<u8>,
    problem: Option<OutgoingProblem>,
    trace: Option<Trace>,
}

impl OutgoingMessage {
    /// A message for `destination` carrying `payload`.
    ///
    /// ```
    /// let message = inbox_runtime::outbox::OutgoingMessage::new("q", vec![1, 2, 3]);
    /// assert_eq!(message.payload(), &[1, 2, 3]);
    /// ```
    pub fn new(destination: impl Into<String>, payload: impl Into<Vec<u8>>) -> OutgoingMessage {
        OutgoingMessage {
            destination: destination.into(),
            ordering_key: None,
            headers: Vec::new(),
            payload: payload.into(),
            problem: None,
            trace: None,
        }
    }

    /// A message for `destination` whose payload is `value` as JSON, with
    /// the header `content-type: application/json`. A value that cannot be
    /// encoded makes [`send`](super::send) refuse the message
    /// ([`OutgoingProblem::Unencodable`]).
    ///
    /// ```
    /// let message = inbox_runtime::outbox::OutgoingMessage::json("q", &serde_json::json!({"n": 1}));
    /// assert_eq!(message.payload(), br#"{"n":1}"#);
    /// ```
    #[cfg(feature = "serde")]
    pub fn json<T: serde::Serialize + ?Sized>(
        destination: impl Into<String>,
        value: &T,
    ) -> OutgoingMessage {
        let (payload, problem) = match serde_json::to_vec(value) {
            Ok(payload) => (payload, None),
            Err(error) => (
                Vec::new(),
                Some(OutgoingProblem::Unencodable {
                    reason: error.to_string(),
                }),
            ),
        };
        let mut message =
            OutgoingMessage::new(destination, payload).header("content-type", "application/json");
        message.problem = problem;
        message
    }

    /// Publishes this message after every earlier message with the same
    /// key (in commit order) and before every later one.
    ///
    /// ```
    /// let message = inbox_runtime::outbox::OutgoingMessage::new("q", "x").ordering_key("order-7");
    /// assert_eq!(message.key(), Some("order-7"));
    /// ```
    pub fn ordering_key(mut self, key: impl Into<String>) -> OutgoingMessage {
        self.ordering_key = Some(key.into());
        self
    }

    /// Continues the trace of the delivery this message is sent from:
    /// `traceparent` is the incoming message's W3C trace context header.
    /// The message is published with a `traceparent` of the same trace id
    /// and flags, whose parent is a span id derived from the message's own
    /// [`OutboxId`](super::OutboxId) (the same on every publish of it), so
    /// a trace follows the message across services. It replaces a
    /// `traceparent` header added before. A value that is not a valid
    /// `traceparent` adds none (as the W3C recommendation asks of a
    /// receiver that cannot read it: the next service starts a trace of
    /// its own); a message is never refused for it. The incoming
    /// `tracestate`, if any, is vendor data the runtime does not read: copy
    /// it with [`header`](Self::header) (`.header("tracestate", state)`) to
    /// pass it on.
    ///
    /// ```
    /// use inbox_runtime::outbox::OutgoingMessage;
    ///
    /// let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    /// let receipt = OutgoingMessage::new("billing.receipts", "p-1").continue_trace(incoming);
    /// assert!(receipt.continues_trace());
    /// assert!(!OutgoingMessage::new("q", "x").continue_trace("garbage").continues_trace());
    /// ```
    pub fn continue_trace(mut self, traceparent: &str) -> OutgoingMessage {
        self.trace = Trace::parse(traceparent);
        if self.trace.is_some() {
            self.headers
                .retain(|(name, _)| !name.eq_ignore_ascii_case("traceparent"));
        }
        self
    }

    /// Whether the message continues a trace ([`continue_trace`](Self::continue_trace)
    /// was given a valid `traceparent`).
    ///
    /// ```
    /// assert!(!inbox_runtime::outbox::OutgoingMessage::new("q", "x").continues_trace());
    /// ```
    pub fn continues_trace(&self) -> bool {
        self.trace.is_some()
    }

    /// The trace the message continues.
    pub(crate) fn trace(&self) -> Option<&Trace> {
        self.trace.as_ref()
    }

    /// Adds a header (a name given twice is sent twice, in order).
    ///
    /// ```
    /// let message = inbox_runtime::outbox::OutgoingMessage::new("q", "x").header("a", "1").header("b", "2");
    /// assert_eq!(message.headers()[1], ("b".to_owned(), "2".to_owned()));
    /// ```
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> OutgoingMessage {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The destination.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::outbox::OutgoingMessage::new("q", "x").destination(), "q");
    /// ```
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// The ordering key, if any.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::outbox::OutgoingMessage::new("q", "x").key(), None);
    /// ```
    pub fn key(&self) -> Option<&str> {
        self.ordering_key.as_deref()
    }

    /// The headers, in the order they were added.
    ///
    /// ```
    /// assert!(inbox_runtime::outbox::OutgoingMessage::new("q", "x").headers().is_empty());
    /// ```
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// The payload.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::outbox::OutgoingMessage::new("q", "x").payload(), b"x");
    /// ```
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// `Ok` when the outbox can store the message and every broker can
    /// carry its names, else why not.
    pub(crate) fn check(&self) -> Result<(), InboxError> {
        self.problem().map_or(Ok(()), |problem| {
            Err(InboxError::InvalidOutgoingMessage { problem })
        })
    }

    fn problem(&self) -> Option<OutgoingProblem> {
        if let Some(problem) = &self.problem {
            return Some(problem.clone());
        }
        let name = |field, text: &str, forbidden: &[char]| {
            check_text(field, text, 1, MAX_NAME_BYTES, forbidden)
        };
        name("destination", &self.destination, &['\0'])
            .or_else(|| {
                self.ordering_key
                    .as_deref()
                    .and_then(|key| name("ordering key", key, &['\0']))
            })
            .or_else(|| {
                self.headers.iter().find_map(|(header, value)| {
                    name("header name", header, &['\0', '\r', '\n', ':']).or_else(|| {
                        check_text(
                            "header value",
                            value,
                            0,
                            MAX_HEADER_VALUE_BYTES,
                            &['\0', '\r', '\n'],
                        )
                    })
                })
            })
    }
}

/// What is wrong with `text` as the `field`: its length in bytes outside
/// `min..=max`, or a `forbidden` character in it.
fn check_text(
    field: &'static str,
    text: &str,
    min: usize,
    max: usize,
    forbidden: &[char],
) -> Option<OutgoingProblem> {
    if text.len() < min {
        return Some(OutgoingProblem::Empty { field });
    }
    if text.len() > max {
        return Some(OutgoingProblem::TooLong {
            field,
            bytes: text.len(),
            max,
        });
    }
    text.chars()
        .find(|c| forbidden.contains(c))
        .map(|character| OutgoingProblem::Forbidden { field, character })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(message: OutgoingMessage) -> Option<OutgoingProblem> {
        match message.check() {
            Ok(()) => None,
            Err(InboxError::InvalidOutgoingMessage { problem }) => Some(problem),
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn every_bad_part_is_named() {
        let ok = || OutgoingMessage::new("q", "x");
        assert_eq!(problem(ok()), None);
        assert_eq!(
            problem(OutgoingMessage::new("", "x")),
            Some(OutgoingProblem::Empty {
                field: "destination"
            })
        );
        assert_eq!(
            problem(OutgoingMessage::new("q".repeat(256), "x")),
            Some(OutgoingProblem::TooLong {
                field: "destination",
                bytes: 256,
                max: 255
            })
        );
        assert_eq!(problem(OutgoingMessage::new("q".repeat(255), "x")), None);
        assert_eq!(
            problem(ok().ordering_key("")),
            Some(OutgoingProblem::Empty {
                field: "ordering key"
            })
        );
        assert_eq!(
            problem(ok().ordering_key("a\0b")),
            Some(OutgoingProblem::Forbidden {
                field: "ordering key",
                character: '\0'
            })
        );
        assert_eq!(
            problem(ok().header("a:b", "v")),
            Some(OutgoingProblem::Forbidden {
                field: "header name",
                character: ':'
            })
        );
        assert_eq!(
            problem(ok().header("a", "line\nbreak")),
            Some(OutgoingProblem::Forbidden {
                field: "header value",
                character: '\n'
            })
        );
        assert_eq!(problem(ok().header("a", "")), None);
        assert_eq!(
            problem(ok().header("a", "v".repeat(4097))),
            Some(OutgoingProblem::TooLong {
                field: "header value",
                bytes: 4097,
                max: 4096
            })
        );
        assert_eq!(problem(ok().header("a", "v".repeat(4096))), None);
    }
}
