//! W3C trace context carried from a delivery to the messages it sends: an
//! outgoing message continues the incoming message's trace
//! ([`OutgoingMessage::continue_trace`](super::OutgoingMessage::continue_trace)).
//!
//! The outgoing `traceparent` keeps the incoming trace id and flags, and
//! names as its parent a span id derived from the outgoing message's own
//! [`OutboxId`]: the same on every publish of the message (a relay that
//! publishes it again after a crash sends the same header), different for
//! each message a delivery sends.

use super::id::OutboxId;

/// The trace an outgoing message continues: the incoming `traceparent`'s
/// trace id and flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trace {
    trace_id: String,
    flags: String,
}

impl Trace {
    /// The trace `traceparent` names, when it is a valid W3C header
    /// (`version-traceid-parentid-flags`, lowercase hex; version `ff`, an
    /// all-zero trace id or parent id are invalid; a later version may
    /// carry more fields after these four). None otherwise: a receiver that
    /// cannot read it starts a new trace, and so the message carries none.
    pub(crate) fn parse(traceparent: &str) -> Option<Trace> {
        let value = traceparent.trim();
        let version = value.get(..2)?;
        if !is_hex(version) || version == "ff" {
            return None;
        }
        let four = value.get(..55)?;
        let rest = &value[55..];
        if version == "00" && !rest.is_empty() || version != "00" && !rest.starts_with('-') {
            return None;
        }
        let mut fields = four.split('-');
        let (_, trace_id, parent_id, flags) = (
            fields.next()?,
            fields.next()?,
            fields.next()?,
            fields.next()?,
        );
        let valid = |field: &str, len: usize| field.len() == len && is_hex(field);
        if !valid(trace_id, 32) || !valid(parent_id, 16) || !valid(flags, 2) {
            return None;
        }
        if trace_id.bytes().all(|b| b == b'0') || parent_id.bytes().all(|b| b == b'0') {
            return None;
        }
        Some(Trace {
            trace_id: trace_id.to_owned(),
            flags: flags.to_owned(),
        })
    }

    /// The `traceparent` of the outgoing message `id` (version 00).
    pub(crate) fn child_of(&self, id: &OutboxId) -> String {
        format!("00-{}-{}-{}", self.trace_id, span_id(id), self.flags)
    }
}

/// Lowercase hex digits only.
fn is_hex(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The message's span id: the last 16 hex digits of its id (a UUID's
/// variant and random bits: never all zero, as a span id must not be).
fn span_id(id: &OutboxId) -> String {
    let digits: String = id.as_str().chars().filter(|c| *c != '-').collect();
    let start = digits.len().saturating_sub(16);
    let span = digits[start..].to_ascii_lowercase();
    if span.bytes().all(|b| b == b'0') {
        "0000000000000001".to_owned()
    } else {
        span
    }
}

#[cfg(test)]
mod tests {
    use super::Trace;
    use crate::outbox::id::OutboxId;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_header_gives_its_trace_and_flags() {
        let trace = Trace::parse(VALID).unwrap();
        let id = OutboxId::generate();
        let child = trace.child_of(&id);
        let fields: Vec<&str> = child.split('-').collect();
        assert_eq!(fields[0], "00");
        assert_eq!(fields[1], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(fields[3], "01");
        assert_eq!(fields[2].len(), 16);
        assert_ne!(fields[2], "00f067aa0ba902b7", "a span of its own");
        assert_eq!(child, trace.child_of(&id), "the same on every publish");
        assert_ne!(child, trace.child_of(&OutboxId::generate()));
        assert!(Trace::parse(&child).is_some());
        // A later version with more fields: its first four are read.
        assert!(Trace::parse(&format!("01{}-extra", &VALID[2..])).is_some());
    }

    #[test]
    fn invalid_headers_continue_nothing() {
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert_eq!(Trace::parse(bad), None, "{bad:?}");
        }
    }
}
