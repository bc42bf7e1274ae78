//! What every backend's suite shares: the messages, the error type, the
//! effects table, a std-only shuffle, and `backend_support!`, which expands
//! the small per-backend helpers (fresh database, effect and inbox queries).

use std::cell::Cell;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, Sender};

diesel::table! {
    /// What handler bodies write. Deliberately without any unique constraint
    /// in the database (the declared key is only for Diesel): a second effect
    /// for the same message shows up as a second row.
    effects (handler, message_id, worker, note) {
        handler -> Text,
        message_id -> Text,
        worker -> Integer,
        note -> Text,
    }
}

pub use inbox_tests::AppError;

/// How a handler body behaves on this delivery. A redelivery of the same id
/// usually uses `Apply`, as after a transient failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Apply the effect and succeed.
    Apply,
    /// Apply the effect, then return `Err` directly.
    Fail,
    /// Apply the effect, then panic.
    Panic,
    /// Return `Ok` before applying any effect.
    EarlyReturn,
    /// Apply the effect, then fail through `?` on an application check.
    RejectWithQuestionMark,
    /// Apply the effect, then fail through `?` on a failing SQL statement
    /// (which aborts the transaction on PostgreSQL).
    DbErrorWithQuestionMark,
}

/// A delivered message. `runs` counts how often a body ran for this delivery.
pub struct Msg {
    pub id: String,
    pub mode: Mode,
    pub runs: Cell<u32>,
}

impl Msg {
    pub fn new(id: impl Into<String>) -> Self {
        Msg::with_mode(id, Mode::Apply)
    }

    pub fn with_mode(id: impl Into<String>, mode: Mode) -> Self {
        Msg {
            id: id.into(),
            mode,
            runs: Cell::new(0),
        }
    }

    /// Counts a run of a body.
    pub fn ran(&self) {
        self.runs.set(self.runs.get() + 1);
    }

    /// The application check that `RejectWithQuestionMark` fails.
    pub fn check(&self) -> Result<(), AppError> {
        if self.mode == Mode::RejectWithQuestionMark {
            Err(AppError::Rejected(
                "the message failed an application check",
            ))
        } else {
            Ok(())
        }
    }
}

/// A message identified by a number (`MessageId` for integers).
pub struct Numbered {
    pub seq: u64,
}

/// A message identified by a UUID (`MessageId` for `uuid::Uuid`).
pub struct Uuided {
    pub uuid: uuid::Uuid,
}

/// The payload of the deliberate panics, so a test can tell its own panic
/// from an assertion failure.
#[derive(Debug, PartialEq, Eq)]
pub struct DeliberatePanic(pub &'static str);

/// A message whose body signals once it holds the claim, then waits for the
/// test to say whether it should succeed (`true`) or fail (`false`).
pub struct Gated {
    pub id: String,
    pub claimed: Sender<()>,
    pub outcome: Receiver<bool>,
}

/// One delivery of the race test.
pub struct RaceDelivery<'a> {
    pub id: &'a str,
    pub worker: i32,
    /// Set by the body while the processing transaction is in flight.
    pub in_flight: &'a AtomicBool,
    /// Whether the body fails (after writing its effect) on this delivery.
    pub fail: bool,
}

/// A std-only xorshift64 generator, seeded per thread, to shuffle delivery orders.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        // Spread small seeds; never zero.
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Fisher–Yates.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

/// Ids whose bytes must reach the database untouched.
pub const TRICKY_IDS: &[&str] = &[
    "it's",
    "\"double\"",
    "'; DROP TABLE inbox_messages; --",
    "Robert'); DROP TABLE effects;--",
    "back\\slash\\",
    "%_ like-wildcards _%",
    "`backtick` [bracket] $1 ? :name @var",
    "Grüße, 日本語, emoji 🚀",
    "tab\tnew\nline\r",
    "/* comment */ -- end",
];

/// Expands, inside a backend module that defines `Db` and `dialect`, the
/// connection types and the helpers the tests use.
macro_rules! backend_support {
    () => {
        use diesel::connection::{SimpleConnection, TransactionManager};
        use diesel::prelude::*;
        use diesel::r2d2::{ConnectionManager, PooledConnection};
        use inbox_tests::TestBackend;

        pub use dialect::inbox_messages;
        pub use $crate::support::*;

        /// This backend's connection.
        pub type Conn = <Db as TestBackend>::Connection;
        /// A connection from an r2d2 pool.
        pub type Pooled = PooledConnection<ConnectionManager<Conn>>;

        /// A fresh database (inbox and effects tables) and a connection to
        /// it, or `None` after the harness's `skipped:` line.
        pub fn fresh() -> Option<(Db, Conn)> {
            quiet_deliberate_panics();
            let db = Db::open()?;
            let mut conn = db.connect();
            conn.batch_execute(dialect::EFFECTS_DDL)
                .expect("create the effects table");
            Some((db, conn))
        }

        /// The effect of a handler body: one row in `effects`.
        pub fn record_effect(
            conn: &mut Conn,
            handler: &str,
            id: &str,
            worker: i32,
            note: &str,
        ) -> QueryResult<()> {
            diesel::insert_into(effects::table)
                .values((
                    effects::handler.eq(handler),
                    effects::message_id.eq(id),
                    effects::worker.eq(worker),
                    effects::note.eq(note),
                ))
                .execute(conn)
                .map(drop)
        }

        /// How many effects were recorded for `id` (by any handler).
        pub fn effects_for(conn: &mut Conn, id: &str) -> i64 {
            effects::table
                .filter(effects::message_id.eq(id))
                .count()
                .get_result(conn)
                .expect("count effects")
        }

        /// How many effects `handler` recorded for `id`.
        pub fn effects_by(conn: &mut Conn, handler: &str, id: &str) -> i64 {
            effects::table
                .filter(effects::handler.eq(handler))
                .filter(effects::message_id.eq(id))
                .count()
                .get_result(conn)
                .expect("count effects")
        }

        /// Every effect as `(handler, message_id, note)`, sorted.
        pub fn all_effects(conn: &mut Conn) -> Vec<(String, String, String)> {
            let mut rows: Vec<(String, String, String)> = effects::table
                .select((effects::handler, effects::message_id, effects::note))
                .load(conn)
                .expect("read effects");
            rows.sort();
            rows
        }

        /// Every inbox row as `(handler, message_id)`, sorted bytewise.
        pub fn inbox_rows(conn: &mut Conn) -> Vec<(String, String)> {
            let mut rows: Vec<(String, String)> = inbox_messages::table
                .select((inbox_messages::handler, inbox_messages::message_id))
                .load(conn)
                .expect("read the inbox");
            rows.sort();
            rows
        }

        /// How many inbox rows hold exactly `(handler, id)`.
        pub fn inbox_count(conn: &mut Conn, handler: &str, id: &str) -> i64 {
            inbox_messages::table
                .filter(inbox_messages::handler.eq(handler))
                .filter(inbox_messages::message_id.eq(id))
                .count()
                .get_result(conn)
                .expect("count inbox rows")
        }

        /// The age of `(handler, id)`'s `received_at` by the database clock,
        /// in microseconds.
        pub fn received_age_micros(conn: &mut Conn, handler: &str, id: &str) -> i64 {
            inbox_messages::table
                .filter(inbox_messages::handler.eq(handler))
                .filter(inbox_messages::message_id.eq(id))
                .select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                    dialect::RECEIVED_AGE_MICROS_SQL,
                ))
                .first(conn)
                .expect("read received_at")
        }

        /// Whether Diesel believes a transaction is open on `conn`.
        pub fn in_transaction(conn: &mut Conn) -> bool {
            <Conn as Connection>::TransactionManager::transaction_manager_status_mut(conn)
                .transaction_depth()
                .expect("the transaction manager is not broken")
                .is_some()
        }

        /// Asserts `conn` is idle and usable: no transaction left open, and a
        /// new transaction commits.
        pub fn assert_connection_usable(conn: &mut Conn) {
            assert!(!in_transaction(conn), "a transaction was left open");
            let one: i32 = conn
                .transaction(|conn| {
                    diesel::select(diesel::dsl::sql::<diesel::sql_types::Integer>("1"))
                        .get_result(conn)
                })
                .expect("a new transaction works");
            assert_eq!(one, 1);
            assert!(!in_transaction(conn));
        }

        /// A validated claim key.
        pub fn key(handler: &'static str, id: &str) -> inbox_runtime::ClaimKey {
            inbox_runtime::ClaimKey::new(
                inbox_runtime::HandlerName::new(handler).expect("a valid handler name"),
                id,
            )
            .expect("a valid id")
        }
    };
}

/// An empty inbox, for `assert_eq!`.
pub const NO_ROWS: Vec<(String, String)> = Vec::new();
/// No effects, for `assert_eq!`.
pub const NO_EFFECTS: Vec<(String, String, String)> = Vec::new();

/// Keeps the deliberate panics of the panic tests (caught and checked by
/// the tests) out of the output; every other panic is reported as usual.
pub fn quiet_deliberate_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<DeliberatePanic>().is_none() {
                report(info);
            }
        }));
    });
}
