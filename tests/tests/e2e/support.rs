//! What every test shares: the messages, the error type, the effects
//! table and the queries on it and on the inbox ([`Effects`]), a fresh
//! database per test ([`fresh`]), a std-only shuffle.

use std::cell::Cell;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, Sender};

use diesel::connection::{LoadConnection, TransactionManager};
use diesel::prelude::*;
use diesel::query_dsl::LoadQuery;
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::r2d2::{ConnectionManager, PooledConnection, R2D2Connection};
use diesel::sql_types::{BigInt, Integer};
use diesel_migrations::MigrationHarness;
use inbox_runtime::InboxBackend;
use inbox_runtime::migrations::EmbeddedInboxMigrations;
use inbox_tests::{DieselBackend, TestBackend};

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
            Err(AppError::Failed("the message failed an application check"))
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

/// A message whose id may be absent (`MessageId` for `Option`), with a
/// second id as raw bytes, such as a Kafka header (`MessageId` for `[u8]`).
/// `runs` counts how often a body ran for this delivery.
pub struct Optional {
    pub id: Option<String>,
    pub header: Option<Vec<u8>>,
    pub runs: Cell<u32>,
}

impl Optional {
    pub fn new(id: Option<&str>, header: Option<&[u8]>) -> Self {
        Optional {
            id: id.map(str::to_owned),
            header: header.map(<[u8]>::to_vec),
            runs: Cell::new(0),
        }
    }

    /// Counts a run of a body.
    pub fn ran(&self) {
        self.runs.set(self.runs.get() + 1);
    }
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

diesel::table! {
    /// The inbox's columns the tests read (the table is the runtime's).
    inbox_messages (handler, message_id) {
        handler -> Text,
        message_id -> Text,
    }
}

/// The queries the tests run, written once with Diesel's query builder
/// (`#[auto_type]` names their types for [`Effects`]' bounds).
mod queries {
    use diesel::dsl::auto_type;
    use diesel::prelude::*;
    use diesel::sql_types::BigInt;

    use super::{effects, inbox_messages};

    /// `INSERT INTO effects …` of one row.
    pub type InsertEffect = diesel::dsl::Values<
        diesel::dsl::insert_into<effects::table>,
        (
            diesel::dsl::Eq<effects::handler, String>,
            diesel::dsl::Eq<effects::message_id, String>,
            diesel::dsl::Eq<effects::worker, i32>,
            diesel::dsl::Eq<effects::note, String>,
        ),
    >;

    pub fn insert_effect(handler: &str, id: &str, worker: i32, note: &str) -> InsertEffect {
        diesel::insert_into(effects::table).values((
            effects::handler.eq(handler.to_owned()),
            effects::message_id.eq(id.to_owned()),
            effects::worker.eq(worker),
            effects::note.eq(note.to_owned()),
        ))
    }

    #[auto_type]
    pub fn effects_for<'a>(id: &'a str) -> _ {
        effects::table.filter(effects::message_id.eq(id)).count()
    }

    #[auto_type]
    pub fn effects_by<'a>(handler: &'a str, id: &'a str) -> _ {
        effects::table
            .filter(effects::handler.eq(handler))
            .filter(effects::message_id.eq(id))
            .count()
    }

    #[auto_type]
    pub fn all_effects() -> _ {
        effects::table.select((effects::handler, effects::message_id, effects::note))
    }

    #[auto_type]
    pub fn inbox_rows() -> _ {
        inbox_messages::table.select((inbox_messages::handler, inbox_messages::message_id))
    }

    #[auto_type]
    pub fn inbox_count<'a>(handler: &'a str, id: &'a str) -> _ {
        inbox_messages::table
            .filter(inbox_messages::handler.eq(handler))
            .filter(inbox_messages::message_id.eq(id))
            .count()
    }

    #[auto_type]
    pub fn effects_total() -> _ {
        effects::table.count()
    }

    /// `SELECT <sql>`, an expression of type `ST`.
    pub type SelectSql<ST> = diesel::dsl::select<diesel::expression::SqlLiteral<ST>>;

    /// The inbox row `(handler, id)`'s `<sql>`.
    pub type InboxRowSql<'a, ST> = diesel::dsl::Limit<
        diesel::dsl::Select<
            diesel::dsl::Filter<
                diesel::dsl::Filter<
                    inbox_messages::table,
                    diesel::dsl::Eq<inbox_messages::handler, &'a str>,
                >,
                diesel::dsl::Eq<inbox_messages::message_id, &'a str>,
            >,
            diesel::expression::SqlLiteral<ST>,
        >,
    >;

    pub fn inbox_row_sql<'a>(handler: &'a str, id: &'a str, sql: &str) -> InboxRowSql<'a, BigInt> {
        inbox_messages::table
            .filter(inbox_messages::handler.eq(handler))
            .filter(inbox_messages::message_id.eq(id))
            .select(diesel::dsl::sql::<BigInt>(sql))
            .limit(1)
    }
}

/// A connection the tests can read and write their tables on: every
/// backend's connection, and a pooled one. The methods are the suite's
/// queries; the bounds of its one (blanket) implementation name what Diesel
/// needs of a connection to run them, so no test or handler repeats them.
pub trait Effects: diesel::connection::LoadConnection<Backend: InboxBackend> {
    /// The effect of a handler body: one row in `effects`.
    fn record_effect(
        &mut self,
        handler: &str,
        id: &str,
        worker: i32,
        note: &str,
    ) -> QueryResult<()>;

    /// How many effects were recorded for `id` (by any handler).
    fn effects_for(&mut self, id: &str) -> i64;

    /// How many effects `handler` recorded for `id`.
    fn effects_by(&mut self, handler: &str, id: &str) -> i64;

    /// How many effects were recorded in all.
    fn effects_total(&mut self) -> i64;

    /// Every effect as `(handler, message_id, note)`, sorted.
    fn all_effects(&mut self) -> Vec<(String, String, String)>;

    /// Every inbox row as `(handler, message_id)`, sorted bytewise.
    fn inbox_rows(&mut self) -> Vec<(String, String)>;

    /// How many inbox rows hold exactly `(handler, id)`.
    fn inbox_count(&mut self, handler: &str, id: &str) -> i64;

    /// `(handler, id)`'s `age_sql` (a `BIGINT` expression over the row).
    fn inbox_row_i64(&mut self, handler: &str, id: &str, age_sql: &str) -> i64;

    /// `SELECT <sql>`, an `INTEGER` expression.
    fn select_i32(&mut self, sql: &str) -> QueryResult<i32>;
}

impl<C> Effects for C
where
    C: LoadConnection<Backend: InboxBackend>,
    queries::InsertEffect: ExecuteDsl<C>,
    for<'a> queries::effects_for<'a>: LoadQuery<'a, C, i64>,
    for<'a> queries::effects_by<'a>: LoadQuery<'a, C, i64>,
    for<'a> queries::effects_total: LoadQuery<'a, C, i64>,
    for<'a> queries::all_effects: LoadQuery<'a, C, (String, String, String)>,
    for<'a> queries::inbox_rows: LoadQuery<'a, C, (String, String)>,
    for<'a> queries::inbox_count<'a>: LoadQuery<'a, C, i64>,
    for<'a> queries::InboxRowSql<'a, BigInt>: LoadQuery<'a, C, i64>,
    for<'a> queries::SelectSql<Integer>: LoadQuery<'a, C, i32>,
{
    fn record_effect(
        &mut self,
        handler: &str,
        id: &str,
        worker: i32,
        note: &str,
    ) -> QueryResult<()> {
        queries::insert_effect(handler, id, worker, note)
            .execute(self)
            .map(drop)
    }

    fn effects_for(&mut self, id: &str) -> i64 {
        queries::effects_for(id)
            .get_result(self)
            .expect("count effects")
    }

    fn effects_by(&mut self, handler: &str, id: &str) -> i64 {
        queries::effects_by(handler, id)
            .get_result(self)
            .expect("count effects")
    }

    fn effects_total(&mut self) -> i64 {
        queries::effects_total()
            .get_result(self)
            .expect("count effects")
    }

    fn all_effects(&mut self) -> Vec<(String, String, String)> {
        let mut rows: Vec<(String, String, String)> =
            queries::all_effects().load(self).expect("read effects");
        rows.sort();
        rows
    }

    fn inbox_rows(&mut self) -> Vec<(String, String)> {
        let mut rows: Vec<(String, String)> =
            queries::inbox_rows().load(self).expect("read the inbox");
        rows.sort();
        rows
    }

    fn inbox_count(&mut self, handler: &str, id: &str) -> i64 {
        queries::inbox_count(handler, id)
            .get_result(self)
            .expect("count inbox rows")
    }

    fn inbox_row_i64(&mut self, handler: &str, id: &str, sql: &str) -> i64 {
        queries::inbox_row_sql(handler, id, sql)
            .get_result(self)
            .expect("read the inbox row")
    }

    fn select_i32(&mut self, sql: &str) -> QueryResult<i32> {
        diesel::select(diesel::dsl::sql::<Integer>(sql)).get_result(self)
    }
}

/// A backend the suite runs on: its connections (and pooled ones) are
/// [`Effects`] connections, and its inbox has the embedded migrations.
pub trait E2e: TestBackend<Connection: E2eConnection<Self>> {}

impl<B: TestBackend<Connection: E2eConnection<B>>> E2e for B {}

/// What [`E2e`] needs of a backend's connection.
pub trait E2eConnection<B: TestBackend>:
    Effects
    + R2D2Connection
    + MigrationHarness<DieselBackend<B>>
    + Connection<Backend: EmbeddedInboxMigrations>
{
}

impl<B, C> E2eConnection<B> for C
where
    B: TestBackend,
    C: Effects
        + R2D2Connection
        + MigrationHarness<DieselBackend<B>>
        + Connection<Backend: EmbeddedInboxMigrations>,
{
}

/// A connection from an r2d2 pool of `B`.
pub type Pooled<B> = PooledConnection<ConnectionManager<<B as TestBackend>::Connection>>;

/// A fresh database (inbox and effects tables) and a connection to it, or
/// `None` after the harness's `skipped:` line.
pub fn fresh<B: E2e>() -> Option<(B, B::Connection)> {
    quiet_deliberate_panics();
    B::open_with_effects(&effects_ddl::<B>())
}

/// The effects table, its text columns of the backend's exact type.
pub fn effects_ddl<B: TestBackend>() -> String {
    let text = B::EXACT_TEXT_TYPE;
    let engine = if B::NAME == "mysql" {
        " ENGINE = InnoDB"
    } else {
        ""
    };
    format!(
        "CREATE TABLE effects (
        handler    {text} NOT NULL,
        message_id {text} NOT NULL,
        worker     INTEGER NOT NULL,
        note       {text} NOT NULL
    ){engine}"
    )
}

/// The age of `(handler, id)`'s `received_at` by the database clock, in
/// microseconds.
pub fn received_age_micros<B: E2e>(conn: &mut B::Connection, handler: &str, id: &str) -> i64 {
    conn.inbox_row_i64(handler, id, B::RECEIVED_AGE_MICROS_SQL)
}

/// Whether Diesel believes a transaction is open on `conn`.
pub fn in_transaction<C: Connection>(conn: &mut C) -> bool {
    C::TransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .expect("the transaction manager is not broken")
        .is_some()
}

/// Asserts `conn` is idle and usable: no transaction left open, and a new
/// transaction commits.
pub fn assert_connection_usable<C: Effects>(conn: &mut C) {
    assert!(!in_transaction(conn), "a transaction was left open");
    let one: i32 = conn
        .transaction(|conn| conn.select_i32("1"))
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
