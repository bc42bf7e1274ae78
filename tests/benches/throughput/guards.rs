//! The `guard-*` variants (async MariaDB/MySQL only): what each part of
//! the deadlock guard costs the server. Each sends a claim the way an
//! async `#[idempotent]` handler does, an `INSERT` of the key as hex
//! literals in one text with its begin, then the effect, then one text
//! that commits, and differs from the next only in the guard around it.

/// A guard around the claim, by what it adds to a plain transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum GuardShape {
    /// `BEGIN`, the claim, `COMMIT`: no guard.
    None,
    /// A savepoint set before the claim and released before `COMMIT`:
    /// the guard's tripwire alone.
    Savepoint,
    /// `autocommit` off (its value saved) before the claim, and on again
    /// to commit: the guard's other half alone.
    Autocommit,
    /// Both, as the handler sends them without its idle bound.
    Both,
    /// Both, the idle bound (`wait_timeout` lowered, then restored) and
    /// the claim's lock wait bounded (`SET STATEMENT
    /// innodb_lock_wait_timeout = 2 FOR`, the default wait for a delivery
    /// in flight): the handler's own texts.
    Idle,
    /// `autocommit` off and a claim token the claim writes, checked by the
    /// `SET` that commits (`EXISTS` of the claim's row with the token):
    /// the blocking handler's guard, sent as text (with the plain
    /// `INSERT` of the others, where the blocking handler prepares an
    /// `INSERT IGNORE`).
    Token,
}

impl GuardShape {
    pub const ALL: [GuardShape; 6] = [
        GuardShape::None,
        GuardShape::Savepoint,
        GuardShape::Autocommit,
        GuardShape::Both,
        GuardShape::Idle,
        GuardShape::Token,
    ];

    pub fn name(self) -> &'static str {
        match self {
            GuardShape::None => "none",
            GuardShape::Savepoint => "savepoint",
            GuardShape::Autocommit => "autocommit",
            GuardShape::Both => "both",
            GuardShape::Idle => "idle",
            GuardShape::Token => "token",
        }
    }

    pub fn parse(name: &str) -> Option<GuardShape> {
        GuardShape::ALL
            .into_iter()
            .find(|shape| shape.name() == name)
    }

    /// The text that begins the transaction and claims `handler`'s
    /// `id`, and the text that commits it.
    #[cfg_attr(
        not(all(feature = "async", any(feature = "postgres", feature = "mysql"))),
        allow(dead_code)
    )]
    pub fn texts(self, handler: &str, id: &str) -> (String, String) {
        const SAVE_AUTOCOMMIT: &str =
            "SET @inbox_saved_autocommit = @@SESSION.autocommit, SESSION autocommit = 0";
        const RESTORE_AUTOCOMMIT: &str =
            "SET SESSION autocommit = 1, SESSION autocommit = @inbox_saved_autocommit";
        let (handler, id) = (hex(handler), hex(id));
        let claim =
            format!("INSERT INTO inbox_messages (handler, message_id) VALUES ({handler}, {id})");
        match self {
            GuardShape::None => (format!("BEGIN; {claim}"), "COMMIT".into()),
            GuardShape::Savepoint => (
                format!("BEGIN; SAVEPOINT inbox_transaction; {claim}"),
                "RELEASE SAVEPOINT inbox_transaction; COMMIT".into(),
            ),
            GuardShape::Autocommit => (
                format!("{SAVE_AUTOCOMMIT}; {claim}"),
                RESTORE_AUTOCOMMIT.into(),
            ),
            GuardShape::Both => (
                format!("{SAVE_AUTOCOMMIT}; SAVEPOINT inbox_transaction; {claim}"),
                format!("RELEASE SAVEPOINT inbox_transaction; {RESTORE_AUTOCOMMIT}"),
            ),
            GuardShape::Idle => (
                format!(
                    "SET @inbox_saved_wait_timeout = @@SESSION.wait_timeout, SESSION wait_timeout = 60, \
                     @inbox_saved_autocommit = @@SESSION.autocommit, SESSION autocommit = 0; \
                     SAVEPOINT inbox_transaction; SET STATEMENT innodb_lock_wait_timeout = 2 FOR {claim}"
                ),
                format!(
                    "RELEASE SAVEPOINT inbox_transaction; {RESTORE_AUTOCOMMIT}, SESSION wait_timeout = \
                     CAST(IFNULL(@inbox_saved_wait_timeout, @@SESSION.wait_timeout) AS UNSIGNED)"
                ),
            ),
            GuardShape::Token => (
                format!(
                    "{SAVE_AUTOCOMMIT}, @inbox_claim_token = UNHEX(REPLACE(UUID(), '-', '')); \
                     INSERT INTO inbox_messages (handler, message_id, claim_token) \
                     VALUES ({handler}, {id}, @inbox_claim_token)"
                ),
                format!(
                    "SET SESSION autocommit = IF(EXISTS(SELECT 1 FROM inbox_messages \
                     WHERE handler = {handler} AND message_id = {id} \
                     AND claim_token = @inbox_claim_token), 'ON', 'inbox_transaction lost'), \
                     SESSION autocommit = @inbox_saved_autocommit"
                ),
            ),
        }
    }
}

/// `text`'s bytes as a hex literal, as the handler writes a key.
#[cfg_attr(
    not(all(feature = "async", any(feature = "postgres", feature = "mysql"))),
    allow(dead_code)
)]
fn hex(text: &str) -> String {
    use std::fmt::Write;
    let mut literal = String::with_capacity(3 + 2 * text.len());
    literal.push_str("X'");
    for byte in text.bytes() {
        // Writing to a `String` cannot fail.
        let _ = write!(literal, "{byte:02X}");
    }
    literal.push('\'');
    literal
}
