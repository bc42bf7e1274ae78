//! SQLite (feature `sqlite`): everything the inbox does differently on it,
//! in one place.
//!
//! - **Schema**: written out in `schema.sql` (its 2026-12-03 migration
//!   rebuilds the table, which [`setup`](crate::setup) runs only for a table
//!   that still needs it: [`InboxBackend::upgrade_schema`]).
//! - **Claim**: `INSERT … ON CONFLICT (handler, message_id) DO NOTHING`;
//!   with a fingerprint, one that compares it with the claim it meets
//!   (`walk_comparing_claim`), so that a fingerprinted duplicate runs one
//!   statement, as a plain one does.
//! - **Commit**: a plain `COMMIT`; no idle bound (SQLite has no server).
//! - **Pruning batch**: `DELETE … WHERE (handler, message_id) IN (SELECT …
//!   LIMIT ?)`: one writer at a time, so no row locks to skip.
//! - **Errors**: none of its own to recognise by message.

use super::ServerMessages;

/// SQLite reports nothing by message that its error kinds do not tell.
pub(crate) const MESSAGES: ServerMessages = ServerMessages {
    lock_conflict: &[],
    lock_wait_timeout: &[("5 SQLITE_BUSY", "database is locked")],
    connection_lost: &[],
    refused_text: &[],
    // SQLite does not abort a transaction on a failed statement.
    transaction_aborted: &[],
    statements_lost: &[],
    commit_unanswered: &[],
};

#[cfg(all(feature = "sqlite", feature = "migrations"))]
pub(crate) use imp::MIGRATIONS;

/// The inbox table for SQLite queries of your own (re-exported as
/// `inbox_runtime::schema::sqlite`).
#[cfg(feature = "sqlite")]
pub mod table {
    diesel::table! {
        /// Claimed message ids, one row per `(handler, message_id)`.
        inbox_messages (handler, message_id) {
            /// The handler's deduplication scope.
            handler -> Text,
            /// The producer-assigned message id.
            message_id -> Text,
            /// When the id was claimed (UTC), by the database clock.
            received_at -> Timestamp,
        }
    }
}

#[cfg(feature = "sqlite")]
mod imp {
    use diesel::QueryResult;
    use diesel::connection::Connection;
    use diesel::query_builder::{AstPass, BoxedSqlQuery, SqlQuery};
    use diesel::sqlite::Sqlite;

    use crate::backend::prune_batch::{Delete, Pick};
    use crate::backend::{
        BatchReports, FailureSql, InboxBackend, KeyedInsert, Lease, OutboxSql, PruneBatchStatement,
        PrunedTable, StoredClaimSql, migration_sql, outbox_leasable, sealed, values_sql,
    };
    use crate::fingerprint::Fingerprint;
    use crate::key::ClaimKey;

    /// The latest schema, written out: the 2026-12-03 migration rebuilds
    /// the table, which [`upgrade`] does only for a table that needs it.
    const SCHEMA_SQL: &str = concat!(
        include_str!("sqlite/schema.sql"),
        "\n",
        migration_sql!("sqlite", "2026-12-05-000000_failures", "up.sql"),
        "\n",
        migration_sql!("sqlite", "2026-12-07-000000_outbox", "up.sql"),
    );

    /// Fingerprints and stored results.
    const STORED_CLAIMS: StoredClaimSql = StoredClaimSql {
        select: "SELECT fingerprint, result FROM inbox_messages WHERE handler = ? AND message_id = ?",
        archived_select: None,
        store_result: "UPDATE inbox_messages SET result = ? WHERE handler = ? AND message_id = ?",
        store_fingerprint: "UPDATE inbox_messages SET fingerprint = ? \
             WHERE handler = ? AND message_id = ? AND fingerprint IS NULL",
    };

    /// Microseconds since the Unix epoch of a UTC text column
    /// (`YYYY-MM-DD HH:MM:SS.SSS`), exactly.
    macro_rules! micros {
        ($column:literal) => {
            concat!(
                "(CAST(strftime('%s', ",
                $column,
                ") AS INTEGER) * 1000000 + ",
                "CAST(substr(strftime('%f', ",
                $column,
                "), 4) AS INTEGER) * 1000)"
            )
        };
    }

    /// Failed attempts, dead messages and the operator surface.
    const FAILURES: FailureSql = FailureSql {
        record_attempt: "INSERT INTO inbox_failures (handler, message_id, attempts, last_error) \
            VALUES (?, ?, 1, ?) ON CONFLICT (handler, message_id) DO UPDATE SET \
            attempts = attempts + 1, last_error = excluded.last_error, \
            last_failed_at = strftime('%Y-%m-%d %H:%M:%f', 'now')",
        mark_exhausted: "UPDATE inbox_failures SET dead_at = strftime('%Y-%m-%d %H:%M:%f', 'now') \
            WHERE handler = ? AND message_id = ? AND attempts >= ? AND dead_at IS NULL",
        mark_rejected: "UPDATE inbox_failures SET dead_at = strftime('%Y-%m-%d %H:%M:%f', 'now'), rejected = TRUE \
            WHERE handler = ? AND message_id = ?",
        list_dead: concat!(
            "SELECT handler, message_id, attempts, last_error, rejected, ",
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
            "SELECT handler, COUNT(*) AS dead, MIN(",
            micros!("dead_at"),
            ") AS oldest_micros ",
            "FROM inbox_failures WHERE dead_at IS NOT NULL GROUP BY handler ORDER BY handler"
        ),
        revive_claims: "DELETE FROM inbox_messages WHERE handler = ? AND message_id IN \
            (SELECT message_id FROM inbox_failures WHERE handler = ? AND dead_at IS NOT NULL \
            AND (? IS NULL OR message_id = ?))",
        archived_claims: None,
        forget_dead: "DELETE FROM inbox_failures WHERE handler = ? AND dead_at IS NOT NULL \
            AND (? IS NULL OR message_id = ?)",
    };

    /// The rebuild of an inbox created before 2026-12-03.
    const REBUILD_SQL: &str = migration_sql!(
        "sqlite",
        "2026-12-03-000000_handler_index_and_encoding_independent_checks",
        "up.sql"
    );

    /// The 2026-12-06 columns (fingerprint, result).
    const PAYLOAD_COLUMNS_SQL: &str = migration_sql!(
        "sqlite",
        "2026-12-06-000000_fingerprints_and_results",
        "up.sql"
    );

    /// This backend's Diesel migrations.
    #[cfg(feature = "migrations")]
    pub(crate) const MIGRATIONS: diesel_migrations::EmbeddedMigrations =
        diesel_migrations::embed_migrations!("migrations/sqlite");

    /// Rebuilds an inbox whose length checks count bytes in the database's
    /// encoding (created before 2026-12-03: in a UTF-16 database they refuse
    /// valid ids), and adds the 2026-12-06 columns (fingerprint, result)
    /// to a table that lacks them, in one transaction; an inbox already up
    /// to date is left alone.
    ///
    /// The table's definition is read from `sqlite_master`. Only a count can
    /// come back through a generic `Connection`, so the check is an `INSERT
    /// … SELECT` into a temporary table, which counts the outdated
    /// definitions.
    fn upgrade<C>(conn: &mut C) -> QueryResult<()>
    where
        C: Connection<Backend = Sqlite>,
    {
        conn.transaction(|conn| {
            conn.batch_execute(
                "CREATE TEMP TABLE IF NOT EXISTS inbox_outdated_schema (name TEXT); \
                 DELETE FROM temp.inbox_outdated_schema",
            )?;
            let outdated = conn.execute_returning_count(&diesel::sql_query(
                "INSERT INTO temp.inbox_outdated_schema (name) \
                 SELECT name FROM main.sqlite_master \
                 WHERE type = 'table' AND name = 'inbox_messages' \
                   AND (instr(sql, 'length(CAST(handler AS BLOB)) BETWEEN 1 AND 255)') > 0 \
                     OR instr(sql, 'length(CAST(message_id AS BLOB)) BETWEEN 1 AND 255)') > 0)",
            ))?;
            if outdated > 0 {
                conn.batch_execute(REBUILD_SQL)?;
            }
            // The 2026-12-06 columns, where an earlier version's table (or
            // the rebuild, which keeps the 2026-12-03 columns) lacks them.
            conn.batch_execute("DELETE FROM temp.inbox_outdated_schema")?;
            let has_payload_columns = conn.execute_returning_count(&diesel::sql_query(
                "INSERT INTO temp.inbox_outdated_schema (name) \
                 SELECT name FROM pragma_table_info('inbox_messages') WHERE name = 'fingerprint'",
            ))?;
            conn.batch_execute("DROP TABLE temp.inbox_outdated_schema")?;
            if has_payload_columns == 0 {
                conn.batch_execute(PAYLOAD_COLUMNS_SQL)?;
            }
            Ok(())
        })
    }

    /// The outbox's statements (see [`OutboxSql`]). SQLite has one writer
    /// at a time: a lease is one `UPDATE … RETURNING` (no row locks to
    /// skip), and a keyed message two statements, the key's counter
    /// upserted and the message inserted with its value.
    const OUTBOX: OutboxSql = OutboxSql {
        insert: "INSERT INTO inbox_outbox (id, destination, headers, payload) VALUES (?, ?, ?, ?)",
        insert_keyed: KeyedInsert::AdvanceThenInsert {
            advance: "INSERT INTO inbox_outbox_keys (ordering_key, last_seq) VALUES (?, 1) \
                 ON CONFLICT (ordering_key) DO UPDATE SET last_seq = last_seq + 1",
            insert: "INSERT INTO inbox_outbox (id, destination, ordering_key, key_seq, headers, payload) \
                 SELECT ?, ?, ordering_key, last_seq, ?, ? FROM inbox_outbox_keys WHERE ordering_key = ?",
        },
        lease: Lease::Returning(concat!(
            "UPDATE inbox_outbox SET lease_owner = ?, ",
            "leased_until = strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', ? / 1000.0)) ",
            "WHERE position IN (SELECT o.position FROM inbox_outbox o WHERE ",
            outbox_leasable!("strftime('%Y-%m-%d %H:%M:%f', 'now')"),
            " ORDER BY o.position LIMIT ?) ",
            "RETURNING position, id, destination, ordering_key, headers, payload, attempts, \
             key_seq, last_error, ",
            micros!("retry_at"),
            " AS retry_micros, ",
            micros!("created_at"),
            " AS created_micros"
        )),
        deleting_lease: None,
        mark_sent: "UPDATE inbox_outbox SET sent_at = strftime('%Y-%m-%d %H:%M:%f', 'now'), \
             lease_owner = NULL, leased_until = NULL WHERE sent_at IS NULL AND position IN (",
        delete_sent: "DELETE FROM inbox_outbox WHERE sent_at IS NULL AND position IN (",
        release: "UPDATE inbox_outbox SET lease_owner = NULL, leased_until = NULL \
             WHERE lease_owner = ? AND sent_at IS NULL AND position IN (",
        record_refusal: "UPDATE inbox_outbox SET \
             dead_at = CASE WHEN attempts + 1 >= ? THEN strftime('%Y-%m-%d %H:%M:%f', 'now') END, \
             retry_at = strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', ? / 1000.0)), \
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
        // Two scans, each of a partial index's rows (pending, dead): one
        // scan of both would read the kept sent messages as well.
        backlog: concat!(
            "SELECT p.pending, d.dead, p.oldest_micros FROM (SELECT COUNT(*) AS pending, ",
            micros!("MIN(created_at)"),
            " AS oldest_micros FROM inbox_outbox WHERE sent_at IS NULL AND dead_at IS NULL) p, ",
            "(SELECT COUNT(*) AS dead FROM inbox_outbox WHERE dead_at IS NOT NULL AND sent_at IS NULL) d"
        ),
    };

    impl sealed::Sealed for Sqlite {}

    /// The batch claim, bound: a multi-row `INSERT … ON CONFLICT DO
    /// NOTHING RETURNING` (SQLite 3.35 or later), which returns the ids it
    /// inserted.
    fn claim_batch_query<'a>(
        handler: &'a str,
        ids: &'a [&'a str],
        _bound: Option<&'a crate::backend::ClaimBound>,
    ) -> BoxedSqlQuery<'a, Sqlite, SqlQuery> {
        use diesel::sql_types::Text;
        let sql = values_sql(
            "INSERT INTO inbox_messages (handler, message_id) VALUES ",
            ids.len(),
            " ON CONFLICT (handler, message_id) DO NOTHING RETURNING message_id",
        );
        let mut query = diesel::sql_query(sql).into_boxed();
        for id in ids {
            query = query.bind::<Text, _>(handler).bind::<Text, _>(*id);
        }
        query
    }

    /// `RETURNING message_id`.
    const CLAIM_BATCH_REPORTS: BatchReports = BatchReports::Returning;

    /// The claim of `key`; given a fingerprint, one that compares it with
    /// the fingerprint stored with a claim it meets, in the same statement
    /// (an embedded database's statement costs no round trip, but a
    /// second one costs a duplicate about half again):
    ///
    /// - a new key: inserted, one row;
    /// - a claim stored with the same fingerprint, or none (a batch's
    ///   claim): nothing updated, no row, as a plain duplicate;
    /// - a claim stored with another: the update sets `handler` to null,
    ///   which its `NOT NULL` refuses. SQLite undoes the failed statement
    ///   alone and keeps the transaction, which the delivery then reads the
    ///   stored claim in, for the conflict's error
    ///   ([`InboxBackend::claim_met_another_fingerprint`]). A `BEFORE
    ///   UPDATE` trigger of the user's on the table sees that update (one
    ///   that skips it, `RAISE(IGNORE)`, would make the conflict read as a
    ///   duplicate); the schema's `NOT NULL` is what refuses it.
    fn walk_comparing_claim<'b>(
        key: &'b ClaimKey,
        fingerprint: Option<&'b Fingerprint>,
        mut out: AstPass<'_, 'b, Sqlite>,
    ) -> QueryResult<()> {
        if fingerprint.is_none() {
            return crate::backend::walk_insert_on_conflict_do_nothing(key, None, out);
        }
        out.push_sql("INSERT INTO inbox_messages ");
        crate::backend::push_claim_row(key, fingerprint, &mut out)?;
        out.push_sql(
            " ON CONFLICT (handler, message_id) DO UPDATE SET handler = NULL \
             WHERE inbox_messages.fingerprint <> excluded.fingerprint",
        );
        Ok(())
    }

    impl InboxBackend for Sqlite {
        /// Two parameters per id, under the 999 of SQLite builds before
        /// 3.32.
        const MAX_CLAIMS_PER_STATEMENT: usize = 499;

        crate::backend::claim_batch_fns!();

        const CREATE_SCHEMA_SQL: &'static str = SCHEMA_SQL;
        const DROP_SCHEMA_SQL: &'static str = concat!(
            migration_sql!("sqlite", "2026-12-07-000000_outbox", "down.sql"),
            migration_sql!("sqlite", "2026-12-05-000000_failures", "down.sql"),
            migration_sql!(
                "sqlite",
                "2026-12-01-000000_create_inbox_messages",
                "down.sql"
            ),
        );
        const FAILURE_SQL: FailureSql = FAILURES;
        const OUTBOX_SQL: OutboxSql = OUTBOX;
        const STORED_CLAIM_SQL: StoredClaimSql = STORED_CLAIMS;
        const OUTERMOST_BEGIN_SQL: &'static str = "BEGIN";
        const OUTERMOST_ROLLBACK_SQL: &'static str = "ROLLBACK";
        const OUTERMOST_COMMIT_SQL: &'static str = "COMMIT";
        const OUTERMOST_DUPLICATE_COMMIT_SQL: &'static str = Self::OUTERMOST_COMMIT_SQL;
        /// Never: an embedded database's reads cost no round trip.
        fn claim_reads_stored(_token: bool) -> bool {
            false
        }
        const OUTERMOST_LATE_TRIPWIRE: Option<crate::backend::LateTripwire> = None;
        const ABORTED_TRANSACTION_PROBE_SQL: Option<&'static str> = None;
        const PREPARED_TRANSACTION_SQL: bool = false;
        const BOUNDED_IDLE_END_SQL: &'static str = "";

        fn bounded_idle_begin(
            _limit: std::time::Duration,
        ) -> Option<crate::backend::IdleBoundedBegin> {
            None
        }
        const PRUNE_BEFORE_BEGIN_SQL: &'static str = "";
        const PRUNE_AFTER_BEGIN_SQL: &'static str = "";

        fn walk_claim<'b>(
            key: &'b ClaimKey,
            fingerprint: Option<&'b Fingerprint>,
            out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            walk_comparing_claim(key, fingerprint, out)
        }

        /// See [`walk_comparing_claim`].
        const FINGERPRINTED_CLAIM_COMPARES: bool = true;

        /// The `NOT NULL` of `handler`, which only the comparing claim's
        /// update can break (a claim's key is never null).
        fn claim_met_another_fingerprint(error: &diesel::result::Error) -> bool {
            use diesel::result::{DatabaseErrorKind, Error};
            matches!(
                error,
                Error::DatabaseError(DatabaseErrorKind::NotNullViolation, info)
                    if info.message().contains("inbox_messages.handler")
            )
        }

        /// No bound to write: see `bounds_claims`.
        const BOUND_IN_CLAIM_TEXT: bool = false;

        /// One writer at a time: a claim waits for the database's write
        /// lock (whichever message holds it) as the connection's
        /// `busy_timeout` says, and is refused as busy after it.
        fn bounds_claims() -> bool {
            false
        }

        fn walk_bounded_claim<'b>(
            key: &'b ClaimKey,
            fingerprint: Option<&'b Fingerprint>,
            _bound: &'b crate::backend::ClaimBound,
            out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            walk_comparing_claim(key, fingerprint, out)
        }

        /// One writer at a time, so no row locks to skip; the table has no
        /// rowid, so rows are picked by primary key. The cutoff is formatted
        /// like the column (`YYYY-MM-DD HH:MM:SS.SSS`, UTC) so text
        /// comparison orders by time. A batch over one handler walks
        /// `(handler, received_at)` (`INDEXED BY`).
        fn walk_prune_batch<'b>(
            batch: &'b PruneBatchStatement<'_>,
            out: AstPass<'_, 'b, Self>,
        ) -> QueryResult<()> {
            const CUTOFF: (&str, &str) = (
                "strftime('%Y-%m-%d %H:%M:%f', 'now', printf('-%.6f seconds', ",
                " / 1000000.0))",
            );
            if batch.table() == PrunedTable::Outbox {
                const PICK: Pick = Pick {
                    select: "SELECT position FROM inbox_outbox INDEXED BY inbox_outbox_sent_at_idx",
                    key: "sent_at",
                    cutoff: CUTOFF,
                };
                return Delete {
                    head: "DELETE FROM inbox_outbox WHERE position IN (",
                    one_handler: PICK,
                    all: PICK,
                    lock: "",
                    tail: ")",
                }
                .walk(batch, out);
            }
            if batch.table() == PrunedTable::Failures {
                return Delete {
                    head: "DELETE FROM inbox_failures WHERE (handler, message_id) IN (",
                    one_handler: Pick {
                        select: "SELECT handler, message_id FROM inbox_failures \
                                 INDEXED BY inbox_failures_handler_last_failed_at_idx",
                        key: "last_failed_at",
                        cutoff: CUTOFF,
                    },
                    all: Pick {
                        select: "SELECT handler, message_id FROM inbox_failures",
                        key: "last_failed_at",
                        cutoff: CUTOFF,
                    },
                    lock: "",
                    tail: ")",
                }
                .walk(batch, out);
            }
            Delete {
                head: "DELETE FROM inbox_messages WHERE (handler, message_id) IN (",
                one_handler: Pick {
                    select: "SELECT handler, message_id FROM inbox_messages \
                             INDEXED BY inbox_messages_handler_received_at_idx",
                    key: "received_at",
                    cutoff: CUTOFF,
                },
                all: Pick {
                    select: "SELECT handler, message_id FROM inbox_messages",
                    key: "received_at",
                    cutoff: CUTOFF,
                },
                lock: "",
                tail: ")",
            }
            .walk(batch, out)
        }

        crate::backend::next_prune_handler_fns!();
        crate::backend::bound_statement_fn!();

        fn upgrade_schema<C>(conn: &mut C) -> QueryResult<()>
        where
            C: Connection<Backend = Self>,
        {
            upgrade(conn)
        }
    }

    #[cfg(test)]
    mod tests {
        use std::time::Duration;

        use crate::backend::PruneScope;
        use crate::backend::prune_batch::batch_sql;
        use diesel::sqlite::Sqlite;

        #[test]
        fn prune_batch_sql() {
            let sql = batch_sql::<Sqlite>(PruneScope::All, Duration::from_secs(60), 5);
            assert!(
                sql.contains("(handler, message_id) IN (SELECT handler, message_id"),
                "{sql}"
            );
            assert!(sql.ends_with("-- binds: [60000000, 5]"), "{sql}");
        }
    }
}
