//! What an expression read from the message stands for: the message id or
//! the payload's fingerprint. Both must come from the message and be the
//! same on every delivery of it; what goes wrong otherwise differs, and the
//! errors say which.

/// The expression being checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Subject {
    /// `id = ...`.
    Id,
    /// `fingerprint = ...`.
    Fingerprint,
}

impl Subject {
    /// The start of an error about an expression not rooted in the message.
    pub(crate) fn rooted_prefix(self) -> &'static str {
        match self {
            Subject::Id => "the message id must come from the message",
            Subject::Fingerprint => "the fingerprint must come from the message",
        }
    }

    /// The start of an error about a value that changes per delivery.
    pub(crate) fn stable_prefix(self) -> &'static str {
        match self {
            Subject::Id => "the message id must be the same on every delivery of a message",
            Subject::Fingerprint => {
                "the fingerprint must be the same on every delivery of a message"
            }
        }
    }

    /// What a value that is the same for every message would do.
    pub(crate) fn if_constant(self) -> &'static str {
        match self {
            Subject::Id => "every message after the first would be skipped as a duplicate",
            Subject::Fingerprint => {
                "it would not tell one payload from another, and no conflict would ever be found"
            }
        }
    }

    /// What a value that changes per delivery would do.
    pub(crate) fn if_per_delivery(self) -> &'static str {
        match self {
            Subject::Id => "so a redelivery would look like a new message and be processed again",
            Subject::Fingerprint => {
                "so every redelivery would look like a different payload and be refused as a \
                 conflict"
            }
        }
    }

    /// The noun in "read the ... from the message".
    pub(crate) fn noun(self) -> &'static str {
        match self {
            Subject::Id => "id",
            Subject::Fingerprint => "fingerprinted payload",
        }
    }
}
