//! PostgreSQL at scale: ids kept in generations that are dropped whole
//! instead of deleted row by row.
//!
//! # When to pick it
//!
//! Batched deletes ([`Prune`](crate::Prune)) are the default and are fine up
//! to tens of millions of rows: each batch is cheap, but every deleted row
//! still costs WAL, index maintenance and vacuum work, on the same table live
//! handlers write to. Pick the generation layout when the inbox takes
//! hundreds of messages per second or more with a window of days (100M+
//! rows), or when vacuum cannot keep up with the deletes: dropping a
//! generation is a catalog operation, whatever its size, and leaves no dead
//! rows behind. Stay with batches when you need per-handler windows (a
//! generation holds every handler's ids) or run PostgreSQL older than 14.
//!
//! # Why not range partitions on `received_at`
//!
//! PostgreSQL requires every unique constraint of a partitioned table to
//! include the partition key. Partitioning on `received_at` would make the
//! key `(handler, message_id, received_at)`, and since `received_at` is the
//! time of each delivery, a redelivery would get a key of its own and be
//! processed again: no deduplication at all, not even inside one partition.
//! The claim's `ON CONFLICT (handler, message_id)` also needs a unique index
//! on exactly those two columns.
//!
//! # How it works
//!
//! - `inbox_messages` stays a plain table holding the **current generation**,
//!   with the primary key `(handler, message_id)`: the claim statement and
//!   `#[idempotent]` handlers work unchanged.
//! - Earlier generations are partitions of `inbox_messages_archive`, one per
//!   generation (range-partitioned on a `generation` number; each generation
//!   covers a span of `received_at` recorded in `inbox_generations`).
//! - [`rotate`] (every `period`, done by [`Maintenance`]) renames the current
//!   table into the archive and creates an empty one. It waits for claims in
//!   progress and new claims queue behind it, for at most its lock timeout.
//!   [`Maintenance`] rotates only when the current generation is a period
//!   old, and checks that before it locks anything: a run with nothing to
//!   rotate never waits for a claim nor makes one wait. The next table always
//!   exists, so there is no "no partition for this row" outage to guard
//!   against by creating partitions ahead of time.
//! - A trigger on the current table looks each new id up in the archive (an
//!   index probe per generation) and skips the insert of an id found there:
//!   the claim reports [`Claim::Duplicate`](crate::Claim).
//! - [`drop_expired`] detaches (`DETACH PARTITION … CONCURRENTLY`, which
//!   blocks no claim) and drops every generation that ended before the
//!   window.
//!
//! # The guarantee
//!
//! A claim is a duplicate if the id was claimed in the current generation
//! (primary key, as in the plain layout) or in any archived generation not
//! yet dropped. A generation is dropped only once its *end* is older than the
//! window, so an id is kept for at least the window and at most the window
//! plus one period. Concurrent deliveries of one id across a rotation are
//! safe at every isolation level:
//! - `READ COMMITTED` (the default): the rotation waits for every claim of
//!   the old generation to finish, and a claim's trigger reads with a fresh
//!   snapshot, so it sees every id the rotation archived.
//! - `REPEATABLE READ` / `SERIALIZABLE`: a transaction whose snapshot
//!   predates the latest rotation could miss an id archived by it, so the
//!   trigger refuses it with a serialization failure (SQLSTATE `40001`)
//!   before anything else ran. `run_idempotent` (and so `#[idempotent]`)
//!   retries a claim that fails that way; a claim inside a transaction of
//!   your own is retried by retrying that transaction.
//!
//! The batched [`Prune`](crate::Prune) still works on this layout but only
//! reaches the current generation. [`teardown`] returns to the plain layout
//! (keeping every id); `inbox_runtime::schema::teardown` after it removes the
//! inbox altogether.
//!
//! # Schemas
//!
//! The layout lives in the schema of the inbox's `inbox_messages` table: the
//! one the connection's `search_path` finds first, where claims go.
//! [`is_partitioned`], [`generations`], [`rotate`], [`drop_expired`] and
//! [`Maintenance`] find that schema first and name every table and function
//! in it explicitly, and the layout's SQL functions run with their
//! `search_path` set to their own schema, so inboxes in two schemas of one
//! database never touch each other's generations, whatever a session's
//! `search_path`. ([`setup`] runs the migrations' SQL, which creates the
//! layout in the connection's current schema and fails when that is not the
//! schema of the `inbox_messages` it converts; [`teardown`] runs the
//! conversion's `down.sql` in the connection's search path.)
//!
//! # Operating it
//!
//! - Any number of nodes may run [`Maintenance`], directly or through a
//!   transaction pooler such as PgBouncer: one run at a time works, holding
//!   the layout's lease (a row in `inbox_maintenance_lease`, renewed as it
//!   goes; [`MAINTENANCE_LEASE`]), and the others return at once, not caught
//!   up. A run that died holds it until it expires.
//! - Run [`Maintenance`] well within the period (e.g. hourly for a 7-day
//!   window, whose default period is 3.5 days), from cron (`cargo run
//!   --example prune --features postgres -- --older-than 7d --generations 2`)
//!   or a `BackgroundPruner`.
//! - A due rotation waits for the claims in progress, and new claims wait
//!   behind it, for at most its lock timeout ([`DEFAULT_LOCK_TIMEOUT`]);
//!   handlers whose transactions last longer than that make it fail
//!   (reported, retried at the next run). Runs that find no rotation due take
//!   no lock. Watch [`generations`]: a current generation much older than
//!   the period means rotations keep failing.
//! - Every claim probes each archived generation's primary key, so
//!   [`Maintenance`] derives the period from the window: the window split
//!   into [`DEFAULT_GENERATIONS`] (at most [`MAX_GENERATIONS`]), never one
//!   generation per day of a long window. A claim then probes at most that
//!   number plus one, whatever the retention.
//! - The current table is the only one claims write to. With random ids
//!   (UUIDv4) its primary key takes a new leaf page per claim once it is
//!   larger than what one checkpoint interval's claims touch, and each such
//!   page costs a full-page image in the write-ahead log. BENCHMARKS.md
//!   ("Claim cost as the inbox grows") has the figures and the sizing.
//! - Converting takes one `ALTER TABLE` (see [`setup`]); filling through
//!   the trigger costs a little per claim.
//!
//! ```no_run
//! use std::time::Duration;
//! use diesel::{Connection, PgConnection};
//! use inbox_runtime::{RetentionPolicy, prune::partitioned};
//!
//! let mut conn = PgConnection::establish("postgres://localhost/app")?;
//! partitioned::setup(&mut conn)?; // plain schema + conversion, idempotent
//! // A 7-day window in 2 generations of 3.5 days: ids kept 7 to 10.5 days.
//! let maintenance = partitioned::Maintenance::new(RetentionPolicy::parse("7d", "2d")?)?;
//! // From cron or a BackgroundPruner: rotate when due, drop what expired.
//! let report = maintenance.run(&mut conn)?;
//! println!("{report}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::sql_types::{BigInt, Bool, Nullable, Text};
use diesel::{Connection, OptionalExtension, QueryableByName, RunQueryDsl};

use super::report::PartialReport;
use super::{PruneError, PruneReport};
use crate::backend::InboxBackend;
use crate::error::InboxError;
use crate::retention::{MAX_RETENTION, RetentionPolicy, RetentionProblem};

/// SQL converting the plain PostgreSQL inbox to the generation layout; safe
/// to run again. Needs the plain schema first (see [`setup`]). It is the
/// `up.sql` files of the layout's migrations, in order: the conversion, then
/// the current versions of its SQL functions.
///
/// ```
/// assert!(inbox_runtime::prune::partitioned::SETUP_SQL.contains("inbox_rotate"));
/// ```
pub const SETUP_SQL: &str = concat!(
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/postgres-partitioned/2026-12-02-000000_partition_inbox_messages/up.sql"
    )),
    "\n",
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/postgres-partitioned/2026-12-04-000000_maintenance_checks_before_locking/up.sql"
    )),
    "\n",
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/postgres-partitioned/2026-12-06-000001_generation_fingerprints_and_results/up.sql"
    )),
    "\n",
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/postgres-partitioned/2026-12-08-000000_maintenance_lease/up.sql"
    )),
);

/// SQL converting back to the plain layout; every archived id is copied
/// back into `inbox_messages` first, with its fingerprint and stored
/// result, so none is forgotten. (The `down.sql` of the conversion, which
/// also drops the functions as later migrations replaced them, after a copy
/// that keeps the 2026-12-06 columns: the conversion's own copy predates
/// them.)
///
/// ```
/// assert!(inbox_runtime::prune::partitioned::TEARDOWN_SQL.contains("inbox_messages_archive"));
/// ```
pub const TEARDOWN_SQL: &str = concat!(
    "DROP TRIGGER IF EXISTS inbox_messages_claim_guard ON inbox_messages;\n",
    "INSERT INTO inbox_messages (handler, message_id, received_at, fingerprint, result)\n",
    "    SELECT handler, message_id, received_at, fingerprint, result FROM inbox_messages_archive\n",
    "    ON CONFLICT (handler, message_id) DO NOTHING;\n",
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/postgres-partitioned/2026-12-08-000000_maintenance_lease/down.sql"
    )),
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/postgres-partitioned/2026-12-02-000000_partition_inbox_messages/down.sql"
    )),
);

/// The conversion as Diesel migrations (versions `20261202000000`,
/// `20261204000000`, `20261206000001` and `20261208000000`), to run after [`crate::migrations::POSTGRES`]. Users of
/// `diesel_cli` can copy `inbox-runtime/migrations/postgres-partitioned/`
/// next to the plain one.
///
/// ```no_run
/// use diesel::{Connection, PgConnection};
/// use diesel_migrations::MigrationHarness;
///
/// let mut conn = PgConnection::establish("postgres://localhost/app")?;
/// inbox_runtime::migrations::run_pending(&mut conn)?;
/// conn.run_pending_migrations(inbox_runtime::prune::partitioned::MIGRATIONS)?;
/// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
/// ```
#[cfg(feature = "migrations")]
pub const MIGRATIONS: diesel_migrations::EmbeddedMigrations =
    diesel_migrations::embed_migrations!("migrations/postgres-partitioned");

/// The default time [`rotate`] waits for claims in progress before giving
/// up (to retry at the next run). New claims queue behind a waiting
/// rotation, so this bounds the latency it can add.
///
/// ```
/// assert_eq!(inbox_runtime::prune::partitioned::DEFAULT_LOCK_TIMEOUT.as_millis(), 500);
/// ```
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_millis(500);

/// Creates the inbox (if needed) and converts it to the generation layout,
/// in one transaction; running it again changes nothing.
///
/// The conversion adds a `generation` column to `inbox_messages`: instant on
/// an empty or small table, a full scan under an exclusive lock on a large
/// one (see the migration's comments for doing it online).
///
/// ```no_run
/// use diesel::{Connection, PgConnection};
/// let mut conn = PgConnection::establish("postgres://localhost/app")?;
/// inbox_runtime::prune::partitioned::setup(&mut conn)?;
/// assert!(inbox_runtime::prune::partitioned::is_partitioned(&mut conn)?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn setup(conn: &mut PgConnection) -> Result<(), InboxError> {
    conn.transaction(|conn| {
        conn.batch_execute(<diesel::pg::Pg as InboxBackend>::CREATE_SCHEMA_SQL)?;
        conn.batch_execute(SETUP_SQL)
    })?;
    Ok(())
}

/// Converts back to the plain layout (see [`TEARDOWN_SQL`]), in one
/// transaction.
///
/// ```no_run
/// use diesel::{Connection, PgConnection};
/// let mut conn = PgConnection::establish("postgres://localhost/app")?;
/// inbox_runtime::prune::partitioned::teardown(&mut conn)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn teardown(conn: &mut PgConnection) -> Result<(), InboxError> {
    conn.transaction(|conn| conn.batch_execute(TEARDOWN_SQL))?;
    Ok(())
}

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    flag: bool,
}

/// `true` when the inbox in `conn`'s search path (the schema where
/// `inbox_messages` is found) uses the generation layout; `false` also when
/// there is no inbox.
///
/// ```no_run
/// use diesel::{Connection, PgConnection};
/// let mut conn = PgConnection::establish("postgres://localhost/app")?;
/// let partitioned = inbox_runtime::prune::partitioned::is_partitioned(&mut conn)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn is_partitioned(conn: &mut PgConnection) -> Result<bool, InboxError> {
    let row: Flag = diesel::sql_query(
        "SELECT COALESCE(( \
             SELECT to_regclass(quote_ident(n.nspname) || '.inbox_generations') IS NOT NULL \
                AND to_regclass(quote_ident(n.nspname) || '.inbox_messages_archive') IS NOT NULL \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.oid = to_regclass('inbox_messages')), false) AS flag",
    )
    .get_result(conn)?;
    Ok(row.flag)
}

#[derive(QueryableByName)]
struct InboxSchema {
    /// The schema's name, quoted as an SQL identifier.
    #[diesel(sql_type = Text)]
    quoted: String,
}

/// The schema of the inbox: where `conn`'s search path finds
/// `inbox_messages` (and so where claims go). Every statement of this module
/// names its tables and functions in it, so that a second inbox in another
/// schema on the search path is never touched. Fails when there is no
/// inbox.
fn inbox_schema(conn: &mut PgConnection) -> diesel::QueryResult<InboxSchema> {
    diesel::sql_query(
        "SELECT quote_ident(n.nspname) AS quoted \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.oid = 'inbox_messages'::regclass",
    )
    .get_result(conn)
}

/// One generation of ids, as listed by [`generations`].
///
/// ```no_run
/// use diesel::{Connection, PgConnection};
/// let mut conn = PgConnection::establish("postgres://localhost/app")?;
/// for generation in inbox_runtime::prune::partitioned::generations(&mut conn)? {
///     println!("{generation}");
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Generation {
    /// Its number; the current generation has the highest.
    pub generation: i64,
    /// When it became current (database clock).
    pub started_at: SystemTime,
    /// When it was archived (database clock); `None` for the current one.
    pub ended_at: Option<SystemTime>,
}

impl Generation {
    /// `true` for the generation new claims go to.
    ///
    /// ```no_run
    /// # use diesel::{Connection, PgConnection};
    /// # let mut conn = PgConnection::establish("postgres://localhost/app")?;
    /// let all = inbox_runtime::prune::partitioned::generations(&mut conn)?;
    /// assert_eq!(all.iter().filter(|g| g.is_current()).count(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_current(&self) -> bool {
        self.ended_at.is_none()
    }

    /// The table holding its ids (`inbox_messages` for the current one).
    ///
    /// ```no_run
    /// # use diesel::{Connection, PgConnection};
    /// # let mut conn = PgConnection::establish("postgres://localhost/app")?;
    /// let all = inbox_runtime::prune::partitioned::generations(&mut conn)?;
    /// assert_eq!(all.last().unwrap().table_name(), "inbox_messages");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn table_name(&self) -> String {
        if self.is_current() {
            "inbox_messages".to_owned()
        } else {
            archived_table(self.generation)
        }
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let since = |time: SystemTime| {
            time.duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs()
        };
        match self.ended_at {
            None => write!(
                f,
                "generation {} (current, since unix time {})",
                self.generation,
                since(self.started_at)
            ),
            Some(ended) => write!(
                f,
                "generation {} (unix time {} to {})",
                self.generation,
                since(self.started_at),
                since(ended)
            ),
        }
    }
}

fn archived_table(generation: i64) -> String {
    format!("inbox_messages_g{generation}")
}

#[derive(QueryableByName)]
struct GenerationRow {
    #[diesel(sql_type = BigInt)]
    generation: i64,
    #[diesel(sql_type = BigInt)]
    started_micros: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    ended_micros: Option<i64>,
}

fn from_micros(micros: i64) -> SystemTime {
    match u64::try_from(micros) {
        Ok(after) => UNIX_EPOCH + Duration::from_micros(after),
        Err(_) => UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs()),
    }
}

/// Every generation, oldest first.
///
/// ```no_run
/// use diesel::{Connection, PgConnection};
/// let mut conn = PgConnection::establish("postgres://localhost/app")?;
/// let current = inbox_runtime::prune::partitioned::generations(&mut conn)?.pop();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn generations(conn: &mut PgConnection) -> Result<Vec<Generation>, InboxError> {
    let schema = inbox_schema(conn)?;
    let rows: Vec<GenerationRow> = diesel::sql_query(format!(
        "SELECT generation, \
                (extract(epoch FROM started_at) * 1000000)::bigint AS started_micros, \
                (extract(epoch FROM ended_at) * 1000000)::bigint AS ended_micros \
         FROM {}.inbox_generations ORDER BY generation",
        schema.quoted
    ))
    .load(conn)?;
    Ok(rows
        .into_iter()
        .map(|row| Generation {
            generation: row.generation,
            started_at: from_micros(row.started_micros),
            ended_at: row.ended_micros.map(from_micros),
        })
        .collect())
}

#[derive(QueryableByName)]
struct Rotated {
    #[diesel(sql_type = Nullable<BigInt>)]
    generation: Option<i64>,
}

/// Starts a new generation now and returns its number; see
/// [`rotate_if_older_than`].
///
/// ```no_run
/// use diesel::{Connection, PgConnection};
/// use inbox_runtime::prune::partitioned;
/// let mut conn = PgConnection::establish("postgres://localhost/app")?;
/// let next = partitioned::rotate(&mut conn, partitioned::DEFAULT_LOCK_TIMEOUT)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn rotate(conn: &mut PgConnection, lock_timeout: Duration) -> Result<i64, InboxError> {
    rotate_if_older_than(conn, Duration::ZERO, lock_timeout)?.ok_or_else(|| {
        // Unreachable: a zero minimum age always rotates.
        InboxError::Database(diesel::result::Error::NotFound)
    })
}

/// Starts a new generation if the current one began at least `min_age` ago
/// (by the database clock), returning the new generation's number, or
/// `None` when it is not due. A `min_age` beyond
/// [`MAX_RETENTION`] counts as that (never due, in
/// practice).
///
/// Whether the rotation is due is checked first, without locking
/// `inbox_messages`: when it is not, the call neither waits for claims nor
/// makes any wait. A due rotation takes an
/// exclusive lock on `inbox_messages` for a few milliseconds: it waits for
/// claims in progress, and new claims wait behind it. If the lock is not
/// granted within `lock_timeout`, nothing changes and the error (SQLSTATE
/// `55P03`) is returned: retry later. Holding the lock, it checks again, so
/// that of two rotations waiting at once only the first rotates (at
/// `REPEATABLE READ` or `SERIALIZABLE` the second one fails with a
/// serialization failure instead: retry later).
///
/// ```no_run
/// use std::time::Duration;
/// use diesel::{Connection, PgConnection};
/// use inbox_runtime::prune::partitioned;
/// let mut conn = PgConnection::establish("postgres://localhost/app")?;
/// let day = Duration::from_secs(86_400);
/// if let Some(generation) = partitioned::rotate_if_older_than(&mut conn, day, partitioned::DEFAULT_LOCK_TIMEOUT)? {
///     println!("generation {generation} started");
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn rotate_if_older_than(
    conn: &mut PgConnection,
    min_age: Duration,
    lock_timeout: Duration,
) -> Result<Option<i64>, InboxError> {
    let min_age = micros(min_age);
    // `SET LOCAL` takes no bind parameters; the value is an integer.
    let timeout_ms = lock_timeout.as_millis().clamp(1, i32::MAX as u128);
    let schema = inbox_schema(conn)?;
    let rotated = conn.transaction(|conn| {
        conn.batch_execute(&format!("SET LOCAL lock_timeout = {timeout_ms}"))?;
        diesel::sql_query(format!(
            "SELECT {}.inbox_rotate($1 * INTERVAL '1 microsecond') AS generation",
            schema.quoted
        ))
        .bind::<BigInt, _>(min_age)
        .get_result::<Rotated>(conn)
    })?;
    Ok(rotated.generation)
}

#[derive(QueryableByName)]
struct Expired {
    #[diesel(sql_type = BigInt)]
    generation: i64,
}

#[derive(QueryableByName)]
struct Attachment {
    #[diesel(sql_type = Nullable<Bool>)]
    detach_pending: Option<bool>,
    #[diesel(sql_type = Nullable<BigInt>)]
    estimated_rows: Option<i64>,
}

/// Drops every archived generation that ended more than the policy's
/// longest window ago (by the database clock). Each is detached with
/// `DETACH PARTITION … CONCURRENTLY`, which waits for transactions still
/// reading it but blocks no claim, then dropped; an interrupted drop is
/// finished by the next call. Several nodes may call it, directly or through
/// a transaction pooler: one at a time does the work (it holds the layout's
/// lease, a row renewed as it goes, see [`MAINTENANCE_LEASE`]), the others
/// return at once with an empty report that is not caught up. The report counts dropped generations in
/// `partitions_dropped` and their rows (the planner's estimate) in
/// `rows_deleted`.
///
/// A policy restricted to one handler ([`RetentionPolicy::only`]) is refused:
/// generations hold every handler's ids. Per-handler windows are honoured by
/// keeping generations for the longest one.
///
/// ```no_run
/// use diesel::{Connection, PgConnection};
/// use inbox_runtime::{RetentionPolicy, prune::partitioned};
/// let mut conn = PgConnection::establish("postgres://localhost/app")?;
/// let report = partitioned::drop_expired(&mut conn, &RetentionPolicy::parse("7d", "2d")?)?;
/// println!("{report}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn drop_expired(
    conn: &mut PgConnection,
    policy: &RetentionPolicy,
) -> Result<PruneReport, PruneError> {
    check_policy(policy)?;
    exclusively(conn, |conn, schema, lease| {
        let mut tally = PartialReport::start();
        drop_expired_until(conn, schema, lease, policy, &|| false, &mut tally)?;
        Ok(tally.finish())
    })
}

/// How long a maintenance run holds the layout's lease without renewing it.
/// A run renews it before each generation it drops and before a rotation;
/// a run that died leaves it held this long at most, and the next run after
/// that takes over (finishing a drop the dead one left half done).
///
/// ```
/// assert_eq!(inbox_runtime::prune::partitioned::MAINTENANCE_LEASE.as_secs(), 600);
/// ```
pub const MAINTENANCE_LEASE: Duration = Duration::from_secs(600);

/// The layout's maintenance lease, held by this run (see the
/// `inbox_maintenance_lease` table): taken, renewed and given back each in
/// one statement of its own, so that it holds through a transaction pooler
/// whatever server session each statement reaches.
struct Lease {
    holder: String,
    table: String,
}

#[derive(QueryableByName)]
struct Holder {
    #[diesel(sql_type = Text)]
    holder: String,
}

impl Lease {
    /// Takes the lease for [`MAINTENANCE_LEASE`] when nobody holds it (or
    /// its holder's expired); `None` when another run holds it. Fails naming
    /// `inbox_generations` when the inbox does not use the generation layout
    /// (the statement reads it first).
    fn take(conn: &mut PgConnection, schema: &InboxSchema) -> diesel::QueryResult<Option<Lease>> {
        let table = format!("{}.inbox_maintenance_lease", schema.quoted);
        let taken: Option<Holder> = diesel::sql_query(format!(
            "WITH layout AS (SELECT 1 FROM {}.inbox_generations LIMIT 1) \
             INSERT INTO {table} AS lease (holder, expires_at) \
             VALUES (md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text), \
                     clock_timestamp() + $1 * INTERVAL '1 microsecond') \
             ON CONFLICT (singleton) DO UPDATE \
                 SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at \
                 WHERE lease.expires_at < clock_timestamp() \
             RETURNING holder",
            schema.quoted
        ))
        .bind::<BigInt, _>(micros(MAINTENANCE_LEASE))
        .get_result(conn)
        .optional()?;
        Ok(taken.map(|taken| Lease {
            holder: taken.holder,
            table,
        }))
    }

    /// Extends the lease by [`MAINTENANCE_LEASE`] from now; `false` when
    /// this run no longer holds it (it expired and another run took it).
    fn renew(&self, conn: &mut PgConnection) -> diesel::QueryResult<bool> {
        let renewed = diesel::sql_query(format!(
            "UPDATE {} SET expires_at = clock_timestamp() + $2 * INTERVAL '1 microsecond' \
             WHERE holder = $1",
            self.table
        ))
        .bind::<Text, _>(&self.holder)
        .bind::<BigInt, _>(micros(MAINTENANCE_LEASE))
        .execute(conn)?;
        Ok(renewed == 1)
    }

    /// Gives the lease back (if this run still holds it).
    fn release(self, conn: &mut PgConnection) -> diesel::QueryResult<()> {
        diesel::sql_query(format!("DELETE FROM {} WHERE holder = $1", self.table))
            .bind::<Text, _>(&self.holder)
            .execute(conn)
            .map(drop)
    }
}

/// Runs `work` holding the layout's maintenance lease ([`Lease`]), so that
/// pruners on several nodes do not detach the same generation at once. If
/// another run holds it, does nothing and reports that it is not caught up.
/// `work` renews the lease as it goes and stops, not caught up, once it
/// lost it.
fn exclusively(
    conn: &mut PgConnection,
    work: impl FnOnce(&mut PgConnection, &InboxSchema, &Lease) -> Result<PruneReport, PruneError>,
) -> Result<PruneReport, PruneError> {
    let schema = inbox_schema(conn).map_err(InboxError::from)?;
    let Some(lease) = Lease::take(conn, &schema).map_err(InboxError::from)? else {
        return Ok(PruneReport::default());
    };
    let result = work(conn, &schema, &lease);
    let released = lease.release(conn).map_err(InboxError::from);
    match (result, released) {
        (Ok(_), Err(error)) => Err(error.into()),
        (result, _) => result,
    }
}

fn check_policy(policy: &RetentionPolicy) -> Result<(), InboxError> {
    policy.check()?;
    match policy.only_handler() {
        Some(handler) => Err(InboxError::InvalidRetention {
            handler: Some(handler.as_str().to_owned()),
            problem: RetentionProblem::HandlerScopeNeedsBatches,
        }),
        None => Ok(()),
    }
}

/// Drops the expired generations into `tally`'s report, until done or
/// `should_stop`.
fn drop_expired_until(
    conn: &mut PgConnection,
    schema: &InboxSchema,
    lease: &Lease,
    policy: &RetentionPolicy,
    should_stop: &dyn Fn() -> bool,
    tally: &mut PartialReport,
) -> Result<(), PruneError> {
    check_policy(policy).map_err(|error| tally.fail(error))?;
    let window = micros(policy.longest_window());
    let expired: Vec<Expired> = diesel::sql_query(format!(
        "SELECT generation FROM {}.inbox_generations \
         WHERE ended_at IS NOT NULL AND ended_at < now() - $1 * INTERVAL '1 microsecond' \
         ORDER BY generation",
        schema.quoted
    ))
    .bind::<BigInt, _>(window)
    .load(conn)
    .map_err(|error| tally.fail(error))?;
    tally.report.caught_up = true;
    for Expired { generation } in expired {
        if should_stop() || !lease.renew(conn).map_err(|error| tally.fail(error))? {
            tally.report.caught_up = false;
            break;
        }
        let rows = drop_generation(conn, schema, generation).map_err(|error| tally.fail(error))?;
        let report = &mut tally.report;
        report.partitions_dropped += 1;
        report.batches += 1;
        report.rows_deleted += rows;
    }
    if tally.report.caught_up {
        tally.report.passes_caught_up = 1;
    }
    Ok(())
}

/// Failed attempts and dead messages are not partitioned: they are pruned
/// in batches, with the same windows (see [`Prune`](super::Prune)).
fn prune_failure_records(
    conn: &mut PgConnection,
    policy: &RetentionPolicy,
    should_stop: &dyn Fn() -> bool,
    tally: &mut PartialReport,
) -> Result<(), PruneError> {
    let prune = super::Prune::new(policy.clone()).failures_only();
    let report = prune
        .run_with_progress(conn, |_| {
            if should_stop() {
                std::ops::ControlFlow::Break(())
            } else {
                std::ops::ControlFlow::Continue(())
            }
        })
        .map_err(|error| tally.fail(error.into_error()))?;
    tally.report.batches += report.batches;
    tally.report.failure_rows_deleted += report.failure_rows_deleted;
    tally.report.outbox_rows_deleted += report.outbox_rows_deleted;
    tally.report.caught_up &= report.caught_up;
    tally.report.unregistered_scopes = report.unregistered_scopes;
    Ok(())
}

/// A duration as whole microseconds for an SQL interval, capped at
/// [`MAX_RETENTION`] (a hundred years) so that PostgreSQL's interval and
/// timestamp arithmetic cannot overflow.
fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.min(MAX_RETENTION).as_micros()).unwrap_or(i64::MAX)
}

/// Detaches (if still attached) and drops one archived generation, then
/// forgets it; returns its estimated row count.
fn drop_generation(
    conn: &mut PgConnection,
    schema: &InboxSchema,
    generation: i64,
) -> diesel::QueryResult<u64> {
    let schema = &schema.quoted;
    let table = format!("{schema}.{}", archived_table(generation));
    let archive = format!("{schema}.inbox_messages_archive");
    let attachment: Attachment = diesel::sql_query(
        "SELECT (SELECT i.inhdetachpending FROM pg_inherits i \
                 WHERE i.inhrelid = c.oid AND i.inhparent = to_regclass($2)) AS detach_pending, \
                greatest(c.reltuples, 0)::bigint AS estimated_rows \
         FROM (SELECT to_regclass($1) AS oid) AS t LEFT JOIN pg_class c ON c.oid = t.oid",
    )
    .bind::<Text, _>(&table)
    .bind::<Text, _>(&archive)
    .get_result(conn)?;
    match attachment.detach_pending {
        // Attached: detach without blocking claims (not allowed in a transaction).
        Some(false) => conn.batch_execute(&format!(
            "ALTER TABLE {archive} DETACH PARTITION {table} CONCURRENTLY"
        ))?,
        // A concurrent detach was interrupted: finish it.
        Some(true) => conn.batch_execute(&format!(
            "ALTER TABLE {archive} DETACH PARTITION {table} FINALIZE"
        ))?,
        None => {} // already detached, or already dropped
    }
    conn.transaction(|conn| {
        conn.batch_execute(&format!("DROP TABLE IF EXISTS {table}"))?;
        diesel::sql_query(format!(
            "DELETE FROM {schema}.inbox_generations WHERE generation = $1 AND ended_at IS NOT NULL"
        ))
        .bind::<BigInt, _>(generation)
        .execute(conn)
    })?;
    Ok(attachment.estimated_rows.map_or(0, i64::unsigned_abs))
}

/// How many generations [`Maintenance`] splits the window into unless told
/// otherwise ([`Maintenance::generations`]): ids are kept for the window
/// plus at most half of it, and a claim looks its id up in at most 3
/// archived generations (2 once the maintenance run after a rotation has
/// dropped the expired one). Measured on 2 CPUs, each archived generation a
/// claim probes costs about 2–3 % of claim throughput beyond the second:
/// see BENCHMARKS.md.
///
/// ```
/// assert_eq!(inbox_runtime::prune::partitioned::DEFAULT_GENERATIONS, 2);
/// ```
pub const DEFAULT_GENERATIONS: u32 = 2;

/// The most generations [`Maintenance`] splits the window into. Every claim
/// looks its id up in each archived generation (one index probe each), so
/// their number bounds what a claim costs however long the window.
///
/// ```
/// assert_eq!(inbox_runtime::prune::partitioned::MAX_GENERATIONS, 8);
/// ```
pub const MAX_GENERATIONS: u32 = 8;

/// The generation layout's periodic work: drop expired generations, then
/// rotate when the current generation is a period old. The period is the
/// policy's longest window divided by the number of generations
/// ([`DEFAULT_GENERATIONS`], or [`Maintenance::generations`]), so the
/// number of archived generations a claim probes stays bounded (at most that
/// number plus one) whatever the window: a window of 30 days is 2
/// generations of 15 days, not 30 of one day.
///
/// What it costs: ids are kept for the window plus at most one period (up
/// to 50 % longer with the default, 25 % on average), since a generation is
/// dropped once its newest id expired. More generations keep fewer extra
/// ids and a smaller current table (the only one claims write to) at the
/// price of one more probe per claim each; see BENCHMARKS.md for both
/// measured.
///
/// Run it from cron or a `BackgroundPruner` at an interval well below the
/// period.
///
/// ```no_run
/// use std::time::Duration;
/// use diesel::{Connection, PgConnection};
/// use inbox_runtime::{RetentionPolicy, prune::partitioned::Maintenance};
///
/// let mut conn = PgConnection::establish("postgres://localhost/app")?;
/// let maintenance = Maintenance::new(RetentionPolicy::parse("7d", "2d")?)?
///     .lock_timeout(Duration::from_millis(200));
/// assert_eq!(maintenance.period(), Duration::from_secs(84 * 3_600)); // 7 days / 2
/// let report = maintenance.run(&mut conn)?;
/// assert!(report.partitions_created <= 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Maintenance {
    policy: RetentionPolicy,
    period: Duration,
    lock_timeout: Duration,
}

impl Maintenance {
    /// Keeps ids for `policy`'s longest window, in [`DEFAULT_GENERATIONS`]
    /// generations: ids live between the window and the window plus half
    /// of it. Refused: a policy restricted to one handler (a
    /// generation holds every handler's ids).
    ///
    /// ```
    /// use std::time::Duration;
    /// use inbox_runtime::{HandlerName, RetentionPolicy, prune::partitioned::Maintenance};
    ///
    /// let policy = RetentionPolicy::parse("8d", "2d")?;
    /// assert_eq!(Maintenance::new(policy.clone())?.period(), Duration::from_secs(4 * 86_400));
    /// assert!(Maintenance::new(policy.only(HandlerName::new("h")?)).is_err());
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn new(policy: RetentionPolicy) -> Result<Self, InboxError> {
        check_policy(&policy)?;
        Ok(Maintenance {
            period: period_of(&policy, DEFAULT_GENERATIONS),
            policy,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        })
    }

    /// Splits the window into `count` generations (1 to
    /// [`MAX_GENERATIONS`]): the period becomes the window divided by
    /// `count`, ids are kept up to the window plus that period, and a claim
    /// probes at most `count + 1` archived generations.
    ///
    /// ```
    /// use std::time::Duration;
    /// use inbox_runtime::{RetentionPolicy, prune::partitioned::Maintenance};
    ///
    /// let maintenance = Maintenance::new(RetentionPolicy::parse("30d", "2d")?)?.generations(5)?;
    /// assert_eq!(maintenance.period(), Duration::from_secs(6 * 86_400));
    /// assert!(Maintenance::new(RetentionPolicy::parse("30d", "2d")?)?.generations(30).is_err());
    /// assert!(Maintenance::new(RetentionPolicy::parse("30d", "2d")?)?.generations(0).is_err());
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn generations(mut self, count: u32) -> Result<Self, InboxError> {
        if !(1..=MAX_GENERATIONS).contains(&count) {
            return Err(InboxError::InvalidRetention {
                handler: None,
                problem: RetentionProblem::GenerationCount {
                    requested: count,
                    max: MAX_GENERATIONS,
                },
            });
        }
        self.period = period_of(&self.policy, count);
        Ok(self)
    }

    /// How long each generation is current: the window divided by the
    /// number of generations.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use inbox_runtime::{RetentionPolicy, prune::partitioned::Maintenance};
    /// let maintenance = Maintenance::new(RetentionPolicy::parse("4h", "1h")?)?;
    /// assert_eq!(maintenance.period(), Duration::from_secs(2 * 3_600));
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn period(&self) -> Duration {
        self.period
    }

    /// How long a rotation waits for claims in progress (default
    /// [`DEFAULT_LOCK_TIMEOUT`]); see [`rotate_if_older_than`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use inbox_runtime::{RetentionPolicy, prune::partitioned::Maintenance};
    /// let maintenance = Maintenance::new(RetentionPolicy::parse("7d", "2d")?)?
    ///     .lock_timeout(Duration::from_secs(1));
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// The policy applied.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use inbox_runtime::{RetentionPolicy, prune::partitioned::Maintenance};
    /// let maintenance = Maintenance::new(RetentionPolicy::parse("7d", "2d")?)?;
    /// assert_eq!(maintenance.policy().keep().as_secs(), 7 * 86_400);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn policy(&self) -> &RetentionPolicy {
        &self.policy
    }

    /// Drops expired generations, then rotates if due (a run with nothing to
    /// drop and no rotation due takes no lock a claim could wait for; see
    /// [`rotate_if_older_than`]).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use diesel::{Connection, PgConnection};
    /// # use inbox_runtime::{RetentionPolicy, prune::partitioned::Maintenance};
    /// # let mut conn = PgConnection::establish("postgres://localhost/app")?;
    /// let maintenance = Maintenance::new(RetentionPolicy::parse("7d", "2d")?)?;
    /// println!("{}", maintenance.run(&mut conn)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run(&self, conn: &mut PgConnection) -> Result<PruneReport, PruneError> {
        self.run_until(conn, &|| false)
    }

    fn run_until(
        &self,
        conn: &mut PgConnection,
        should_stop: &dyn Fn() -> bool,
    ) -> Result<PruneReport, PruneError> {
        exclusively(conn, |conn, schema, lease| {
            self.run_leased(conn, schema, lease, should_stop)
        })
    }

    fn run_leased(
        &self,
        conn: &mut PgConnection,
        schema: &InboxSchema,
        lease: &Lease,
        should_stop: &dyn Fn() -> bool,
    ) -> Result<PruneReport, PruneError> {
        let mut tally = PartialReport::start();
        drop_expired_until(conn, schema, lease, &self.policy, should_stop, &mut tally)?;
        if !should_stop() {
            prune_failure_records(conn, &self.policy, should_stop, &mut tally)?;
        }
        if !should_stop() {
            if !lease.renew(conn).map_err(|error| tally.fail(error))? {
                // Another run took over: the rotation is its to do.
                tally.report.caught_up = false;
                return Ok(tally.finish());
            }
            match rotate_if_older_than(conn, self.period, self.lock_timeout) {
                Ok(Some(_)) => tally.report.partitions_created += 1,
                Ok(None) => {}
                Err(error) => return Err(tally.fail(error)),
            }
        }
        Ok(tally.finish())
    }
}

/// The period of `count` generations over `policy`'s longest window (capped
/// at [`MAX_RETENTION`], what the database's interval arithmetic holds).
fn period_of(policy: &RetentionPolicy, count: u32) -> Duration {
    policy.longest_window().min(MAX_RETENTION) / count
}

#[cfg(feature = "r2d2")]
impl super::PruneJob<PgConnection> for Maintenance {
    fn run_job(
        &mut self,
        conn: &mut PgConnection,
        stop: &super::StopSignal<'_>,
    ) -> Result<PruneReport, PruneError> {
        self.run_until(conn, &|| stop.is_requested())
    }
}

#[cfg(test)]
mod tests {
    /// The layout's SQL is sent as the client's text, which a server whose
    /// database encoding is not UTF-8 converts: plain ASCII, as the inbox's
    /// schema is (`backend`'s test of the same name).
    #[test]
    fn the_schema_sql_is_ascii() {
        for (name, sql) in [
            ("setup", super::SETUP_SQL),
            ("teardown", super::TEARDOWN_SQL),
        ] {
            let odd = sql.char_indices().find(|(_, c)| !c.is_ascii());
            assert_eq!(odd, None, "{name}: not ASCII at (byte, char)");
        }
    }
}
