//! MySQL and MariaDB (feature `mysql`): everything the inbox does
//! differently on them, in one place.
//!
//! - **Schema**: the migrations under `migrations/mysql/`; the latest schema
//!   is their `up.sql` files in order (the index is created only when
//!   missing). Ids are `VARBINARY`, so comparison is exact.
//! - **Claim**: `INSERT IGNORE …` (ids are validated first, since `IGNORE`
//!   would also silence truncation).
//! - **Transaction**: `autocommit` off, a tripwire of the deadlock guard
//!   that dies with the transaction, and the commit by turning `autocommit`
//!   back on. On blocking connections these statements go as prepared
//!   statements, one round trip each (Diesel's `batch_execute` costs three:
//!   it switches multi-statement mode on and off around the statement), and
//!   a single delivery's tripwire is its claim: the claim writes the
//!   delivery's claim token, and the commit checks it in the same statement
//!   (see [`LateTripwire`](crate::backend::LateTripwire)), so neither a
//!   processed message nor a duplicate pays for a tripwire of its own.
//!   Batches, async connections (which send each group of statements as
//!   one text), an inbox without the token's column (its migration not
//!   run) and a server that refuses to prepare the transaction statements
//!   set a savepoint and release it before the commit. On async
//!   connections a plain claim goes in one text with the begin, written
//!   out with its key as hex literals (see
//!   [`push_begin_and_claim`](crate::backend::InboxBackend::push_begin_and_claim)): a
//!   duplicate costs the begin and claim, and the commit.
//! - **Claim token**: every outermost transaction's begin gives the session
//!   a new one, which a handler's claim writes; a claim that must read what
//!   a duplicate met (a fingerprint, a stored result) is `INSERT … ON
//!   DUPLICATE KEY UPDATE … RETURNING` (MariaDB 10.5 and later), whose row
//!   is its own claim exactly when it holds the token. Diesel's blocking
//!   connection reads a statement's columns before it runs it, which
//!   MariaDB describes for `RETURNING` only once it has run it: there a
//!   connection's first such claim runs without reading, and its row is
//!   read by a query
//!   ([`READING_CLAIM_ROW_SQL`](crate::backend::InboxBackend::READING_CLAIM_ROW_SQL));
//!   the statement it caches reads its row from then on. Where the server
//!   refuses `RETURNING` (MySQL), a fingerprinted duplicate's commit
//!   compares the fingerprint itself on the blocking connection
//!   ([`LateTripwire::end_duplicate_checked`](crate::backend::LateTripwire::end_duplicate_checked)),
//!   and a duplicate that must read what it met reads it with a statement
//!   of its own.
//! - **Idle bound** of an async handler's transaction: the session's
//!   `wait_timeout`, lowered for the transaction in the `SET` that begins it
//!   and restored in the one that ends it.
//! - **Pruning batch**: a derived table of expired keys picked `FOR UPDATE
//!   SKIP LOCKED` through a forced index, joined back by primary key; `READ
//!   COMMITTED` is set before the transaction begins.
//! - **Errors**: plain statements on blocking connections (the schema's,
//!   and the transaction statements when a server refuses to prepare them),
//!   and every error on diesel-async's driver, carry no error number, so the
//!   server's messages are matched, see [`MESSAGES`].

use super::ServerMessages;

/// The value the commit that checks a single delivery's claim token gives
/// `autocommit` when the claim is gone, quoted: the server refuses it and
/// names it in its error.
macro_rules! claim_lost {
    () => {
        "'inbox_transaction lost'"
    };
}

/// MySQL's and MariaDB's messages (and diesel-async's driver's) for the
/// errors Diesel does not map (see [`recovery`](crate::recovery())).
pub(crate) const MESSAGES: ServerMessages = ServerMessages {
    lock_conflict: &[
        (
            "1213 ER_LOCK_DEADLOCK",
            "Deadlock found when trying to get lock",
        ),
        ("1205 ER_LOCK_WAIT_TIMEOUT", "Lock wait timeout exceeded"),
        ("1020 ER_CHECKREAD", "Record has changed since last read"),
    ],
    lock_wait_timeout: &[("1205 ER_LOCK_WAIT_TIMEOUT", "Lock wait timeout exceeded")],
    connection_lost: &[
        ("2006 CR_SERVER_GONE_ERROR", "has gone away"),
        ("2013 CR_SERVER_LOST", "Lost connection to"),
        ("1053 ER_SERVER_SHUTDOWN", "Server shutdown in progress"),
        ("1927 ER_CONNECTION_KILLED", "Connection was killed"),
        (
            "1047 ER_UNKNOWN_COM_ERROR (Galera)",
            "WSREP has not yet prepared node for application use",
        ),
        // `--read-only`, and MySQL's `--super-read-only` (a demoted Group
        // Replication or InnoDB Cluster primary).
        ("1290 ER_OPTION_PREVENTS_STATEMENT", "read-only option"),
        (
            "4031 ER_CLIENT_INTERACTION_TIMEOUT",
            "disconnected by the server because of inactivity",
        ),
        // mysql_async (diesel-async's driver).
        ("mysql_async", "Connection to the server is closed"),
        ("mysql_async", "Input/output error"),
    ],
    refused_text: &[],
    // A failed statement does not abort a transaction here, but a deadlock
    // (or a lock wait timeout with `innodb_rollback_on_timeout`) rolls the
    // whole transaction back; the commit's release of the savepoint the
    // runner set when it began or claimed then fails (1305
    // ER_SP_DOES_NOT_EXIST), and so does the commit that checks a single
    // delivery's claim token (1231 ER_WRONG_VALUE_FOR_VAR).
    transaction_aborted: &[
        (
            "1305 ER_SP_DOES_NOT_EXIST",
            "SAVEPOINT inbox_transaction does not exist",
        ),
        ("1231 ER_WRONG_VALUE_FOR_VAR", claim_lost!()),
    ],
    // A statement handle the connection cached that the server does not
    // have (a proxy that multiplexes server connections).
    statements_lost: &[(
        "1243 ER_UNKNOWN_STMT_HANDLER",
        "Unknown prepared statement handler",
    )],
    // A `SET` whose assignment failed without an error of its own: Galera's
    // commit by `autocommit`, when an applier aborted the transaction and
    // the server replayed it (committed).
    commit_unanswered: &[(
        "1210 ER_WRONG_ARGUMENTS (Galera's replayed commit)",
        "Incorrect arguments to SET",
    )],
};

/// What a server that does not take a statement as a prepared statement
/// answers (1295 `ER_UNSUPPORTED_PS`): MySQL for some of the transaction
/// statements the blocking runner prepares (MariaDB takes them all). The
/// runner then sends them through `batch_execute`, as before.
pub(crate) const PREPARED_STATEMENT_REFUSED: &str =
    "not supported in the prepared statement protocol";

#[cfg(all(feature = "mysql", feature = "migrations"))]
pub(crate) use imp::MIGRATIONS;

/// The inbox table for MySQL/MariaDB queries of your own (re-exported as
/// `inbox_runtime::schema::mysql`).
///
/// The id columns are `VARBINARY` in the database and read as UTF-8 text.
#[cfg(feature = "mysql")]
pub mod table {
    diesel::table! {
        /// Claimed message ids, one row per `(handler, message_id)`.
        inbox_messages (handler, message_id) {
            /// The handler's deduplication scope.
            handler -> Text,
            /// The producer-assigned message id.
            message_id -> Text,
            /// When the id was claimed (UTC), by the database clock.
            received_at -> Datetime,
        }
    }
}

#[cfg(feature = "mysql")]
mod imp {
    use diesel::QueryResult;
    use diesel::mysql::Mysql;
    use diesel::query_builder::{AstPass, BoxedSqlQuery, SqlQuery};

    use crate::backend::prune_batch::{Delete, Pick};
    use crate::backend::{
        BatchReports, FailureSql, InboxBackend, KeyedInsert, LateTripwire, Lease, OutboxSql,
        PruneBatchStatement, PrunedTable, StoredClaimSql, migration_sql, outbox_leasable,
        push_claim_row, push_claim_row_with, sealed, values_sql,
    };
    use crate::fingerprint::Fingerprint;
    use crate::key::ClaimKey;

    /// The latest schema: the migrations' `up.sql` files, in order (the
    /// index is created only when missing).
    const SCHEMA_SQL: &str = concat!(
        migration_sql!("mysql", "2026-12-01-000000_create_inbox_messages", "up.sql"),
        "\n",
        migration_sql!("mysql", "2026-12-03-000000_handler_index", "up.sql"),
        "\n",
        migration_sql!("mysql", "2026-12-05-000000_failures", "up.sql"),
        "\n",
        migration_sql!(
            "mysql",
            "2026-12-06-000000_fingerprints_and_results",
            "up.sql"
        ),
        "\n",
        migration_sql!("mysql", "2026-12-07-000000_outbox", "up.sql"),
        "\n",
        migration_sql!("mysql", "2026-12-08-000000_claim_token", "up.sql"),
    );

    /// Fingerprints and stored results. The select is a locking read: in a
    /// transaction that has already read (a handler nested in its caller's
    /// transaction), a plain read would see that earlier snapshot, without
    /// the claim another transaction committed since.
    const STORED_CLAIMS: StoredClaimSql = StoredClaimSql {
        select: "SELECT fingerprint, result FROM inbox_messages \
                 WHERE handler = ? AND message_id = ? LOCK IN SHARE MODE",
        archived_select: None,
        store_result: "UPDATE inbox_messages SET result = ? WHERE handler = ? AND message_id = ?",
        store_fingerprint: "UPDATE inbox_messages SET fingerprint = ? \
             WHERE handler = ? AND message_id = ? AND fingerprint IS NULL",
    };

    /// Microseconds since the Unix epoch of a UTC `DATETIME(6)` column.
    macro_rules! micros {
        ($column:literal) => {
            concat!(
                "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', ",
                $column,
                ")"
            )
        };
    }

    /// Failed attempts, dead messages and the operator surface.
    /// `VALUES(col)` in `ON DUPLICATE KEY UPDATE` is what MariaDB and MySQL
    /// both take.
    const FAILURES: FailureSql = FailureSql {
        record_attempt: "INSERT INTO inbox_failures (handler, message_id, attempts, last_error) \
            VALUES (?, ?, 1, ?) ON DUPLICATE KEY UPDATE attempts = attempts + 1, \
            last_error = VALUES(last_error), last_failed_at = UTC_TIMESTAMP(6)",
        mark_exhausted: "UPDATE inbox_failures SET dead_at = UTC_TIMESTAMP(6) \
            WHERE handler = ? AND message_id = ? AND attempts >= ? AND dead_at IS NULL",
        mark_rejected: "UPDATE inbox_failures SET dead_at = UTC_TIMESTAMP(6), rejected = TRUE \
            WHERE handler = ? AND message_id = ?",
        list_dead: concat!(
            "SELECT CAST(handler AS CHAR) AS handler, CAST(message_id AS CHAR) AS message_id, attempts, ",
            "CAST(last_error AS CHAR) AS last_error, rejected, ",
            micros!("first_failed_at"),
            " AS first_failed_micros, ",
            micros!("last_failed_at"),
            " AS last_failed_micros, ",
            micros!("dead_at"),
            " AS dead_micros FROM inbox_failures ",
            "WHERE handler = ? AND dead_at IS NOT NULL AND (",
            micros!("dead_at"),
            " > ? OR (",
            micros!("dead_at"),
            " = ? AND message_id > ?)) ORDER BY dead_at, message_id LIMIT ?"
        ),
        dead_summary: concat!(
            "SELECT CAST(handler AS CHAR) AS handler, COUNT(*) AS dead, MIN(",
            micros!("dead_at"),
            ") AS oldest_micros FROM inbox_failures WHERE dead_at IS NOT NULL GROUP BY handler ORDER BY handler"
        ),
        revive_claims: "DELETE FROM inbox_messages WHERE handler = ? AND message_id IN \
            (SELECT message_id FROM inbox_failures WHERE handler = ? AND dead_at IS NOT NULL \
            AND (? IS NULL OR message_id = ?))",
        archived_claims: None,
        forget_dead: "DELETE FROM inbox_failures WHERE handler = ? AND dead_at IS NOT NULL \
            AND (? IS NULL OR message_id = ?)",
    };

    /// This backend's Diesel migrations.
    #[cfg(feature = "migrations")]
    pub(crate) const MIGRATIONS: diesel_migrations::EmbeddedMigrations =
        diesel_migrations::embed_migrations!("migrations/mysql");

    /// The outbox's statements (see [`OutboxSql`]). MySQL cannot update a
    /// table it reads in a subquery of the same statement (MariaDB can),
    /// so a lease locks its rows with `SELECT … FOR UPDATE SKIP LOCKED`
    /// and leases them by position, in one transaction; and a keyed
    /// message is two statements: the key's counter upserted (its row lock
    /// makes writers of one key take turns until they commit), then the
    /// message inserted with the counter's value.
    const OUTBOX: OutboxSql = OutboxSql {
        insert: "INSERT INTO inbox_outbox (id, destination, headers, payload) VALUES (?, ?, ?, ?)",
        insert_keyed: KeyedInsert::AdvanceThenInsert {
            advance: "INSERT INTO inbox_outbox_keys (ordering_key, last_seq) VALUES (?, 1) \
                 ON DUPLICATE KEY UPDATE last_seq = last_seq + 1",
            insert: "INSERT INTO inbox_outbox (id, destination, ordering_key, key_seq, headers, payload) \
                 SELECT ?, ?, ordering_key, last_seq, ?, ? FROM inbox_outbox_keys WHERE ordering_key = ?",
        },
        lease: Lease::LockThenWrite {
            select: concat!(
                "SELECT o.position, o.id, o.destination, o.ordering_key, o.headers, o.payload, o.attempts, \
                 o.key_seq, o.last_error, ",
                micros!("o.retry_at"),
                " AS retry_micros, ",
                micros!("o.created_at"),
                " AS created_micros FROM inbox_outbox o WHERE ",
                outbox_leasable!("UTC_TIMESTAMP(6)"),
                " ORDER BY o.position LIMIT ? FOR UPDATE SKIP LOCKED"
            ),
            lease: "UPDATE inbox_outbox SET lease_owner = ?, \
                 leased_until = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? * 1000 MICROSECOND) \
                 WHERE position IN (",
        },
        deleting_lease: None,
        mark_sent: "UPDATE inbox_outbox SET sent_at = UTC_TIMESTAMP(6), lease_owner = NULL, \
             leased_until = NULL WHERE sent_at IS NULL AND position IN (",
        delete_sent: "DELETE FROM inbox_outbox WHERE sent_at IS NULL AND position IN (",
        release: "UPDATE inbox_outbox SET lease_owner = NULL, leased_until = NULL \
             WHERE lease_owner = ? AND sent_at IS NULL AND position IN (",
        // MySQL assigns left to right, each assignment seeing the ones
        // before it: dead_at reads attempts before it is counted up.
        record_refusal: "UPDATE inbox_outbox SET \
             dead_at = CASE WHEN attempts + 1 >= ? THEN UTC_TIMESTAMP(6) END, \
             retry_at = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? * 1000 MICROSECOND), \
             attempts = attempts + 1, last_error = ?, lease_owner = NULL, leased_until = NULL \
             WHERE position = ? AND lease_owner = ? AND sent_at IS NULL",
        list_dead: concat!(
            "SELECT position, id, destination, ordering_key, attempts, last_error, ",
            micros!("created_at"),
            " AS created_micros, ",
            micros!("dead_at"),
            " AS dead_micros FROM inbox_outbox WHERE dead_at IS NOT NULL AND sent_at IS NULL \
             AND position > ? ORDER BY position LIMIT ?"
        ),
        revive: "UPDATE inbox_outbox SET dead_at = NULL, attempts = 0, retry_at = NULL, \
             last_error = NULL WHERE dead_at IS NOT NULL AND sent_at IS NULL \
             AND (? IS NULL OR id = ?)",
        discard: "DELETE FROM inbox_outbox WHERE dead_at IS NOT NULL AND sent_at IS NULL \
             AND (? IS NULL OR id = ?)",
        backlog: concat!(
            "SELECT COUNT(CASE WHEN dead_at IS NULL THEN 1 END) AS pending, ",
            "COUNT(dead_at) AS dead, MIN(CASE WHEN dead_at IS NULL THEN ",
            micros!("created_at"),
            " END) AS oldest_micros FROM inbox_outbox WHERE sent_at IS NULL"
        ),
    };

    impl sealed::Sealed for Mysql {}

    /// The assignments that begin a handler's transaction (a `SET` of their
    /// own, or the end of one): `autocommit` off, its value saved, and a
    /// claim token new to the transaction for the session (see
    /// [`LateTripwire`]), whether or not its claim writes it. (An async
    /// handler's plain claim, sent in one text with its begin, has a begin
    /// of its own without the token: see
    /// [`push_begin_and_claim`](InboxBackend::push_begin_and_claim).)
    macro_rules! begin_assignments {
        () => {
            concat!(
                autocommit_off!(),
                ", ",
                claim_token!(),
                " = ",
                new_claim_token!()
            )
        };
    }

    /// `autocommit` off, its value saved: the assignment that begins every
    /// handler's transaction.
    macro_rules! autocommit_off {
        () => {
            "@inbox_saved_autocommit = @@SESSION.autocommit, SESSION autocommit = 0"
        };
    }

    /// The start of the `SET` that begins a transaction bounded in its idle
    /// time: `wait_timeout` saved, and lowered to the number that follows.
    macro_rules! lower_wait_timeout {
        () => {
            "SET @inbox_saved_wait_timeout = @@SESSION.wait_timeout, SESSION wait_timeout = "
        };
    }

    /// The deadlock guard's tripwire where the claim writes no token (a
    /// batch's, and every claim on connections that send a text at a time):
    /// a savepoint that dies with the transaction, released before the
    /// commit.
    macro_rules! set_tripwire {
        () => {
            "SAVEPOINT inbox_transaction"
        };
    }

    /// Commits the transaction and restores `autocommit`, in one statement:
    /// turning `autocommit` on commits the open transaction (a commit the
    /// server refuses, a Galera certification failure, fails the statement
    /// and leaves `autocommit` off), then the saved value is put back.
    macro_rules! commit_and_restore_autocommit {
        () => {
            "SET SESSION autocommit = 1, SESSION autocommit = @inbox_saved_autocommit"
        };
    }

    /// What a fingerprinted duplicate's commit sets `autocommit` to when
    /// the claim it met stored another fingerprint: an invalid value, which
    /// fails the `SET` and changes none of its variables (see
    /// [`LateTripwire::end_duplicate_checked`]).
    macro_rules! payload_conflict {
        () => {
            "'inbox_payload_conflict'"
        };
    }

    /// The session's claim token, which the claim writes (see
    /// [`LateTripwire`]).
    macro_rules! claim_token {
        () => {
            "@inbox_claim_token"
        };
    }

    /// A claim token new to each call: a version-1 UUID's 16 bytes, which
    /// MySQL and MariaDB make unique on their server by its clock and
    /// across servers by the host's network address (`UUID()`).
    macro_rules! new_claim_token {
        () => {
            "UNHEX(REPLACE(UUID(), '-', ''))"
        };
    }

    /// The column and value a claim writes its token with.
    const CLAIM_TOKEN_COLUMN: (&str, &str) = ("claim_token", claim_token!());

    /// The batch claim, bound: a multi-row `INSERT IGNORE`, which reports
    /// only how many rows it inserted (MySQL has no `RETURNING`): all of
    /// them or none is an answer, in between is
    /// [`BatchClaimed::Mixed`](crate::backend::BatchClaimed::Mixed). The
    /// count is exact under concurrency: an id another transaction inserted
    /// and has not committed makes this statement wait for that
    /// transaction, and is then either present (it committed) or inserted
    /// here (it rolled back).
    fn claim_batch_query<'a>(
        handler: &'a str,
        ids: &'a [&'a str],
        bound: Option<&'a crate::backend::ClaimBound>,
    ) -> BoxedSqlQuery<'a, Mysql, SqlQuery> {
        use diesel::sql_types::Text;
        let insert = "INSERT IGNORE INTO inbox_messages (handler, message_id) VALUES ";
        let sql = match bound.filter(|_| bounds_claims()) {
            None => values_sql(insert, ids.len(), ""),
            Some(bound) => values_sql(&format!("{}{insert}", set_statement(bound)), ids.len(), ""),
        };
        let mut query = diesel::sql_query(sql).into_boxed();
        for id in ids {
            query = query.bind::<Text, _>(handler).bind::<Text, _>(*id);
        }
        query
    }

    /// Set once a server refused a bounded claim (MySQL): the process sends
    /// unbounded claims from then on.
    static BOUNDED_CLAIMS_REFUSED: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);

    /// Set once a server refused a claim that reads what it met (`INSERT …
    /// RETURNING`, MariaDB's): the process reads it with a statement of its
    /// own from then on.
    static READING_CLAIMS_REFUSED: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);

    /// Whether `error` is the server's, quoting `text` of the statement it
    /// refused (its parser quotes the text from where it stopped, in every
    /// language it speaks); recorded in `memo` for the process if so.
    fn refused_at(
        error: &diesel::result::Error,
        text: &str,
        memo: &std::sync::atomic::AtomicBool,
    ) -> bool {
        refused_at_any(error, &[text], memo)
    }

    /// [`refused_at`] any of `texts`.
    fn refused_at_any(
        error: &diesel::result::Error,
        texts: &[&str],
        memo: &std::sync::atomic::AtomicBool,
    ) -> bool {
        let refused = texts.iter().any(|text| quotes(error, text));
        if refused {
            memo.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        refused
    }

    /// Whether `error` is the server's and its message holds `text`.
    fn quotes(error: &diesel::result::Error, text: &str) -> bool {
        matches!(
            error,
            diesel::result::Error::DatabaseError(_, info) if info.message().contains(text)
        )
    }

    /// Where the parser of a server without `SET STATEMENT` (MySQL) stops
    /// in a bounded claim, as it quotes it: at `STATEMENT` or at the
    /// setting. The quote starts there: a text that failed before its
    /// claim (a begin sent with it) quotes the claim's bound too, after
    /// what failed.
    const BOUND_REFUSED_AT: &[&str] = &[
        "'STATEMENT innodb_lock_wait_timeout = ",
        "'innodb_lock_wait_timeout = ",
    ];

    /// Whether claims are sent bounded (see [`BOUNDED_CLAIMS_REFUSED`]).
    fn bounds_claims() -> bool {
        !BOUNDED_CLAIMS_REFUSED.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The format of the prefix that bounds one statement's lock wait (MariaDB's
    /// `SET STATEMENT`), its whole seconds to be written in.
    macro_rules! bound_prefix {
        () => {
            "SET STATEMENT innodb_lock_wait_timeout = {} FOR "
        };
    }

    /// `INSERT IGNORE INTO inbox_messages `, after the prefix that bounds its
    /// lock wait if `bound` is given, in one piece written on the stack:
    /// a text-keyed claim is written out on every execution, and a
    /// statement's text grows with each piece.
    fn push_insert(bound: Option<&crate::backend::ClaimBound>, out: &mut AstPass<'_, '_, Mysql>) {
        const INSERT: &str = "INSERT IGNORE INTO inbox_messages ";
        let Some(bound) = bound else {
            out.push_sql(INSERT);
            return;
        };
        let mut text = [0u8; 128];
        let mut rest = &mut text[..];
        let written = std::io::Write::write_fmt(
            &mut rest,
            format_args!(concat!(bound_prefix!(), "{}"), bound.seconds, INSERT),
        );
        let len = 128 - rest.len();
        match (written, std::str::from_utf8(&text[..len])) {
            (Ok(()), Ok(text)) => out.push_sql(text),
            // Never: the text is ASCII and fits.
            _ => {
                out.push_sql(&set_statement(bound));
                out.push_sql(INSERT);
            }
        }
    }

    /// `bytes` as a hex literal, `X'…'` (`X''` when empty).
    fn push_hex_literal(text: &mut String, bytes: &[u8]) {
        text.reserve(3 + 2 * bytes.len());
        text.push_str("X'");
        crate::backend::push_hex_digits(text, bytes);
        text.push('\'');
    }

    /// Room for all of a begin-and-claim text but its key's hex digits:
    /// the begin with its idle bound, the claim's bound and its `INSERT`
    /// (each number at its longest).
    const BEGIN_AND_CLAIM_BYTES: usize = 384;

    /// The prefix that bounds one statement's lock wait, in whole seconds.
    fn set_statement(bound: &crate::backend::ClaimBound) -> String {
        format!(bound_prefix!(), bound.seconds)
    }

    /// The affected-row count.
    const CLAIM_BATCH_REPORTS: BatchReports = BatchReports::Count;

    impl InboxBackend for Mysql {
        /// Two parameters per id; the server's limit is 65,535.
        const MAX_CLAIMS_PER_STATEMENT: usize = 1000;

        crate::backend::claim_batch_fns!();

        const CREATE_SCHEMA_SQL: &'static str = SCHEMA_SQL;
        const FAILURE_SQL: FailureSql = FAILURES;
        const OUTBOX_SQL: OutboxSql = OUTBOX;
        const STORED_CLAIM_SQL: StoredClaimSql = STORED_CLAIMS;
        const DROP_SCHEMA_SQL: &'static str = concat!(
            migration_sql!("mysql", "2026-12-07-000000_outbox", "down.sql"),
            migration_sql!("mysql", "2026-12-05-000000_failures", "down.sql"),
            migration_sql!(
                "mysql",
                "2026-12-01-000000_create_inbox_messages",
                "down.sql"
            ),
        );
        const OUTERMOST_BEGIN_SQL: &'static str =
            concat!("SET ", begin_assignments!(), "; ", set_tripwire!());
        const OUTERMOST_COMMIT_SQL: &'static str = concat!(
            "RELEASE SAVEPOINT inbox_transaction; ",
            commit_and_restore_autocommit!()
        );
        /// No release of the tripwire: a duplicate wrote nothing (its claim
        /// inserted no row, and what it read after it locks nothing), so a
        /// rollback the server made behind its back would have lost
        /// nothing, and committing ends the transaction as well.
        const OUTERMOST_DUPLICATE_COMMIT_SQL: &'static str = commit_and_restore_autocommit!();
        /// MariaDB describes `INSERT … RETURNING`'s columns only once it
        /// has run it: the row the reading claim returns, read by a query
        /// (what [`walk_reading_claim`](Self::walk_reading_claim) returns:
        /// the claim is this delivery's where the row holds the session's
        /// token, which the claim just wrote or met). A locking read, as
        /// the claim's own: it reads the row's latest version, which the
        /// claim holds locked, whatever the transaction read before.
        const READING_CLAIM_ROW_SQL: Option<&'static str> = Some(concat!(
            "SELECT claim_token <=> ",
            claim_token!(),
            " AS claimed, TRUE AS seen, fingerprint, result FROM inbox_messages ",
            "WHERE handler = ? AND message_id = ? FOR UPDATE"
        ));
        /// A claim that writes the token reads with MariaDB's `INSERT …
        /// RETURNING` (see [`walk_reading_claim`](Self::walk_reading_claim);
        /// on Diesel's blocking connection, see
        /// [`READING_CLAIM_ROW_SQL`](Self::READING_CLAIM_ROW_SQL)),
        /// until a server refuses it (MySQL has no `RETURNING`, MariaDB
        /// before 10.5 none on `INSERT`). Without a token, a returned row
        /// cannot tell a claim from a duplicate.
        fn claim_reads_stored(token: bool) -> bool {
            token && !READING_CLAIMS_REFUSED.load(std::sync::atomic::Ordering::Relaxed)
        }

        /// A syntax error at `RETURNING` (the server quotes the text from
        /// there on, in every language it speaks), or at the bound's `SET
        /// STATEMENT` (a server without it, MySQL, has no `RETURNING`
        /// either: the bound's refusal is recorded too, see
        /// [`bounded_claim_refused`](Self::bounded_claim_refused)).
        fn reading_claim_refused(error: &diesel::result::Error) -> bool {
            if Self::bounded_claim_refused(error) {
                READING_CLAIMS_REFUSED.store(true, std::sync::atomic::Ordering::Relaxed);
                return true;
            }
            refused_at(error, "'RETURNING claim_token", &READING_CLAIMS_REFUSED)
        }

        /// The token claim (see [`walk_token_claim`](Self::walk_token_claim))
        /// as an upsert that changes nothing on a duplicate, returning the
        /// row either way (MariaDB returns the row a duplicate met): the
        /// claim is this delivery's exactly when the row holds the
        /// session's token, which is new to each transaction. The row read
        /// is the latest committed one (an upsert reads what it locks), so
        /// a claim committed while this one waited for it is `seen` too.
        /// Where the claim is the row's, `<=>` makes it so even with no
        /// token at all; the commit's check (`=`) then refuses it.
        fn walk_reading_claim<'b>(
            key: &'b ClaimKey,
            fingerprint: Option<&'b Fingerprint>,
            bound: Option<&'b crate::backend::ClaimBound>,
            mut out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            Self::walk_token_claim(key, fingerprint, bound, out.reborrow())?;
            out.push_sql(concat!(
                " ON DUPLICATE KEY UPDATE received_at = received_at RETURNING claim_token <=> ",
                claim_token!(),
                " AS claimed, TRUE AS seen, fingerprint, result"
            ));
            Ok(())
        }
        const OUTERMOST_LATE_TRIPWIRE: Option<LateTripwire> = Some(LateTripwire {
            begin: concat!("SET ", begin_assignments!()),
            set: set_tripwire!(),
            end_unset: commit_and_restore_autocommit!(),
            end_duplicate_checked: concat!(
                "SET SESSION autocommit = IF(EXISTS(SELECT 1 FROM inbox_messages ",
                "WHERE fingerprint <> ? AND handler = ? AND message_id = ?), ",
                payload_conflict!(),
                ", 'ON'), SESSION autocommit = @inbox_saved_autocommit"
            ),
            committed_claim: concat!(
                "SELECT fingerprint, result FROM inbox_messages WHERE handler = ? AND message_id = ? ",
                "AND claim_token = ",
                claim_token!()
            ),
        });
        /// The saved `autocommit` restored where this transaction's begin
        /// saved one: a begin sent in one text with the claim may have
        /// failed before it saved anything (on a new session, nothing was
        /// ever saved).
        const OUTERMOST_ROLLBACK_SQL: &'static str = "ROLLBACK; SET SESSION autocommit = \
             IFNULL(@inbox_saved_autocommit, @@SESSION.autocommit)";
        const ABORTED_TRANSACTION_PROBE_SQL: Option<&'static str> = None;
        const PREPARED_TRANSACTION_SQL: bool = true;
        /// The last assignment of the commit's and the rollback's final
        /// `SET`: a commit that fails changes none of them, and the
        /// rollback that follows restores `wait_timeout`, where this
        /// transaction's begin saved it (see
        /// [`OUTERMOST_ROLLBACK_SQL`](Self::OUTERMOST_ROLLBACK_SQL); a user
        /// variable never set is a string, which `wait_timeout` refuses:
        /// hence the cast).
        const BOUNDED_IDLE_END_SQL: &'static str = ", SESSION wait_timeout = \
             CAST(IFNULL(@inbox_saved_wait_timeout, @@SESSION.wait_timeout) AS UNSIGNED)";

        /// `wait_timeout` (MySQL and MariaDB alike) closes a connection idle
        /// for that long, in a transaction or not, so it is lowered for the
        /// handler's transaction only and restored when it ends. Saved and
        /// lowered in the `SET` that turns `autocommit` off: the begin is
        /// two statements, that `SET` and the savepoint.
        fn bounded_idle_begin(
            limit: std::time::Duration,
        ) -> Option<crate::backend::IdleBoundedBegin> {
            let seconds = limit.as_secs_f64().ceil().clamp(1.0, 31_536_000.0) as u64;
            Some(crate::backend::IdleBoundedBegin {
                before: lower_wait_timeout!(),
                bound: seconds,
                after: concat!(", ", begin_assignments!(), "; ", set_tripwire!()),
            })
        }
        const PRUNE_BEFORE_BEGIN_SQL: &'static str =
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";
        const PRUNE_AFTER_BEGIN_SQL: &'static str = "";

        /// `SET STATEMENT innodb_lock_wait_timeout = N FOR`: the server
        /// takes no placeholder for `N` (1232 "Incorrect argument type").
        const BOUND_IN_CLAIM_TEXT: bool = true;

        fn bounds_claims() -> bool {
            bounds_claims()
        }

        /// `SET STATEMENT innodb_lock_wait_timeout = N FOR` the claim
        /// (MariaDB): the session's own wait is untouched. InnoDB counts
        /// whole seconds, so the bound is rounded up.
        fn walk_bounded_claim<'b>(
            key: &'b ClaimKey,
            fingerprint: Option<&'b Fingerprint>,
            bound: &'b crate::backend::ClaimBound,
            mut out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            push_insert(Some(bound), &mut out);
            push_claim_row(key, fingerprint, &mut out)
        }

        /// MySQL has no `SET STATEMENT` (MariaDB's): its parser refuses the
        /// bounded claim, which ran nothing and left the transaction as it
        /// was. Told by the text it quotes from where it stopped (in every
        /// language the server speaks), see [`BOUND_REFUSED_AT`].
        fn bounded_claim_refused(error: &diesel::result::Error) -> bool {
            refused_at_any(error, BOUND_REFUSED_AT, &BOUNDED_CLAIMS_REFUSED)
        }

        fn walk_claim<'b>(
            key: &'b ClaimKey,
            fingerprint: Option<&'b Fingerprint>,
            mut out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            // `ON DUPLICATE KEY UPDATE` cannot be used: Diesel connects with
            // CLIENT_FOUND_ROWS, so a duplicate would also report one row.
            out.push_sql("INSERT IGNORE INTO inbox_messages ");
            push_claim_row(key, fingerprint, &mut out)
        }

        /// The claim with `claim_token` set to the session's token, in
        /// the same statement otherwise.
        fn walk_token_claim<'b>(
            key: &'b ClaimKey,
            fingerprint: Option<&'b Fingerprint>,
            bound: Option<&'b crate::backend::ClaimBound>,
            mut out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            push_insert(bound, &mut out);
            push_claim_row_with(key, fingerprint, CLAIM_TOKEN_COLUMN, &mut out)
        }

        const CLAIMS_AS_TEXT: bool = true;

        /// `SET [wait_timeout lowered, ]autocommit off; SAVEPOINT
        /// inbox_transaction; [SET STATEMENT innodb_lock_wait_timeout = N
        /// FOR] INSERT INTO inbox_messages (handler, message_id) VALUES
        /// (X'…', X'…')`: the begin of [`OUTERMOST_BEGIN_SQL`] without the
        /// claim token (the savepoint is the deadlock guard here, and a
        /// token is for a claim that reads what it met), then the claim,
        /// the key's bytes as hex literals, which no quote, backslash or
        /// `sql_mode` can change the meaning of (binary strings, as the
        /// `VARBINARY` columns hold them: the same bytes as a bound text).
        /// Unlike the prepared claim's `INSERT IGNORE`, a duplicate fails it
        /// (1062, a unique violation).
        ///
        /// [`OUTERMOST_BEGIN_SQL`]: InboxBackend::OUTERMOST_BEGIN_SQL
        fn push_begin_and_claim(
            text: &mut String,
            idle_seconds: Option<u64>,
            key: &ClaimKey,
            bound: Option<crate::backend::ClaimBound>,
        ) -> bool {
            use std::fmt::Write;
            if key.fingerprint().is_some() {
                return false;
            }
            // The text's own statements and the bound, then two hex digits
            // per byte of the key: one allocation.
            let (handler, id) = (key.handler().as_str(), key.message_id());
            text.reserve(BEGIN_AND_CLAIM_BYTES + 2 * (handler.len() + id.len()));
            // Writing to a `String` cannot fail.
            match idle_seconds {
                Some(seconds) => {
                    let _ = write!(text, concat!(lower_wait_timeout!(), "{}, "), seconds);
                }
                None => text.push_str("SET "),
            }
            text.push_str(concat!(autocommit_off!(), "; ", set_tripwire!(), "; "));
            if let Some(bound) = bound {
                let _ = write!(text, bound_prefix!(), bound.seconds);
            }
            text.push_str("INSERT INTO inbox_messages (handler, message_id) VALUES (");
            push_hex_literal(text, handler.as_bytes());
            text.push_str(", ");
            push_hex_literal(text, id.as_bytes());
            text.push(')');
            true
        }

        /// An outgoing message's insert as text, for the commit's: every
        /// value a hex literal, which no quote, backslash or `sql_mode`
        /// changes (the columns are bytes). Sent only where the commit is
        /// one text in one round trip (diesel-async's); Diesel's blocking
        /// connection sends its statements one by one, prepared.
        fn outbox_insert_text(
            id: &str,
            destination: &str,
            headers: &[u8],
            payload: &[u8],
        ) -> Option<String> {
            Some(crate::backend::insert_text(
                [id, destination],
                [headers, payload],
                |text, value| push_hex_literal(text, value.as_bytes()),
                push_hex_literal,
            ))
        }

        /// The claim token's check is in the `SET` that commits: turning
        /// `autocommit` on commits, while the string the check gives it
        /// when the claim is gone is an invalid value, which fails the
        /// statement, and MySQL and MariaDB then change none of its
        /// variables: `autocommit` stays off, the transaction open, and the
        /// runner rolls it back. The read is a plain one: the transaction's
        /// own claim is in its view, and a claim with another token is not
        /// this delivery's.
        fn walk_claim_check<'b>(
            key: &'b ClaimKey,
            mut out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            use diesel::sql_types::Text;
            out.push_sql(
                "SET SESSION autocommit = IF(EXISTS(SELECT 1 FROM inbox_messages WHERE handler = ",
            );
            out.push_bind_param::<Text, str>(key.handler().as_str())?;
            out.push_sql(" AND message_id = ");
            out.push_bind_param::<Text, str>(key.message_id())?;
            out.push_sql(concat!(
                " AND claim_token = ",
                claim_token!(),
                "), 'ON', ",
                claim_lost!(),
                "), SESSION autocommit = @inbox_saved_autocommit"
            ));
            Ok(())
        }

        /// 1054 ER_BAD_FIELD_ERROR, found when the statement is prepared:
        /// told by the column's name, which the server quotes in every
        /// language it speaks.
        fn claim_token_refused(error: &diesel::result::Error) -> bool {
            matches!(
                error,
                diesel::result::Error::DatabaseError(_, info)
                    if info.message().contains("'claim_token'")
            )
        }

        /// The expired keys are picked in a derived table (which MySQL
        /// materializes because of its `LIMIT`) with `SKIP LOCKED`, then
        /// joined to the table by primary key. `STRAIGHT_JOIN` keeps that
        /// order: the other order scans the whole table and waits on every
        /// row a live handler holds.
        ///
        /// The pick walks an index oldest first and stops after `limit`
        /// rows: for one handler `(handler, received_at)`, which holds that
        /// handler's rows only; otherwise `received_at`. InnoDB locks every
        /// row a locking read passes, so the index decides which rows a
        /// batch holds. Left to itself, the optimizer reads a one-handler
        /// scope through the primary key (`handler = ?`) and sorts, locking
        /// every expired row of the handler in every batch; through
        /// `received_at` it would lock every other handler's row it walks
        /// past. So the index is forced. (A batch that reaches the end of its
        /// scope also locks the index entry that ends it, the scope's next
        /// row, until it commits: InnoDB reads one entry past a range.)
        fn walk_prune_batch<'b>(
            batch: &'b PruneBatchStatement<'_>,
            out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            const CUTOFF: (&str, &str) = ("UTC_TIMESTAMP(6) - INTERVAL ", " MICROSECOND");
            if batch.table() == PrunedTable::Outbox {
                const PICK: Pick = Pick {
                    select: "SELECT position FROM inbox_outbox FORCE INDEX (inbox_outbox_sent_at_idx)",
                    key: "sent_at",
                    cutoff: CUTOFF,
                };
                return Delete {
                    head: "DELETE inbox_outbox FROM (",
                    one_handler: PICK,
                    all: PICK,
                    lock: " FOR UPDATE SKIP LOCKED",
                    tail: ") AS expired STRAIGHT_JOIN inbox_outbox ON inbox_outbox.position = expired.position",
                }
                .walk(batch, out);
            }
            if batch.table() == PrunedTable::Failures {
                return Delete {
                    head: "DELETE inbox_failures FROM (",
                    one_handler: Pick {
                        select: "SELECT handler, message_id FROM inbox_failures \
                                 FORCE INDEX (inbox_failures_handler_last_failed_at_idx)",
                        key: "last_failed_at",
                        cutoff: CUTOFF,
                    },
                    all: Pick {
                        select: "SELECT handler, message_id FROM inbox_failures \
                                 FORCE INDEX (inbox_failures_last_failed_at_idx)",
                        key: "last_failed_at",
                        cutoff: CUTOFF,
                    },
                    lock: " FOR UPDATE SKIP LOCKED",
                    tail: ") AS expired STRAIGHT_JOIN inbox_failures \
                           ON inbox_failures.handler = expired.handler AND inbox_failures.message_id = expired.message_id",
                }
                .walk(batch, out);
            }
            Delete {
                head: "DELETE inbox_messages FROM (",
                one_handler: Pick {
                    select: "SELECT handler, message_id FROM inbox_messages \
                             FORCE INDEX (inbox_messages_handler_received_at_idx)",
                    key: "received_at",
                    cutoff: CUTOFF,
                },
                all: Pick {
                    select: "SELECT handler, message_id FROM inbox_messages \
                             FORCE INDEX (inbox_messages_received_at_idx)",
                    key: "received_at",
                    cutoff: CUTOFF,
                },
                lock: " FOR UPDATE SKIP LOCKED",
                tail: ") AS expired STRAIGHT_JOIN inbox_messages \
                       ON inbox_messages.handler = expired.handler AND inbox_messages.message_id = expired.message_id",
            }
            .walk(batch, out)
        }

        crate::backend::next_prune_handler_fns!();
        crate::backend::bound_statement_fn!();

        /// Under a named lock of the database's (DDL commits as it goes, so
        /// a transaction would not hold a lock): a concurrent setup waits up
        /// to ten minutes for it, then finds everything created. Released
        /// whatever `create` returned.
        fn setup_in_turn<C, F>(conn: &mut C, create: F) -> QueryResult<()>
        where
            C: diesel::Connection<Backend = Self>,
            F: FnOnce(&mut C) -> QueryResult<()>,
        {
            // Lock names are at most 64 characters: the database's name hashed.
            conn.batch_execute(
                "DO GET_LOCK(CONCAT('inbox_runtime.setup ', MD5(DATABASE())), 600)",
            )?;
            let created = create(conn);
            let released = conn
                .batch_execute("DO RELEASE_LOCK(CONCAT('inbox_runtime.setup ', MD5(DATABASE())))");
            created.and(released)
        }
    }

    #[cfg(test)]
    mod tests {
        use std::time::Duration;

        use crate::backend::PruneScope;
        use crate::backend::prune_batch::batch_sql;
        use crate::key::HandlerName;
        use diesel::mysql::Mysql;

        /// The begin and claim sent as one text: the begin as a handler's
        /// without the claim token (the idle bound where given), the
        /// savepoint, the claim with the key's bytes as hex literals and
        /// the bound where given; none for a fingerprinted key (its
        /// duplicate reads what it met).
        #[test]
        fn begin_and_claim_text() {
            use crate::backend::{ClaimBound, InboxBackend};
            use crate::key::ClaimKey;
            let key = ClaimKey::new(HandlerName::new("h.x").unwrap(), "it's\\é").unwrap();
            let mut text = String::new();
            assert!(Mysql::push_begin_and_claim(&mut text, None, &key, None));
            assert_eq!(
                text,
                "SET @inbox_saved_autocommit = @@SESSION.autocommit, SESSION autocommit = 0; \
                 SAVEPOINT inbox_transaction; INSERT INTO inbox_messages (handler, message_id) \
                 VALUES (X'682E78', X'697427735CC3A9')"
            );
            let mut text = String::new();
            let bound = ClaimBound::of(Duration::from_millis(1500));
            assert!(Mysql::push_begin_and_claim(
                &mut text,
                Some(60),
                &key,
                Some(bound)
            ));
            assert_eq!(
                text,
                "SET @inbox_saved_wait_timeout = @@SESSION.wait_timeout, SESSION wait_timeout = \
                 60, @inbox_saved_autocommit = @@SESSION.autocommit, SESSION autocommit = 0; \
                 SAVEPOINT inbox_transaction; SET STATEMENT innodb_lock_wait_timeout = 2 FOR \
                 INSERT INTO inbox_messages (handler, message_id) VALUES (X'682E78', \
                 X'697427735CC3A9')"
            );
            // At the longest numbers, the text fits in what was reserved
            // for it: one allocation.
            let key_bytes = "h.x".len() + "it's\\é".len();
            let mut text = String::with_capacity(super::BEGIN_AND_CLAIM_BYTES + 2 * key_bytes);
            let reserved = text.capacity();
            let longest = ClaimBound::of(Duration::MAX);
            assert!(Mysql::push_begin_and_claim(
                &mut text,
                Some(u64::MAX),
                &key,
                Some(longest)
            ));
            assert!(text.len() <= super::BEGIN_AND_CLAIM_BYTES + 2 * key_bytes);
            assert_eq!(text.capacity(), reserved, "nothing beyond the reservation");
            let fingerprinted = key.with_fingerprint(crate::Fingerprint::of("payload").unwrap());
            let mut text = String::from("kept");
            assert!(!Mysql::push_begin_and_claim(
                &mut text,
                None,
                &fingerprinted,
                None
            ));
            assert_eq!(text, "kept");
        }

        /// A bounded claim's refusal is told by where the parser stopped,
        /// not by the bound's text anywhere in the message: a begin sent
        /// with the claim that failed quotes the claim's bound after it.
        #[test]
        fn bound_refusal_starts_at_the_bound() {
            use diesel::result::{DatabaseErrorKind, Error};
            let syntax = |near: &str| {
                Error::DatabaseError(
                    DatabaseErrorKind::Unknown,
                    Box::new(format!(
                        "You have an error in your SQL syntax; check the manual that \
                         corresponds to your MySQL server version for the right syntax to \
                         use near '{near}' at line 1"
                    )),
                )
            };
            let refused = |error: &Error| {
                super::BOUND_REFUSED_AT
                    .iter()
                    .any(|at| super::quotes(error, at))
            };
            assert!(refused(&syntax(
                "innodb_lock_wait_timeout = 2 FOR INSERT INTO inbox_messages (handler, m"
            )));
            assert!(refused(&syntax(
                "STATEMENT innodb_lock_wait_timeout = 2 FOR INSERT INTO inbox_messages"
            )));
            assert!(!refused(&syntax(
                "SAVEPOINX inbox_transaction; SET STATEMENT innodb_lock_wait_timeout = 2 FOR"
            )));
        }

        #[test]
        fn prune_batch_sql() {
            let a = HandlerName::new("a").unwrap();
            let sql = batch_sql::<Mysql>(PruneScope::Handler(&a), Duration::from_millis(1), 5);
            assert!(sql.starts_with("DELETE inbox_messages FROM (SELECT handler, message_id FROM inbox_messages FORCE INDEX (inbox_messages_handler_received_at_idx) WHERE received_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AND handler = ? ORDER BY received_at LIMIT ? FOR UPDATE SKIP LOCKED) AS expired STRAIGHT_JOIN"), "{sql}");
            assert!(sql.ends_with("-- binds: [1000, \"a\", 5]"), "{sql}");
            let sql = batch_sql::<Mysql>(PruneScope::All, Duration::from_millis(1), 5);
            assert!(
                sql.contains("FORCE INDEX (inbox_messages_received_at_idx) WHERE"),
                "{sql}"
            );
        }
    }
}
