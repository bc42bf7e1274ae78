//! PostgreSQL (feature `postgres`): everything the inbox does differently on
//! it, in one place.
//!
//! - **Schema**: the migrations under `migrations/postgres/`; the latest
//!   schema is their `up.sql` files in order (each later one checks the
//!   catalog first, so it is safe to run again).
//! - **Claim**: `INSERT … ON CONFLICT (handler, message_id) DO NOTHING`.
//! - **Commit**: a failed statement aborts the transaction, and PostgreSQL
//!   answers `COMMIT` in an aborted transaction with a silent `ROLLBACK`; the
//!   outermost commit is therefore preceded by `SET LOCAL inbox.committing =
//!   'on'`, in the same round trip, which fails in an aborted transaction
//!   (a utility statement: nothing to plan, no row to send back, which made
//!   a handler 1–10% faster than with `SELECT 1` in the throughput bench).
//!   A duplicate's transaction, where only the claim ran, commits without
//!   it.
//! - **Idle bound** of an async handler's transaction: `SET LOCAL
//!   idle_in_transaction_session_timeout`.
//! - **Pruning batch**: `DELETE … WHERE ctid = ANY(ARRAY(SELECT ctid … FOR
//!   UPDATE SKIP LOCKED))` at `READ COMMITTED`.
//! - **Errors**: blocking connections do not expose the SQLSTATE, so the
//!   server's (English) messages are matched, see [`MESSAGES`].

use super::ServerMessages;

/// PostgreSQL's messages for the codes Diesel does not map (see
/// [`recovery`](crate::recovery())).
pub(crate) const MESSAGES: ServerMessages = ServerMessages {
    lock_conflict: &[
        ("40P01 deadlock_detected", "deadlock detected"),
        ("40001 serialization_failure", "could not serialize access"),
        ("55P03 lock_not_available", "could not obtain lock on"),
        (
            "55P03 lock_not_available",
            "canceling statement due to lock timeout",
        ),
    ],
    lock_wait_timeout: &[(
        "55P03 lock_not_available",
        "canceling statement due to lock timeout",
    )],
    connection_lost: &[
        // Every FATAL that ends a session says "terminating connection …":
        // 57P01 admin_shutdown ("due to administrator command", "due to
        // immediate shutdown command"), 57P02 crash_shutdown ("because of
        // crash of another server process"), 57P05 idle_session_timeout,
        // 25P03 idle_in_transaction_session_timeout, a standby's conflict
        // with recovery, the postmaster's exit.
        (
            "57P01, 57P02, 57P05, 25P03 (FATAL)",
            "terminating connection",
        ),
        (
            "57P03 cannot_connect_now",
            "the database system is starting up",
        ),
        (
            "57P03 cannot_connect_now",
            "the database system is shutting down",
        ),
        (
            "57P03 cannot_connect_now",
            "the database system is in recovery mode",
        ),
        (
            "57P03 cannot_connect_now",
            "the database system is not yet accepting connections",
        ),
        (
            "57P03 cannot_connect_now",
            "the database system is not accepting connections",
        ),
        (
            "25006 read_only_sql_transaction",
            "in a read-only transaction",
        ),
        ("libpq", "server closed the connection unexpectedly"),
        ("libpq", "SSL connection has been closed unexpectedly"),
        ("libpq", "no connection to the server"),
        ("libpq", "connection to server was lost"),
    ],
    refused_text: &[
        (
            "22P05 untranslatable_character",
            "has no equivalent in encoding",
        ),
        (
            "22021 character_not_in_repertoire",
            "invalid byte sequence for encoding",
        ),
    ],
    transaction_aborted: &[(
        "25P02 in_failed_sql_transaction",
        "current transaction is aborted",
    )],
    // 26000 invalid_sql_statement_name (`prepared statement "…" does not
    // exist`), 42P05 duplicate_prepared_statement (`… already exists`),
    // 08P01 (`bind message supplies 2 parameters, but prepared statement
    // "…" requires 3`: another statement of that name): only named
    // statements say `prepared statement "`, and the inbox's and Diesel's
    // are named by their drivers' caches (`__diesel_stmt_N`, `sN`).
    statements_lost: &[(
        "26000, 42P05, 08P01 (a named statement the server does not have as cached)",
        "prepared statement \"",
    )],
    commit_unanswered: &[],
};

#[cfg(all(feature = "postgres", feature = "migrations"))]
pub(crate) use imp::MIGRATIONS;
#[cfg(feature = "postgres")]
pub use imp::PipelinedClaimStatement;
#[cfg(all(feature = "postgres", feature = "async"))]
pub(crate) use imp::{PIPELINED_CLAIMING_SQL, PipelinedReadingClaimStatement};

/// Makes a transaction that recorded outgoing messages notify the channel
/// `inbox_outbox` when it commits (none on a rollback; one per inserting
/// statement, folded by PostgreSQL into one per transaction), for relays
/// that wake on commit. Not part of the schema by default: a transaction
/// that notifies takes a lock shared by the whole cluster while it commits,
/// so notifying commits take turns; only deployments with a listening
/// relay should pay for it. Created only when missing (no lock on the table
/// when it exists); the function names nothing of the schema's, so its
/// search_path is pinned to the catalog. A relay's transaction that puts
/// back messages it did not publish (see `DeletingLease`) notifies
/// nobody: the function skips it, and replaces a function of an earlier
/// version that did not.
#[cfg(feature = "postgres")]
pub(crate) const ENABLE_OUTBOX_NOTIFY_SQL: &str = "\
DO $outer$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_proc
        WHERE proname = 'inbox_outbox_notify' AND pronamespace = current_schema()::regnamespace
            AND prosrc LIKE '%inbox.putting_back%'
    ) THEN
        CREATE OR REPLACE FUNCTION inbox_outbox_notify() RETURNS trigger LANGUAGE plpgsql
        SET search_path = pg_catalog, pg_temp AS $body$
        BEGIN
            -- A relay putting back messages it did not publish: nothing new.
            IF current_setting('inbox.putting_back', true) IS DISTINCT FROM 'on' THEN
                PERFORM pg_notify('inbox_outbox', TG_TABLE_SCHEMA);
            END IF;
            RETURN NULL;
        END
        $body$;
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM pg_trigger
        WHERE tgname = 'inbox_outbox_notify' AND tgrelid = 'inbox_outbox'::regclass
    ) THEN
        CREATE TRIGGER inbox_outbox_notify AFTER INSERT ON inbox_outbox
            FOR EACH STATEMENT EXECUTE FUNCTION inbox_outbox_notify();
    END IF;
END
$outer$";

/// The schema of the outbox table a connection sees (an expression to
/// select): the payload of its commit notifications (the trigger's
/// `TG_TABLE_SCHEMA`), unquoted like it.
#[cfg(all(feature = "postgres", any(feature = "r2d2", feature = "tokio")))]
pub(crate) const OUTBOX_SCHEMA_SQL: &str = "(SELECT nspname FROM pg_namespace \
     WHERE oid = (SELECT relnamespace FROM pg_class WHERE oid = 'inbox_outbox'::regclass))::text";

/// Undoes [`ENABLE_OUTBOX_NOTIFY_SQL`].
#[cfg(feature = "postgres")]
pub(crate) const DISABLE_OUTBOX_NOTIFY_SQL: &str = "\
DROP TRIGGER IF EXISTS inbox_outbox_notify ON inbox_outbox;
DROP FUNCTION IF EXISTS inbox_outbox_notify();";

#[cfg(feature = "postgres")]
/// The inbox table for PostgreSQL queries of your own (re-exported as
/// `inbox_runtime::schema::postgres`).
pub mod table {
    diesel::table! {
        /// Claimed message ids, one row per `(handler, message_id)`.
        inbox_messages (handler, message_id) {
            /// The handler's deduplication scope.
            handler -> Text,
            /// The producer-assigned message id.
            message_id -> Text,
            /// When the id was claimed, by the database clock.
            received_at -> Timestamptz,
        }
    }
}

#[cfg(feature = "postgres")]
mod imp {
    use diesel::QueryResult;
    use diesel::pg::Pg;
    use diesel::query_builder::{AstPass, BoxedSqlQuery, SqlQuery};

    use crate::backend::prune_batch::{Delete, Pick};
    use crate::backend::{
        BatchReports, DeletingLease, FailureSql, InboxBackend, KeyedInsert, Lease, OutboxSql,
        PruneBatchStatement, PrunedTable, RESTORE_BINDS, StoredClaimSql, migration_sql,
        outbox_leasable, sealed,
    };
    use crate::fingerprint::Fingerprint;
    use crate::key::ClaimKey;

    /// The latest schema: the migrations' `up.sql` files, in order. The
    /// later ones check the catalog before changing anything, so running it
    /// on an up-to-date inbox changes nothing.
    const SCHEMA_SQL: &str = concat!(
        migration_sql!(
            "postgres",
            "2026-12-01-000000_create_inbox_messages",
            "up.sql"
        ),
        "\n",
        migration_sql!(
            "postgres",
            "2026-12-03-000000_handler_index_and_statement_clock",
            "up.sql"
        ),
        "\n",
        migration_sql!("postgres", "2026-12-05-000000_failures", "up.sql"),
        "\n",
        migration_sql!(
            "postgres",
            "2026-12-06-000000_fingerprints_and_results",
            "up.sql"
        ),
        "\n",
        migration_sql!("postgres", "2026-12-07-000000_outbox", "up.sql"),
    );

    /// Whether the generation layout's archive exists (see
    /// `prune::partitioned`).
    const ARCHIVE_PRESENT_SQL: &str =
        "SELECT to_regclass('inbox_messages_archive') IS NOT NULL AS present";

    /// A claim's first step, `WITH inbox_wait AS MATERIALIZED (…)`, where
    /// it has one: a bounded claim's reads the session's `lock_timeout`,
    /// then sets it to `bound` for the transaction (`set_config(…, true)`);
    /// a `guarded` claim's reads it through [`claiming_guard!`] (see
    /// [`PipelinedClaimStatement`]). Whether it wrote one (a plain claim,
    /// unbounded and unguarded, has none).
    fn push_wait<'b>(
        bound: Option<&'b crate::backend::ClaimBound>,
        guarded: bool,
        out: &mut AstPass<'_, 'b, Pg>,
    ) -> QueryResult<bool> {
        out.push_sql(match (bound, guarded) {
            (None, false) => return Ok(false),
            (_, false) => {
                "WITH inbox_wait AS MATERIALIZED (SELECT current_setting('lock_timeout') AS previous"
            }
            (_, true) => concat!(
                "WITH inbox_wait AS MATERIALIZED (SELECT ",
                claiming_guard!(),
                " AS previous"
            ),
        });
        if let Some(bound) = bound {
            out.push_sql(", set_config('lock_timeout', ");
            out.push_bind_param::<diesel::sql_types::Integer, i32>(&bound.millis)?;
            out.push_sql("::text, true) AS bound");
        }
        out.push_sql(")");
        Ok(true)
    }

    /// A claim's insert after [`push_wait`] (`waited`: it wrote the CTE):
    /// its values, read `FROM inbox_wait` when there is one (so the bound
    /// is set, and the guard passed, first), `ON CONFLICT DO NOTHING`, and
    /// the `RETURNING` of a new claim: a bounded one's puts the session's
    /// `lock_timeout` back, any other's is `returning`.
    fn push_claim_insert<'b>(
        key: &'b ClaimKey,
        fingerprint: Option<&'b Fingerprint>,
        bounded: bool,
        waited: bool,
        returning: &'static str,
        out: &mut AstPass<'_, 'b, Pg>,
    ) -> QueryResult<()> {
        out.push_sql("INSERT INTO inbox_messages ");
        crate::backend::push_claim_select(key, fingerprint, out)?;
        if waited {
            out.push_sql(" FROM inbox_wait");
        }
        out.push_sql(" ON CONFLICT (handler, message_id) DO NOTHING");
        out.push_sql(match bounded {
            true => {
                " RETURNING set_config('lock_timeout', (SELECT previous FROM inbox_wait), true)"
            }
            false => returning,
        });
        Ok(())
    }

    /// `current_setting('lock_timeout')`, or, where the transaction block
    /// the pipelined begin opens ([`PIPELINED_CLAIMING_SQL`]) is not open,
    /// an error: `current_setting` of a parameter that does not exist
    /// (SQLSTATE 42704, "unrecognized configuration parameter \"inbox.claim
    /// refused: no transaction block\""). The name is chosen per row, so the
    /// planner cannot evaluate it ahead of time.
    macro_rules! claiming_guard {
        () => {
            "current_setting(CASE WHEN current_setting('inbox.claiming', true) = 'on' \
             THEN 'lock_timeout' ELSE 'inbox.claim refused: no transaction block' END)"
        };
    }
    use claiming_guard;

    /// Sent after the outermost `BEGIN` (and its idle bound) in the text an
    /// async PostgreSQL connection pipelines with the claim: marks the
    /// transaction block that [`claiming_guard!`] looks for. `SET LOCAL`
    /// ends with the transaction; if the `BEGIN` failed, this never runs.
    #[cfg(feature = "async")]
    pub(crate) const PIPELINED_CLAIMING_SQL: &str = "SET LOCAL inbox.claiming = 'on'";

    /// The claim an async PostgreSQL connection sends in the same flight
    /// as the `BEGIN` before it (pipelined, see `delivery::pipelined`): the
    /// bounded or unbounded claim, its fingerprint included, that refuses
    /// to run unless the pipelined begin's transaction block is open. So a
    /// `BEGIN` that failed (a cancelled statement, say) cannot leave the
    /// claim to commit on its own, apart from the effects: it fails with
    /// the guard's error instead ([`claiming_guard!`]).
    #[doc(hidden)]
    #[derive(Debug, Clone, Copy)]
    pub struct PipelinedClaimStatement<'k> {
        pub(crate) key: &'k ClaimKey,
        pub(crate) bound: Option<crate::backend::ClaimBound>,
    }

    impl<'k> PipelinedClaimStatement<'k> {
        /// The guarded claim of `key` waiting at most `bound` (`None`: as
        /// long as the server lets it) for a claim of the same key in flight.
        ///
        /// ```no_run
        /// # #[cfg(feature = "postgres")] {
        /// use diesel::RunQueryDsl;
        /// use inbox_runtime::{ClaimKey, HandlerName, PipelinedClaimStatement};
        ///
        /// let key = ClaimKey::new(HandlerName::new("billing")?, "pay-1")?;
        /// # let mut conn: diesel::PgConnection = unimplemented!();
        /// // Outside the pipelined begin's transaction block, refused:
        /// assert!(PipelinedClaimStatement::new(&key, None).execute(&mut conn).is_err());
        /// # }
        /// # Ok::<(), inbox_runtime::InboxError>(())
        /// ```
        pub fn new(key: &'k ClaimKey, bound: Option<std::time::Duration>) -> Self {
            let bound = bound.map(crate::backend::ClaimBound::of);
            PipelinedClaimStatement { key, bound }
        }
    }

    impl diesel::query_builder::QueryId for PipelinedClaimStatement<'_> {
        type QueryId = ();
        const HAS_STATIC_QUERY_ID: bool = false;
    }

    impl diesel::query_builder::QueryFragment<Pg> for PipelinedClaimStatement<'_> {
        fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
            let bound = self.bound.as_ref();
            let waited = push_wait(bound, true, &mut out)?;
            out.push_sql(" ");
            let (key, fingerprint) = (self.key, self.key.fingerprint());
            push_claim_insert(key, fingerprint, bound.is_some(), waited, "", &mut out)
        }
    }

    impl<C> diesel::RunQueryDsl<C> for PipelinedClaimStatement<'_> {}

    /// A guarded claim's text is fixed by its shape: the bound is a bind.
    macro_rules! shaped_by_bound_and_fingerprint {
        ($statement:ident) => {
            impl crate::backend::shaped::Shaped for $statement<'_> {
                type Kind = $statement<'static>;

                fn shape(&self) -> crate::backend::shaped::Shape {
                    crate::backend::shaped::Shape::of(self.key, self.bound.is_some())
                }

                fn fixed_on<DB: InboxBackend>(&self) -> bool {
                    true
                }
            }
        };
    }

    shaped_by_bound_and_fingerprint!(PipelinedClaimStatement);

    /// [`PipelinedClaimStatement`] that also reads what the claim it met
    /// stored, as [`walk_reading_claim`](InboxBackend::walk_reading_claim)
    /// does: one [`ReadingClaimRow`](crate::backend::ReadingClaimRow).
    #[cfg(feature = "async")]
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct PipelinedReadingClaimStatement<'k> {
        pub(crate) key: &'k ClaimKey,
        pub(crate) bound: Option<crate::backend::ClaimBound>,
    }

    #[cfg(feature = "async")]
    impl diesel::query_builder::QueryId for PipelinedReadingClaimStatement<'_> {
        type QueryId = ();
        const HAS_STATIC_QUERY_ID: bool = false;
    }

    #[cfg(feature = "async")]
    impl diesel::query_builder::QueryFragment<Pg> for PipelinedReadingClaimStatement<'_> {
        fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
            walk_reading(
                self.key,
                self.key.fingerprint(),
                self.bound.as_ref(),
                true,
                out,
            )
        }
    }

    #[cfg(feature = "async")]
    impl diesel::query_builder::Query for PipelinedReadingClaimStatement<'_> {
        type SqlType = diesel::sql_types::Untyped;
    }

    #[cfg(feature = "async")]
    shaped_by_bound_and_fingerprint!(PipelinedReadingClaimStatement);

    /// The reading claim ([`InboxBackend::walk_reading_claim`]); `guarded`
    /// as [`PipelinedClaimStatement`] is.
    fn walk_reading<'b>(
        key: &'b ClaimKey,
        fingerprint: Option<&'b Fingerprint>,
        bound: Option<&'b crate::backend::ClaimBound>,
        guarded: bool,
        mut out: AstPass<'_, 'b, Pg>,
    ) -> QueryResult<()> {
        use diesel::sql_types::Text;
        let waited = push_wait(bound, guarded, &mut out)?;
        out.push_sql(match waited {
            true => ", inbox_claim AS (",
            false => "WITH inbox_claim AS (",
        });
        let bounded = bound.is_some();
        push_claim_insert(key, fingerprint, bounded, waited, " RETURNING 1", &mut out)?;
        out.push_sql(
            ") SELECT EXISTS (SELECT 1 FROM inbox_claim) AS claimed, \
             found.message_id IS NOT NULL AS seen, found.fingerprint, found.result \
             FROM (SELECT 1) AS one LEFT JOIN inbox_messages AS found ON found.handler = ",
        );
        out.push_bind_param::<Text, str>(key.handler().as_str())?;
        out.push_sql(" AND found.message_id = ");
        out.push_bind_param::<Text, str>(key.message_id())?;
        Ok(())
    }

    /// Fingerprints and stored results, in the current table and, under
    /// the generation layout, in the archive.
    const STORED_CLAIMS: StoredClaimSql = StoredClaimSql {
        select: "SELECT fingerprint, result FROM inbox_messages WHERE handler = $1 AND message_id = $2",
        archived_select: Some((
            ARCHIVE_PRESENT_SQL,
            "SELECT fingerprint, result FROM inbox_messages_archive \
             WHERE handler = $1 AND message_id = $2",
        )),
        store_result: "UPDATE inbox_messages SET result = $1 WHERE handler = $2 AND message_id = $3",
        store_fingerprint: "UPDATE inbox_messages SET fingerprint = $1 \
             WHERE handler = $2 AND message_id = $3 AND fingerprint IS NULL",
    };

    /// Microseconds since the Unix epoch of a `timestamptz` column.
    macro_rules! micros {
        ($column:literal) => {
            concat!("(extract(epoch FROM ", $column, ") * 1000000)::bigint")
        };
    }

    /// Failed attempts, dead messages and the operator surface.
    const FAILURES: FailureSql = FailureSql {
        record_attempt: "INSERT INTO inbox_failures (handler, message_id, attempts, last_error) \
            VALUES ($1, $2, 1, $3) ON CONFLICT (handler, message_id) DO UPDATE SET \
            attempts = inbox_failures.attempts + 1, last_error = EXCLUDED.last_error, \
            last_failed_at = statement_timestamp()",
        mark_exhausted: "UPDATE inbox_failures SET dead_at = statement_timestamp() \
            WHERE handler = $1 AND message_id = $2 AND attempts >= $3 AND dead_at IS NULL",
        mark_rejected: "UPDATE inbox_failures SET dead_at = statement_timestamp(), rejected = TRUE \
            WHERE handler = $1 AND message_id = $2",
        list_dead: concat!(
            "SELECT handler, message_id, attempts, last_error, rejected, ",
            micros!("first_failed_at"),
            " AS first_failed_micros, ",
            micros!("last_failed_at"),
            " AS last_failed_micros, ",
            micros!("dead_at"),
            " AS dead_micros FROM inbox_failures ",
            "WHERE handler = $1 AND dead_at IS NOT NULL AND (",
            micros!("dead_at"),
            " > $2 OR (",
            micros!("dead_at"),
            " = $3 AND message_id > $4)) ORDER BY dead_at, message_id LIMIT $5"
        ),
        dead_summary: concat!(
            "SELECT handler, COUNT(*) AS dead, MIN(",
            micros!("dead_at"),
            ") AS oldest_micros ",
            "FROM inbox_failures WHERE dead_at IS NOT NULL GROUP BY handler ORDER BY handler"
        ),
        revive_claims: "DELETE FROM inbox_messages WHERE handler = $1 AND message_id IN \
            (SELECT message_id FROM inbox_failures WHERE handler = $2 AND dead_at IS NOT NULL \
            AND ($3::text IS NULL OR message_id = $4))",
        archived_claims: Some((
            ARCHIVE_PRESENT_SQL,
            "DELETE FROM inbox_messages_archive WHERE handler = $1 AND message_id IN \
            (SELECT message_id FROM inbox_failures WHERE handler = $2 AND dead_at IS NOT NULL \
            AND ($3::text IS NULL OR message_id = $4))",
        )),
        forget_dead: "DELETE FROM inbox_failures WHERE handler = $1 AND dead_at IS NOT NULL \
            AND ($2::text IS NULL OR message_id = $3)",
    };

    /// This backend's Diesel migrations.
    #[cfg(feature = "migrations")]
    pub(crate) const MIGRATIONS: diesel_migrations::EmbeddedMigrations =
        diesel_migrations::embed_migrations!("migrations/postgres");

    /// The first step of a lease that holds its rows locked: the session
    /// ends (and its locks go) once the transaction sits idle for longer
    /// than the lease (`$1`), and its commit does not wait for the WAL
    /// flush: a commit lost to a server crash leaves its messages pending,
    /// published again under the same ids (at least once, as promised), or
    /// a refusal uncounted. `set_config(…, true)` lasts as long as the
    /// transaction, in a CTE the lease joins (volatile: evaluated once, not
    /// inlined).
    macro_rules! held_lease_bound {
        ($($more:literal)?) => {
            concat!(
                "WITH bound AS (SELECT set_config('idle_in_transaction_session_timeout', $1, true) AS lease, \
                 set_config('synchronous_commit', 'off', true) AS durability",
                $($more,)?
                ") "
            )
        };
    }

    /// The columns a lease returns ([`OutboxRow`](crate::backend::OutboxRow)), of the table `o`.
    macro_rules! leased_columns {
        () => {
            concat!(
                "o.position, o.id, o.destination, o.ordering_key, o.headers, o.payload, o.attempts, ",
                micros!("o.created_at"),
                " AS created_micros, o.key_seq, o.last_error, ",
                micros!("o.retry_at"),
                " AS retry_micros"
            )
        };
    }

    /// The put-back of `rows` messages a deleting lease took (see
    /// [`DeletingLease::restore`]), in one statement. A time given as
    /// microseconds since the epoch is exact (below 2^53 µs a `bigint`
    /// times an interval is), and `NULL` stays `NULL`.
    fn restore_sql(rows: usize) -> String {
        use std::fmt::Write;
        const HEAD: &str = "INSERT INTO inbox_outbox (position, id, destination, ordering_key, \
            key_seq, headers, payload, created_at, attempts, last_error, retry_at) \
            OVERRIDING SYSTEM VALUE VALUES ";
        let mut sql = String::with_capacity(HEAD.len() + rows * 160);
        sql.push_str(HEAD);
        for row in 0..rows {
            let n = row * RESTORE_BINDS;
            let bind = |k: usize| n + k;
            if row > 0 {
                sql.push_str(", ");
            }
            // Writing to a `String` cannot fail.
            let _ = write!(
                sql,
                "(${}, ${}, ${}, ${}, ${}, ${}, ${}, \
                 TIMESTAMPTZ 'epoch' + ${} * INTERVAL '1 microsecond', ${}, ${}, \
                 TIMESTAMPTZ 'epoch' + ${} * INTERVAL '1 microsecond')",
                bind(1),
                bind(2),
                bind(3),
                bind(4),
                bind(5),
                bind(6),
                bind(7),
                bind(8),
                bind(9),
                bind(10),
                bind(11),
            );
        }
        sql
    }

    /// The outbox's statements (see [`OutboxSql`]): a round locks the next
    /// messages (`SELECT … FOR UPDATE SKIP LOCKED`) in a transaction it
    /// holds while publishing, so its lease is written nowhere, and deletes
    /// them in the same statement (a relay that keeps sent messages marks
    /// them after the broker's answer instead); one statement records a
    /// keyed message (a CTE upserts the key's counter, whose row lock makes
    /// writers of one key take turns until they commit).
    const OUTBOX: OutboxSql = OutboxSql {
        insert: "INSERT INTO inbox_outbox (id, destination, headers, payload) VALUES ($1, $2, $3, $4)",
        insert_keyed: KeyedInsert::OneStatement(
            "WITH seq AS (INSERT INTO inbox_outbox_keys (ordering_key, last_seq) VALUES ($5, 1) \
             ON CONFLICT (ordering_key) DO UPDATE SET last_seq = inbox_outbox_keys.last_seq + 1 \
             RETURNING ordering_key, last_seq) \
             INSERT INTO inbox_outbox (id, destination, ordering_key, key_seq, headers, payload) \
             SELECT $1, $2, seq.ordering_key, seq.last_seq, $3, $4 FROM seq",
        ),
        // The rows held locked while the round publishes, then marked sent
        // (a relay that keeps sent messages; see `held_lease_bound!`).
        lease: Lease::HeldLock(concat!(
            held_lease_bound!(),
            "SELECT ",
            leased_columns!(),
            " FROM inbox_outbox o, bound WHERE ",
            outbox_leasable!("statement_timestamp()"),
            " ORDER BY o.position LIMIT $2 FOR UPDATE OF o SKIP LOCKED"
        )),
        // The rows picked as the held lock picks them, then deleted in the
        // same statement: one statement per round where a confirmed
        // message cost a delete of its own after the broker's answer. A
        // restored message keeps its position (`OVERRIDING SYSTEM VALUE`)
        // and its id: the rows this transaction deleted hold neither key
        // against it.
        deleting_lease: Some(DeletingLease {
            lease: concat!(
                held_lease_bound!(", set_config('inbox.putting_back', 'on', true) AS putting_back"),
                ", picked AS (SELECT o.position FROM inbox_outbox o, bound WHERE ",
                outbox_leasable!("statement_timestamp()"),
                " ORDER BY o.position LIMIT $2 FOR UPDATE OF o SKIP LOCKED) ",
                "DELETE FROM inbox_outbox o USING picked WHERE o.position = picked.position RETURNING ",
                leased_columns!()
            ),
            restore: restore_sql,
        }),
        mark_sent: "UPDATE inbox_outbox SET sent_at = statement_timestamp(), lease_owner = NULL, \
             leased_until = NULL WHERE sent_at IS NULL AND position IN (",
        delete_sent: "DELETE FROM inbox_outbox WHERE sent_at IS NULL AND position IN (",
        release: "UPDATE inbox_outbox SET lease_owner = NULL, leased_until = NULL \
             WHERE lease_owner = $1 AND sent_at IS NULL AND position IN (",
        record_refusal: "UPDATE inbox_outbox SET \
             dead_at = CASE WHEN attempts + 1 >= $1 THEN statement_timestamp() END, \
             retry_at = statement_timestamp() + $2 * INTERVAL '1 millisecond', \
             attempts = attempts + 1, last_error = $3, lease_owner = NULL, leased_until = NULL \
             WHERE position = $4 AND sent_at IS NULL",
        list_dead: concat!(
            "SELECT position, id, destination, ordering_key, attempts, last_error, ",
            micros!("created_at"),
            " AS created_micros, ",
            micros!("dead_at"),
            " AS dead_micros FROM inbox_outbox WHERE dead_at IS NOT NULL AND sent_at IS NULL \
             AND position > $1 ORDER BY position LIMIT $2"
        ),
        revive: "UPDATE inbox_outbox SET dead_at = NULL, attempts = 0, retry_at = NULL, \
             last_error = NULL WHERE dead_at IS NOT NULL AND sent_at IS NULL \
             AND ($1::text IS NULL OR id = $2)",
        discard: "DELETE FROM inbox_outbox WHERE dead_at IS NOT NULL AND sent_at IS NULL \
             AND ($1::text IS NULL OR id = $2)",
        // Two scans, each of a partial index's rows (pending, dead): one
        // scan of both would read the kept sent messages as well.
        backlog: concat!(
            "SELECT p.pending, d.dead, p.oldest_micros FROM (SELECT COUNT(*) AS pending, ",
            micros!("MIN(created_at)"),
            " AS oldest_micros FROM inbox_outbox WHERE sent_at IS NULL AND dead_at IS NULL) p, ",
            "(SELECT COUNT(*) AS dead FROM inbox_outbox WHERE dead_at IS NOT NULL AND sent_at IS NULL) d"
        ),
    };

    impl sealed::Sealed for Pg {}

    /// The batch claim: the ids travel as one array parameter, whatever
    /// their number, and are inserted in the order given.
    const CLAIM_BATCH_SQL: &str = "INSERT INTO inbox_messages (handler, message_id) \
         SELECT $1, batch.id FROM unnest($2::text[]) WITH ORDINALITY AS batch(id, position) \
         ORDER BY batch.position \
         ON CONFLICT (handler, message_id) DO NOTHING RETURNING message_id";

    /// The batch claim, bound.
    fn claim_batch_query<'a>(
        handler: &'a str,
        ids: &'a [&'a str],
        bound: Option<&'a crate::backend::ClaimBound>,
    ) -> BoxedSqlQuery<'a, Pg, SqlQuery> {
        use diesel::sql_types::{Array, Integer, Text};
        match bound {
            None => diesel::sql_query(CLAIM_BATCH_SQL)
                .into_boxed()
                .bind::<Text, _>(handler)
                .bind::<Array<Text>, _>(ids),
            Some(bound) => diesel::sql_query(BOUNDED_CLAIM_BATCH_SQL)
                .into_boxed()
                .bind::<Text, _>(handler)
                .bind::<Array<Text>, _>(ids)
                .bind::<Integer, _>(bound.millis),
        }
    }

    /// [`CLAIM_BATCH_SQL`] waiting at most `$3` milliseconds for a claim
    /// in flight: `lock_timeout` set for the statement by the statement
    /// itself (`inbox_wait`, read first), and restored once every row is
    /// inserted (`restored` counts them all first: a `RETURNING` would
    /// restore it after the first row, before the others wait). A batch
    /// that inserted nothing runs no body and commits at once.
    const BOUNDED_CLAIM_BATCH_SQL: &str = "WITH inbox_wait AS MATERIALIZED (\
         SELECT current_setting('lock_timeout') AS previous, \
         set_config('lock_timeout', $3::text, true) AS bound), \
         inserted AS (INSERT INTO inbox_messages (handler, message_id) \
         SELECT $1, batch.id FROM inbox_wait, unnest($2::text[]) WITH ORDINALITY AS batch(id, position) \
         ORDER BY batch.position \
         ON CONFLICT (handler, message_id) DO NOTHING RETURNING message_id), \
         restored AS MATERIALIZED (SELECT set_config('lock_timeout', \
         (SELECT previous FROM inbox_wait), true) AS setting FROM (SELECT count(*) FROM inserted) AS done) \
         SELECT inserted.message_id, restored.setting FROM inserted, restored";

    /// `RETURNING message_id`.
    const CLAIM_BATCH_REPORTS: BatchReports = BatchReports::Returning;

    impl InboxBackend for Pg {
        const MAX_CLAIMS_PER_STATEMENT: usize = 1000;

        crate::backend::claim_batch_fns!();

        const CREATE_SCHEMA_SQL: &'static str = SCHEMA_SQL;
        const DROP_SCHEMA_SQL: &'static str = concat!(
            migration_sql!("postgres", "2026-12-07-000000_outbox", "down.sql"),
            migration_sql!("postgres", "2026-12-05-000000_failures", "down.sql"),
            migration_sql!(
                "postgres",
                "2026-12-01-000000_create_inbox_messages",
                "down.sql"
            ),
        );
        const FAILURE_SQL: FailureSql = FAILURES;
        const OUTBOX_SQL: OutboxSql = OUTBOX;

        /// The values as literals that read the same whatever
        /// `standard_conforming_strings` says: text as `E'…'` (backslashes
        /// and quotes doubled; the outbox refuses NUL), bytes as hex.
        fn outbox_insert_text(
            id: &str,
            destination: &str,
            headers: &[u8],
            payload: &[u8],
        ) -> Option<String> {
            let text = |sql: &mut String, value: &str| {
                sql.push_str("E'");
                for character in value.chars() {
                    match character {
                        '\\' => sql.push_str("\\\\"),
                        '\'' => sql.push_str("''"),
                        other => sql.push(other),
                    }
                }
                sql.push('\'');
            };
            let bytes = |sql: &mut String, value: &[u8]| {
                sql.push_str("decode('");
                crate::backend::push_hex_digits(sql, value);
                sql.push_str("', 'hex')");
            };
            Some(crate::backend::insert_text(
                [id, destination],
                [headers, payload],
                text,
                bytes,
            ))
        }
        const STORED_CLAIM_SQL: StoredClaimSql = STORED_CLAIMS;
        const OUTERMOST_BEGIN_SQL: &'static str = "BEGIN";
        const OUTERMOST_ROLLBACK_SQL: &'static str = "ROLLBACK";
        /// See the module's "Commit".
        const OUTERMOST_COMMIT_SQL: &'static str = "SET LOCAL inbox.committing = 'on'; COMMIT";
        const OUTERMOST_DUPLICATE_COMMIT_SQL: &'static str = "COMMIT";
        /// With or without a token (this backend has none): the claim is
        /// a statement of CTEs.
        fn claim_reads_stored(_token: bool) -> bool {
            true
        }
        const OUTERMOST_LATE_TRIPWIRE: Option<crate::backend::LateTripwire> = None;
        const ABORTED_TRANSACTION_PROBE_SQL: Option<&'static str> = Some("SELECT 1");
        const PREPARED_TRANSACTION_SQL: bool = false;
        const BOUNDED_IDLE_END_SQL: &'static str = "";

        /// `SET LOCAL` ends with the transaction: nothing to restore.
        fn bounded_idle_begin(
            limit: std::time::Duration,
        ) -> Option<crate::backend::IdleBoundedBegin> {
            let millis = limit.as_millis().clamp(1, i32::MAX as u128);
            Some(crate::backend::IdleBoundedBegin {
                before: "BEGIN; SET LOCAL idle_in_transaction_session_timeout = ",
                bound: millis as u64,
                after: "",
            })
        }
        const PRUNE_BEFORE_BEGIN_SQL: &'static str = "";
        const PRUNE_AFTER_BEGIN_SQL: &'static str =
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";

        fn walk_claim<'b>(
            key: &'b ClaimKey,
            fingerprint: Option<&'b Fingerprint>,
            out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            crate::backend::walk_insert_on_conflict_do_nothing(key, fingerprint, out)
        }

        /// The bound is a bind (`set_config('lock_timeout', $1::text, true)`).
        const BOUND_IN_CLAIM_TEXT: bool = false;

        fn bounds_claims() -> bool {
            true
        }

        /// `lock_timeout` for this statement alone: set by a CTE the insert
        /// reads first (`set_config(…, true)`, local to the transaction),
        /// and restored to what it was by the `RETURNING` of a new claim,
        /// so the body waits as the application says. A duplicate leaves it
        /// set until its transaction commits right after; a claim that
        /// timed out aborts the transaction, which rolls the setting back.
        /// One statement, one round trip.
        fn walk_bounded_claim<'b>(
            key: &'b ClaimKey,
            fingerprint: Option<&'b Fingerprint>,
            bound: &'b crate::backend::ClaimBound,
            mut out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            push_wait(Some(bound), false, &mut out)?;
            out.push_sql(" ");
            push_claim_insert(key, fingerprint, true, true, "", &mut out)
        }

        /// The claim in a data-modifying CTE (`inbox_claim`, after the
        /// bound's `inbox_wait` when bounded, as in
        /// [`walk_bounded_claim`](Self::walk_bounded_claim)), and the key's
        /// row in the statement's snapshot beside it: a claim that met a
        /// committed one reads what that one stored in the same round
        /// trip. The CTE's own insert is not in the snapshot, so a new
        /// claim's row reads as not seen.
        fn walk_reading_claim<'b>(
            key: &'b ClaimKey,
            fingerprint: Option<&'b Fingerprint>,
            bound: Option<&'b crate::backend::ClaimBound>,
            out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            walk_reading(key, fingerprint, bound, false, out)
        }

        /// Picks and locks the oldest expired rows, skipping rows another
        /// transaction holds (a live handler, a second pruner), then deletes
        /// them by their physical address: a TID scan, no second index
        /// lookup.
        ///
        /// PostgreSQL has no index hints. A batch over one handler compares
        /// and orders by `received_at AT TIME ZONE 'UTC'` (the same
        /// instants), which only the index on `(handler, (received_at AT TIME
        /// ZONE 'UTC'))` serves: on `received_at` itself the planner would
        /// sometimes walk the `received_at` index instead (its order is the
        /// table's, which makes it look cheap) and read every other handler's
        /// row on the way.
        fn walk_prune_batch<'b>(
            batch: &'b PruneBatchStatement<'_>,
            out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            if batch.table() == PrunedTable::Outbox {
                const PICK: Pick = Pick {
                    select: "SELECT ctid FROM inbox_outbox",
                    key: "sent_at",
                    cutoff: ("now() - ", " * INTERVAL '1 microsecond'"),
                };
                return Delete {
                    head: "DELETE FROM inbox_outbox WHERE ctid = ANY(ARRAY(",
                    one_handler: PICK,
                    all: PICK,
                    lock: " FOR UPDATE SKIP LOCKED",
                    tail: "))",
                }
                .walk(batch, out);
            }
            if batch.table() == PrunedTable::Failures {
                const PICK: Pick = Pick {
                    select: "SELECT ctid FROM inbox_failures",
                    key: "last_failed_at",
                    cutoff: ("now() - ", " * INTERVAL '1 microsecond'"),
                };
                return Delete {
                    head: "DELETE FROM inbox_failures WHERE ctid = ANY(ARRAY(",
                    one_handler: PICK,
                    all: PICK,
                    lock: " FOR UPDATE SKIP LOCKED",
                    tail: "))",
                }
                .walk(batch, out);
            }
            Delete {
                head: "DELETE FROM inbox_messages WHERE ctid = ANY(ARRAY(",
                one_handler: Pick {
                    select: "SELECT ctid FROM inbox_messages",
                    key: "(received_at AT TIME ZONE 'UTC')",
                    cutoff: (
                        "((now() - ",
                        " * INTERVAL '1 microsecond') AT TIME ZONE 'UTC')",
                    ),
                },
                all: Pick {
                    select: "SELECT ctid FROM inbox_messages",
                    key: "received_at",
                    cutoff: ("now() - ", " * INTERVAL '1 microsecond'"),
                },
                lock: " FOR UPDATE SKIP LOCKED",
                tail: "))",
            }
            .walk(batch, out)
        }

        crate::backend::next_prune_handler_fns!();
        crate::backend::bound_statement_fn!();

        /// In one transaction that first takes an advisory lock of the
        /// schema's: a concurrent setup waits for it, then finds everything
        /// created (DDL is transactional here).
        fn setup_in_turn<C, F>(conn: &mut C, create: F) -> QueryResult<()>
        where
            C: diesel::Connection<Backend = Self>,
            F: FnOnce(&mut C) -> QueryResult<()>,
        {
            conn.transaction(|conn| {
                conn.batch_execute(
                    "SELECT pg_advisory_xact_lock(hashtext('inbox_runtime.setup ' || current_schema()))",
                )?;
                create(conn)
            })
        }
    }

    #[cfg(test)]
    mod tests {
        use std::time::Duration;

        use crate::backend::PruneScope;
        use crate::backend::prune_batch::batch_sql;
        use crate::key::HandlerName;
        use diesel::pg::Pg;

        #[test]
        fn prune_batch_sql() {
            let list = [
                HandlerName::new("a").unwrap(),
                HandlerName::new("b").unwrap(),
            ];
            let sql = batch_sql::<Pg>(PruneScope::AllExcept(&list), Duration::from_secs(1), 10);
            assert_eq!(
                sql,
                "DELETE FROM inbox_messages WHERE ctid = ANY(ARRAY(SELECT ctid FROM inbox_messages \
                 WHERE received_at < now() - $1 * INTERVAL '1 microsecond' AND handler NOT IN ($2, $3) \
                 ORDER BY received_at LIMIT $4 FOR UPDATE SKIP LOCKED)) -- binds: [1000000, \"a\", \"b\", 10]"
            );
            let sql = batch_sql::<Pg>(PruneScope::Handler(&list[0]), Duration::from_secs(1), 10);
            assert_eq!(
                sql,
                "DELETE FROM inbox_messages WHERE ctid = ANY(ARRAY(SELECT ctid FROM inbox_messages \
                 WHERE (received_at AT TIME ZONE 'UTC') < ((now() - $1 * INTERVAL '1 microsecond') AT TIME ZONE 'UTC') \
                 AND handler = $2 ORDER BY (received_at AT TIME ZONE 'UTC') LIMIT $3 FOR UPDATE SKIP LOCKED)) \
                 -- binds: [1000000, \"a\", 10]"
            );
        }
    }
}
