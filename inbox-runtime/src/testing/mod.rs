//! Proving in your own tests that a handler is idempotent (feature
//! `testing`).
//!
//! [`assert_idempotent`] delivers one message twice through your closure
//! (which calls your `#[idempotent]` handler) and checks what the database
//! says about it:
//!
//! 1. **No write escapes the handler's transaction.** A *probe* delivery
//!    runs first inside a transaction the check opens on your connection
//!    (the handler's own transaction becomes a savepoint of it), which is
//!    then rolled back. Every table must be as it was before: a table that
//!    changed kept a write through a second connection or a pool, which no
//!    rollback undoes ([`IdempotenceViolation::WroteOutsideTransaction`]).
//! 2. **The first delivery is processed**: it adds a row to
//!    `inbox_messages` (the claim commits only with the effects). A handler
//!    the attribute does not wrap claims nothing
//!    ([`IdempotenceViolation::NotProcessed`]).
//! 3. **The second delivery is a duplicate**: it adds no row to
//!    `inbox_messages` ([`IdempotenceViolation::NotDuplicate`]: an id that
//!    differs per delivery) and **changes nothing**: a digest of every table
//!    is the same before and after it
//!    ([`IdempotenceViolation::ChangedOnDuplicate`]: something around the
//!    handler writes whether or not the message is new).
//!
//! "Every table" means the base tables of the connection's current schema
//! (PostgreSQL, `current_schema()`), database (MySQL/MariaDB,
//! `DATABASE()`) or SQLite file (its `main` database), the inbox's own
//! included and Diesel's `__diesel_schema_migrations` left out; with
//! [`Idempotence::tables`] you name the tables instead. A table's digest is
//! its row count and a hash of its rows as a multiset (PostgreSQL: md5 of
//! the sorted md5s of `ROW(t.*)::text`; MySQL: sums of each row's MD5 of its
//! `QUOTE`d columns; SQLite: the sorted `quote()`d rows, hashed by the
//! check). What the handler does outside the database (HTTP calls,
//! e-mails, other databases, sequences, files) is not seen.
//!
//! On diesel-async connections (features `testing` and `async`),
//! `check_idempotent_async`, `assert_idempotent_async` and
//! `Idempotence::check_async` take an async closure
//! (`async |conn| handler(conn, &msg).await`) and do the same.
//!
//! The check commits real deliveries: run it on a test database, on a
//! connection with no transaction open (not inside
//! `begin_test_transaction`), with a message whose id the inbox does not
//! hold yet.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use diesel::prelude::*;
//! use inbox_runtime::idempotent;
//! use inbox_runtime::testing::assert_idempotent;
//!
//! struct Deposit { id: String, cents: i64 }
//!
//! #[idempotent(id = msg.id, handler = "bank.deposit")]
//! fn deposit(conn: &mut SqliteConnection, msg: &Deposit) -> QueryResult<()> {
//!     diesel::sql_query("UPDATE account SET cents = cents + ?")
//!         .bind::<diesel::sql_types::BigInt, _>(msg.cents)
//!         .execute(conn)?;
//!     Ok(())
//! }
//!
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! inbox_runtime::setup(&mut conn)?;
//! diesel::sql_query("CREATE TABLE account (cents BIGINT NOT NULL)").execute(&mut conn)?;
//! diesel::sql_query("INSERT INTO account VALUES (0)").execute(&mut conn)?;
//!
//! let msg = Deposit { id: "dep-1".into(), cents: 250 };
//! assert_idempotent(&mut conn, |conn| deposit(conn, &msg));
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::panic::{self, AssertUnwindSafe};

use diesel::connection::{LoadConnection, TransactionManager};

#[cfg(feature = "async")]
mod asynchronous;
mod digest;

#[cfg(feature = "async")]
pub use self::asynchronous::{assert_idempotent_async, check_idempotent_async};

pub use self::digest::DigestBackend;
use self::digest::sealed::Digest as _;
use self::digest::{Digest, Selection, TableName};

/// Checks that `deliver` (one delivery of one message, through your
/// `#[idempotent]` handler) is idempotent, comparing every table of the
/// current schema or database; see the [module documentation](self) for
/// what is checked and how.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::testing::{check_idempotent, IdempotenceViolation};
///
/// // Not annotated: it writes on every delivery and claims nothing.
/// fn log_visit(conn: &mut SqliteConnection, page: &str) -> QueryResult<()> {
///     diesel::sql_query("INSERT INTO visits VALUES (?)")
///         .bind::<diesel::sql_types::Text, _>(page)
///         .execute(conn)?;
///     Ok(())
/// }
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// diesel::sql_query("CREATE TABLE visits (page TEXT NOT NULL)").execute(&mut conn)?;
///
/// let result = check_idempotent(&mut conn, |conn| log_visit(conn, "/home"));
/// assert!(matches!(result, Err(IdempotenceViolation::NotProcessed { new_claims: 0 })));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn check_idempotent<C, F, R, E>(
    conn: &mut C,
    deliver: F,
) -> Result<IdempotenceReport, IdempotenceViolation>
where
    C: LoadConnection,
    C::Backend: DigestBackend,
    F: FnMut(&mut C) -> Result<R, E>,
    E: fmt::Display,
{
    Idempotence::new().check(conn, deliver)
}

/// [`check_idempotent`] comparing only `tables` (`"payments"`, or
/// `"schema.payments"`; names as the database stores them): for a database
/// whose other tables change on their own while the test runs, or are too
/// big to read twice. The claim is still counted in `inbox_messages`.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::idempotent;
/// use inbox_runtime::testing::check_idempotent_in_tables;
///
/// struct Deposit { id: String }
///
/// #[idempotent(id = msg.id, handler = "bank.deposit.2")]
/// fn deposit(conn: &mut SqliteConnection, msg: &Deposit) -> QueryResult<()> {
///     diesel::sql_query("UPDATE account SET cents = cents + 1").execute(conn)?;
///     Ok(())
/// }
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// diesel::sql_query("CREATE TABLE account (cents BIGINT NOT NULL)").execute(&mut conn)?;
///
/// let msg = Deposit { id: "dep-1".into() };
/// let report = check_idempotent_in_tables(&mut conn, &["account"], |conn| deposit(conn, &msg))?;
/// assert_eq!(report.tables, ["account"]);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn check_idempotent_in_tables<C, F, R, E>(
    conn: &mut C,
    tables: &[&str],
    deliver: F,
) -> Result<IdempotenceReport, IdempotenceViolation>
where
    C: LoadConnection,
    C::Backend: DigestBackend,
    F: FnMut(&mut C) -> Result<R, E>,
    E: fmt::Display,
{
    Idempotence::new()
        .tables(tables.iter().copied())
        .check(conn, deliver)
}

/// [`check_idempotent`], panicking with the violation's sentence (what went
/// wrong and what to fix): the form for a `#[test]`.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{idempotent, Outcome};
/// use inbox_runtime::testing::assert_idempotent;
///
/// struct Greet { id: u64 }
///
/// #[idempotent(id = msg.id, handler = "greeter")]
/// fn greet(conn: &mut SqliteConnection, msg: &Greet) -> QueryResult<Outcome<u64>> {
///     diesel::sql_query("INSERT INTO greetings VALUES ('hello')").execute(conn)?;
///     Ok(Outcome::Processed(msg.id))
/// }
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// diesel::sql_query("CREATE TABLE greetings (text TEXT NOT NULL)").execute(&mut conn)?;
///
/// let report = assert_idempotent(&mut conn, |conn| greet(conn, &Greet { id: 7 }));
/// assert!(report.tables.iter().any(|table| table == "greetings"));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[track_caller]
pub fn assert_idempotent<C, F, R, E>(conn: &mut C, deliver: F) -> IdempotenceReport
where
    C: LoadConnection,
    C::Backend: DigestBackend,
    F: FnMut(&mut C) -> Result<R, E>,
    E: fmt::Display,
{
    Idempotence::new().assert(conn, deliver)
}

/// The check with its settings: which tables to compare.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::idempotent;
/// use inbox_runtime::testing::Idempotence;
///
/// struct Deposit { id: String }
///
/// #[idempotent(id = msg.id, handler = "bank.deposit.3")]
/// fn deposit(conn: &mut SqliteConnection, msg: &Deposit) -> QueryResult<()> {
///     diesel::sql_query("UPDATE account SET cents = cents + 1").execute(conn)?;
///     Ok(())
/// }
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// diesel::sql_query("CREATE TABLE account (cents BIGINT NOT NULL)").execute(&mut conn)?;
///
/// let msg = Deposit { id: "dep-1".into() };
/// Idempotence::new()
///     .tables(["account", "inbox_messages"])
///     .assert(&mut conn, |conn| deposit(conn, &msg));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Idempotence {
    selection: Selection,
}

impl Default for Idempotence {
    fn default() -> Self {
        Self::new()
    }
}

impl Idempotence {
    /// Compares every base table of the current schema (PostgreSQL),
    /// database (MySQL/MariaDB) or SQLite file, listed again at every
    /// comparison (a table created or dropped shows as changed).
    ///
    /// ```
    /// let _check = inbox_runtime::testing::Idempotence::new();
    /// ```
    pub fn new() -> Self {
        Idempotence {
            selection: Selection::All,
        }
    }

    /// Compares only these tables: `"payments"` (in the current schema or
    /// database) or `"schema.payments"`, each part as the database stores
    /// it (quoted when read: PostgreSQL's unquoted names are lower case). A
    /// table named twice is compared once; one that does not exist makes
    /// the check fail with [`IdempotenceViolation::Database`].
    ///
    /// ```
    /// let _check = inbox_runtime::testing::Idempotence::new().tables(["payments", "ledger"]);
    /// ```
    pub fn tables<I, S>(mut self, tables: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut named: Vec<TableName> = tables
            .into_iter()
            .map(|table| TableName::parse(table.as_ref()))
            .collect();
        named.sort();
        named.dedup();
        self.selection = Selection::Named(named);
        self
    }

    /// Runs the check: the probe, then two deliveries through `deliver`
    /// (see the [module documentation](self)). `Ok` when the handler passed
    /// every step, else the first [`IdempotenceViolation`] found.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use diesel::prelude::*;
    /// use inbox_runtime::testing::{Idempotence, IdempotenceViolation};
    ///
    /// let mut conn = SqliteConnection::establish(":memory:")?;
    /// inbox_runtime::setup(&mut conn)?;
    /// let failing = |_: &mut SqliteConnection| Err::<(), _>("the broker is down");
    /// let violation = Idempotence::new().check(&mut conn, failing).unwrap_err();
    /// assert!(matches!(violation, IdempotenceViolation::DeliveryFailed { .. }));
    /// assert!(violation.to_string().contains("the broker is down"));
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check<C, F, R, E>(
        &self,
        conn: &mut C,
        mut deliver: F,
    ) -> Result<IdempotenceReport, IdempotenceViolation>
    where
        C: LoadConnection,
        C::Backend: DigestBackend,
        F: FnMut(&mut C) -> Result<R, E>,
        E: fmt::Display,
    {
        no_hidden_errors()?;
        no_transaction_open(conn)?;

        // 1. The probe: a delivery inside a transaction that rolls back.
        let before_probe = self.digest(conn, "before the probe")?;
        probe(conn, &mut deliver)?;
        let after_probe = self.digest(conn, "after the probe")?;
        let escaped = changes(&before_probe, &after_probe);
        if !escaped.is_empty() {
            return Err(IdempotenceViolation::WroteOutsideTransaction { tables: escaped });
        }

        // 2. The first delivery: processed, so one more claim.
        let claims_before = count_claims(conn, "before the first delivery")?;
        deliver(conn).map_err(|error| IdempotenceViolation::DeliveryFailed {
            delivery: Delivery::First,
            error: error.to_string(),
        })?;
        let claims_after_first = count_claims(conn, "after the first delivery")?;
        let new_claims = claims_after_first - claims_before;
        if new_claims <= 0 {
            return Err(IdempotenceViolation::NotProcessed { new_claims });
        }

        // 3. The second delivery: a duplicate, which changes nothing.
        let before_second = self.digest(conn, "before the second delivery")?;
        deliver(conn).map_err(|error| IdempotenceViolation::DeliveryFailed {
            delivery: Delivery::Second,
            error: error.to_string(),
        })?;
        let claims_after_second = count_claims(conn, "after the second delivery")?;
        if claims_after_second != claims_after_first {
            return Err(IdempotenceViolation::NotDuplicate {
                new_claims: claims_after_second - claims_after_first,
            });
        }
        let after_second = self.digest(conn, "after the second delivery")?;
        let changed = changes(&before_second, &after_second);
        if !changed.is_empty() {
            return Err(IdempotenceViolation::ChangedOnDuplicate { tables: changed });
        }

        Ok(IdempotenceReport {
            tables: after_second.keys().cloned().collect(),
            claims: new_claims,
        })
    }

    /// [`check`](Self::check), panicking with the violation's sentence.
    ///
    /// ```should_panic
    /// # #[cfg(feature = "sqlite")] {
    /// use diesel::prelude::*;
    /// use inbox_runtime::testing::Idempotence;
    ///
    /// let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// inbox_runtime::setup(&mut conn).unwrap();
    /// // Claims nothing: "the first delivery did not claim its message id …"
    /// Idempotence::new().assert(&mut conn, |_: &mut SqliteConnection| Ok::<(), String>(()));
    /// # }
    /// # #[cfg(not(feature = "sqlite"))] panic!();
    /// ```
    #[track_caller]
    pub fn assert<C, F, R, E>(&self, conn: &mut C, deliver: F) -> IdempotenceReport
    where
        C: LoadConnection,
        C::Backend: DigestBackend,
        F: FnMut(&mut C) -> Result<R, E>,
        E: fmt::Display,
    {
        match self.check(conn, deliver) {
            Ok(report) => report,
            Err(violation) => panic!("idempotence check failed: {violation}"),
        }
    }

    /// The digest of the selected tables, now.
    fn digest<C>(&self, conn: &mut C, during: &'static str) -> Result<Digest, IdempotenceViolation>
    where
        C: LoadConnection,
        C::Backend: DigestBackend,
    {
        let database = |error| IdempotenceViolation::Database {
            during: format!("reading the tables {during}"),
            error,
        };
        let listed;
        let tables = match &self.selection {
            Selection::Named(tables) => tables,
            Selection::All => {
                listed = C::Backend::tables(conn).map_err(database)?;
                &listed
            }
        };
        let mut digest = Digest::new();
        for table in tables {
            let table_digest =
                C::Backend::digest_table(conn, table).map_err(reading_table(table, during))?;
            digest.insert(table.label.clone(), table_digest);
        }
        Ok(digest)
    }
}

/// Refuses a program whose handlers' error types hide the inbox's errors.
pub(crate) fn no_hidden_errors() -> Result<(), IdempotenceViolation> {
    let hidden = crate::registry::hidden_errors();
    if hidden.is_empty() {
        return Ok(());
    }
    Err(IdempotenceViolation::HiddenErrors {
        handlers: hidden.iter().map(ToString::to_string).collect(),
    })
}

/// Refuses a connection inside a transaction: the probe must be able to
/// roll back the outermost transaction, and the deliveries must commit.
fn no_transaction_open<C>(conn: &mut C) -> Result<(), IdempotenceViolation>
where
    C: LoadConnection,
{
    no_transaction_in(C::TransactionManager::transaction_manager_status_mut(conn))
}

/// [`no_transaction_open`] on a connection's transaction status (blocking
/// or diesel-async).
pub(crate) fn no_transaction_in(
    status: &mut diesel::connection::TransactionManagerStatus,
) -> Result<(), IdempotenceViolation> {
    let depth = status
        .transaction_depth()
        .map_err(|error| IdempotenceViolation::Database {
            during: "reading the connection's transaction state".to_owned(),
            error,
        })?;
    match depth {
        None => Ok(()),
        Some(depth) => Err(IdempotenceViolation::TransactionOpen { depth: depth.get() }),
    }
}

/// The error of reading `table`'s digest `during` a step of the check.
pub(crate) fn reading_table(
    table: &TableName,
    during: &str,
) -> impl FnOnce(diesel::result::Error) -> IdempotenceViolation {
    let during = format!("reading table `{}` {during}", table.label);
    move |error| IdempotenceViolation::Database { during, error }
}

/// One delivery inside a transaction of the check's own, rolled back
/// whatever happens (a panic is resumed after the rollback).
fn probe<C, F, R, E>(conn: &mut C, deliver: &mut F) -> Result<(), IdempotenceViolation>
where
    C: LoadConnection,
    F: FnMut(&mut C) -> Result<R, E>,
    E: fmt::Display,
{
    C::TransactionManager::begin_transaction(conn).map_err(|error| {
        IdempotenceViolation::Database {
            during: "opening the probe's transaction".to_owned(),
            error,
        }
    })?;
    let delivered = panic::catch_unwind(AssertUnwindSafe(|| {
        deliver(conn).map(drop).map_err(|error| error.to_string())
    }));
    let rolled_back = C::TransactionManager::rollback_transaction(conn);
    let delivered = match delivered {
        Ok(delivered) => delivered,
        Err(panic) => panic::resume_unwind(panic),
    };
    // The delivery's failure explains a failed rollback better than the
    // rollback's own error does.
    if let Err(error) = delivered {
        return Err(IdempotenceViolation::DeliveryFailed {
            delivery: Delivery::Probe,
            error,
        });
    }
    rolled_back.map_err(|error| IdempotenceViolation::Database {
        during: "rolling back the probe's transaction".to_owned(),
        error,
    })
}

fn count_claims<C>(conn: &mut C, during: &'static str) -> Result<i64, IdempotenceViolation>
where
    C: LoadConnection,
    C::Backend: DigestBackend,
{
    C::Backend::count_claims(conn).map_err(|error| IdempotenceViolation::Database {
        during: format!("counting the rows of inbox_messages {during}"),
        error,
    })
}

/// The tables whose digest differs between `before` and `after`, or that
/// are in only one of them.
fn changes(before: &Digest, after: &Digest) -> Vec<TableChange> {
    let mut names: Vec<&String> = before.keys().chain(after.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|name| before.get(*name) != after.get(*name))
        .map(|name| TableChange {
            table: name.clone(),
            rows_before: before.get(name).map(|digest| digest.rows),
            rows_after: after.get(name).map(|digest| digest.rows),
        })
        .collect()
}

/// What a check that passed compared.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{idempotent, testing::check_idempotent};
///
/// #[idempotent(id = id, handler = "noop")]
/// fn noop(conn: &mut SqliteConnection, id: &str) -> QueryResult<()> { Ok(()) }
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let report = check_idempotent(&mut conn, |conn| noop(conn, "m-1"))?;
/// assert_eq!(report.claims, 1);
/// assert!(report.tables.iter().any(|table| table == "inbox_messages"));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdempotenceReport {
    /// The tables compared, sorted.
    pub tables: Vec<String>,
    /// The rows the first delivery added to `inbox_messages`: 1 for one
    /// handler, more for a delivery that runs several.
    pub claims: i64,
}

/// A table whose contents changed where nothing may change.
///
/// ```
/// use inbox_runtime::testing::TableChange;
///
/// let change = TableChange { table: "ledger".into(), rows_before: Some(1), rows_after: Some(2) };
/// assert_eq!(change.to_string(), "`ledger` (1 row before, 2 after)");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableChange {
    /// The table, as listed or as named in [`Idempotence::tables`].
    pub table: String,
    /// Its rows before (`None`: it did not exist).
    pub rows_before: Option<i64>,
    /// Its rows after (`None`: it no longer exists).
    pub rows_after: Option<i64>,
}

impl fmt::Display for TableChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows = |n: i64| {
            if n == 1 {
                "1 row".to_owned()
            } else {
                format!("{n} rows")
            }
        };
        match (self.rows_before, self.rows_after) {
            (None, _) => write!(f, "`{}` (created)", self.table),
            (_, None) => write!(f, "`{}` (dropped)", self.table),
            (Some(before), Some(after)) if before == after => {
                write!(f, "`{}` ({}, contents changed)", self.table, rows(before))
            }
            (Some(before), Some(after)) => {
                write!(
                    f,
                    "`{}` ({} before, {after} after)",
                    self.table,
                    rows(before)
                )
            }
        }
    }
}

/// Which of the check's deliveries failed.
///
/// ```
/// use inbox_runtime::testing::Delivery;
/// assert_eq!(Delivery::Second.to_string(), "the second (duplicate) delivery");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The probe's, inside a transaction the check rolls back.
    Probe,
    /// The first, which must process the message.
    First,
    /// The second, which must be a duplicate.
    Second,
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Delivery::Probe => "the probe delivery",
            Delivery::First => "the first delivery",
            Delivery::Second => "the second (duplicate) delivery",
        })
    }
}

/// Why a handler is not idempotent, or why the check could not tell; its
/// `Display` is a sentence saying what went wrong and what to fix.
///
/// ```
/// use inbox_runtime::testing::{IdempotenceViolation, TableChange};
///
/// let violation = IdempotenceViolation::ChangedOnDuplicate {
///     tables: vec![TableChange { table: "ledger".into(), rows_before: Some(1), rows_after: Some(2) }],
/// };
/// assert!(violation.to_string().starts_with("the second delivery of the same message changed `ledger`"));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum IdempotenceViolation {
    /// The first delivery added no row to `inbox_messages`: the handler ran
    /// without the inbox (not annotated with `#[idempotent]`, or not called
    /// by the delivery), or the inbox already held the message's id.
    NotProcessed {
        /// The rows it added (0, or fewer when it deleted claims).
        new_claims: i64,
    },
    /// The second delivery of the same message added rows to
    /// `inbox_messages`: it was processed again, under a different id or
    /// handler name.
    NotDuplicate {
        /// The rows it added.
        new_claims: i64,
    },
    /// The second delivery changed these tables, although the handler saw a
    /// duplicate: something writes whether the message is new or not.
    ChangedOnDuplicate {
        /// What changed.
        tables: Vec<TableChange>,
    },
    /// These tables changed although the transaction the probe delivery ran
    /// in was rolled back: written outside the handler's transaction
    /// (through a second connection or a pool).
    WroteOutsideTransaction {
        /// What changed.
        tables: Vec<TableChange>,
    },
    /// A delivery returned an error. Inside the probe, a handler that writes
    /// through a second connection is the likely cause: it waits for locks
    /// the probe's transaction holds (SQLite: `database is locked`).
    DeliveryFailed {
        /// Which delivery.
        delivery: Delivery,
        /// Its error's `Display`.
        error: String,
    },
    /// The connection already had a transaction open: the probe must roll
    /// back an outermost transaction of its own and the deliveries must
    /// commit, so the check runs on a connection outside any transaction
    /// (not inside `begin_test_transaction`).
    TransactionOpen {
        /// The open transaction's depth (1: a transaction, more: savepoints).
        depth: u32,
    },
    /// A handler of the program has an error type that hides the inbox's
    /// errors from [`ack_decision`](crate::ack_decision) (see
    /// [`registry::hidden_errors`](crate::registry::hidden_errors)): its
    /// deliveries' answers would read as its own failures, a message
    /// without an id retried forever. Checked before any delivery, over
    /// every handler linked into the test.
    HiddenErrors {
        /// Each handler and what its error type hides.
        handlers: Vec<String>,
    },
    /// Reading the tables or the inbox failed.
    Database {
        /// What the check was doing.
        during: String,
        /// Diesel's error.
        error: diesel::result::Error,
    },
}

fn list(tables: &[TableChange]) -> String {
    tables
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for IdempotenceViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdempotenceViolation::NotProcessed { new_claims } => write!(
                f,
                "the first delivery did not claim its message id ({new_claims} new rows in \
                 inbox_messages, 1 expected): the handler ran without the inbox. Annotate it \
                 with #[idempotent(id = …)] and make the delivery call it, and deliver a \
                 message whose id the inbox does not hold yet"
            ),
            IdempotenceViolation::NotDuplicate { new_claims } => write!(
                f,
                "the second delivery of the same message was processed again ({new_claims} new \
                 rows in inbox_messages, 0 expected): its id or handler name differs between \
                 deliveries. Take the id from the message as the producer assigned it (not \
                 generated, not a per-delivery field such as a delivery tag or a receive time) \
                 and give the handler a fixed name"
            ),
            IdempotenceViolation::ChangedOnDuplicate { tables } => write!(
                f,
                "the second delivery of the same message changed {}, although the handler \
                 skipped it as a duplicate: something writes whether the message is new or \
                 not. Move those writes into the #[idempotent] handler's body, or skip them \
                 when it returns Outcome::Duplicate",
                list(tables)
            ),
            IdempotenceViolation::WroteOutsideTransaction { tables } => write!(
                f,
                "{} changed although the transaction the delivery ran in was rolled back: the \
                 delivery wrote them outside the handler's transaction, through a second \
                 connection or a pool. Such writes are not undone when the handler fails and \
                 are repeated when the message is redelivered: write through the handler's \
                 connection parameter instead",
                list(tables)
            ),
            IdempotenceViolation::DeliveryFailed {
                delivery: Delivery::Probe,
                error,
            } => write!(
                f,
                "the probe delivery, run inside a transaction the check rolls back, failed: \
                 {error}. The likely cause is a handler that writes through a second \
                 connection or a pool, which waits for the locks the probe's transaction \
                 holds (SQLite: `database is locked`; MySQL/MariaDB: a lock wait timeout): \
                 write through the handler's connection parameter instead. A delivery that \
                 also fails outside a transaction fails here first"
            ),
            IdempotenceViolation::DeliveryFailed { delivery, error } => write!(
                f,
                "{delivery} failed: {error}. The check needs deliveries that succeed: a \
                 duplicate must return Ok (`()` or Outcome::Duplicate)"
            ),
            IdempotenceViolation::TransactionOpen { depth } => write!(
                f,
                "the connection is inside a transaction (depth {depth}): the check commits \
                 real deliveries and rolls back a transaction of its own, so run it on a \
                 connection with no transaction open (not inside begin_test_transaction), \
                 on a test database"
            ),
            IdempotenceViolation::HiddenErrors { handlers } => write!(
                f,
                "{} of the program would misread the inbox's answers: {}",
                if handlers.len() == 1 {
                    "a handler"
                } else {
                    "handlers"
                },
                handlers.join("; ")
            ),
            IdempotenceViolation::Database { during, error } => {
                write!(f, "the check failed {during}: {error}")
            }
        }
    }
}

impl std::error::Error for IdempotenceViolation {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            IdempotenceViolation::Database { error, .. } => Some(error),
            _ => None,
        }
    }
}
