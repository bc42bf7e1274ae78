//! The check on diesel-async connections (features `testing` and `async`):
//! the same steps as the blocking one, awaiting an async closure.

use std::fmt;
use std::panic::AssertUnwindSafe;

use diesel_async::{AsyncConnection, TransactionManager};
use futures_util::FutureExt;

use super::digest::sealed::Digest as _;
use super::digest::{Digest, Selection};
use super::{Delivery, DigestBackend, Idempotence, IdempotenceReport, IdempotenceViolation};

/// [`check_idempotent`](super::check_idempotent) on a diesel-async
/// connection: `deliver` is an async closure calling your `async`
/// `#[idempotent]` handler.
///
/// ```
/// # #[cfg(feature = "async-postgres")]
/// # async fn example(conn: &mut diesel_async::AsyncPgConnection) {
/// use diesel_async::{AsyncPgConnection, RunQueryDsl};
/// use inbox_runtime::idempotent;
/// use inbox_runtime::testing::check_idempotent_async;
///
/// struct Deposit { id: String }
///
/// #[idempotent(id = msg.id, handler = "bank.deposit.4")]
/// async fn deposit(conn: &mut AsyncPgConnection, msg: &Deposit) -> diesel::QueryResult<()> {
///     diesel::sql_query("UPDATE account SET cents = cents + 1").execute(conn).await?;
///     Ok(())
/// }
///
/// let msg = Deposit { id: "dep-1".into() };
/// let report = check_idempotent_async(conn, async |conn| deposit(conn, &msg).await).await;
/// assert!(report.is_ok(), "{}", report.unwrap_err());
/// # }
/// ```
pub async fn check_idempotent_async<C, F, R, E>(
    conn: &mut C,
    deliver: F,
) -> Result<IdempotenceReport, IdempotenceViolation>
where
    C: AsyncConnection,
    C::Backend: DigestBackend,
    F: AsyncFnMut(&mut C) -> Result<R, E>,
    E: fmt::Display,
{
    Idempotence::new().check_async(conn, deliver).await
}

/// [`check_idempotent_async`], panicking with the violation's sentence.
///
/// ```
/// # #[cfg(feature = "async-postgres")]
/// # async fn example(conn: &mut diesel_async::AsyncPgConnection) {
/// use diesel_async::AsyncPgConnection;
/// use inbox_runtime::idempotent;
/// use inbox_runtime::testing::assert_idempotent_async;
///
/// #[idempotent(id = id, handler = "noop.2")]
/// async fn noop(conn: &mut AsyncPgConnection, id: &str) -> diesel::QueryResult<()> {
///     Ok(())
/// }
///
/// assert_idempotent_async(conn, async |conn| noop(conn, "m-1").await).await;
/// # }
/// ```
pub async fn assert_idempotent_async<C, F, R, E>(conn: &mut C, deliver: F) -> IdempotenceReport
where
    C: AsyncConnection,
    C::Backend: DigestBackend,
    F: AsyncFnMut(&mut C) -> Result<R, E>,
    E: fmt::Display,
{
    Idempotence::new().assert_async(conn, deliver).await
}

impl Idempotence {
    /// [`check`](Self::check) on a diesel-async connection (features
    /// `testing` and `async`).
    ///
    /// ```
    /// # #[cfg(feature = "async-postgres")]
    /// # async fn example(conn: &mut diesel_async::AsyncPgConnection) {
    /// use diesel_async::AsyncPgConnection;
    /// use inbox_runtime::idempotent;
    /// use inbox_runtime::testing::Idempotence;
    ///
    /// #[idempotent(id = id, handler = "noop.3")]
    /// async fn noop(conn: &mut AsyncPgConnection, id: &str) -> diesel::QueryResult<()> {
    ///     Ok(())
    /// }
    ///
    /// let report = Idempotence::new()
    ///     .tables(["inbox_messages"])
    ///     .check_async(conn, async |conn| noop(conn, "m-1").await)
    ///     .await;
    /// # }
    /// ```
    pub async fn check_async<C, F, R, E>(
        &self,
        conn: &mut C,
        mut deliver: F,
    ) -> Result<IdempotenceReport, IdempotenceViolation>
    where
        C: AsyncConnection,
        C::Backend: DigestBackend,
        F: AsyncFnMut(&mut C) -> Result<R, E>,
        E: fmt::Display,
    {
        super::no_hidden_errors()?;
        no_transaction_open(conn)?;

        // 1. The probe: a delivery inside a transaction that rolls back.
        let before_probe = self.digest_async(conn, "before the probe").await?;
        probe(conn, &mut deliver).await?;
        let after_probe = self.digest_async(conn, "after the probe").await?;
        let escaped = super::changes(&before_probe, &after_probe);
        if !escaped.is_empty() {
            return Err(IdempotenceViolation::WroteOutsideTransaction { tables: escaped });
        }

        // 2. The first delivery: processed, so one more claim.
        let claims_before = count_claims(conn, "before the first delivery").await?;
        deliver(conn)
            .await
            .map_err(|error| IdempotenceViolation::DeliveryFailed {
                delivery: Delivery::First,
                error: error.to_string(),
            })?;
        let claims_after_first = count_claims(conn, "after the first delivery").await?;
        let new_claims = claims_after_first - claims_before;
        if new_claims <= 0 {
            return Err(IdempotenceViolation::NotProcessed { new_claims });
        }

        // 3. The second delivery: a duplicate, which changes nothing.
        let before_second = self
            .digest_async(conn, "before the second delivery")
            .await?;
        deliver(conn)
            .await
            .map_err(|error| IdempotenceViolation::DeliveryFailed {
                delivery: Delivery::Second,
                error: error.to_string(),
            })?;
        let claims_after_second = count_claims(conn, "after the second delivery").await?;
        if claims_after_second != claims_after_first {
            return Err(IdempotenceViolation::NotDuplicate {
                new_claims: claims_after_second - claims_after_first,
            });
        }
        let after_second = self.digest_async(conn, "after the second delivery").await?;
        let changed = super::changes(&before_second, &after_second);
        if !changed.is_empty() {
            return Err(IdempotenceViolation::ChangedOnDuplicate { tables: changed });
        }

        Ok(IdempotenceReport {
            tables: after_second.keys().cloned().collect(),
            claims: new_claims,
        })
    }

    /// [`check_async`](Self::check_async), panicking with the violation's
    /// sentence.
    ///
    /// ```
    /// # #[cfg(feature = "async-postgres")]
    /// # async fn example(conn: &mut diesel_async::AsyncPgConnection) {
    /// use diesel_async::AsyncPgConnection;
    /// use inbox_runtime::idempotent;
    /// use inbox_runtime::testing::Idempotence;
    ///
    /// #[idempotent(id = id, handler = "noop.4")]
    /// async fn noop(conn: &mut AsyncPgConnection, id: &str) -> diesel::QueryResult<()> {
    ///     Ok(())
    /// }
    ///
    /// Idempotence::new().assert_async(conn, async |conn| noop(conn, "m-1").await).await;
    /// # }
    /// ```
    pub async fn assert_async<C, F, R, E>(&self, conn: &mut C, deliver: F) -> IdempotenceReport
    where
        C: AsyncConnection,
        C::Backend: DigestBackend,
        F: AsyncFnMut(&mut C) -> Result<R, E>,
        E: fmt::Display,
    {
        match self.check_async(conn, deliver).await {
            Ok(report) => report,
            Err(violation) => panic!("idempotence check failed: {violation}"),
        }
    }

    async fn digest_async<C>(
        &self,
        conn: &mut C,
        during: &'static str,
    ) -> Result<Digest, IdempotenceViolation>
    where
        C: AsyncConnection,
        C::Backend: DigestBackend,
    {
        let listed;
        let tables = match &self.selection {
            Selection::Named(tables) => tables,
            Selection::All => {
                listed = C::Backend::tables_async(conn).await.map_err(|error| {
                    IdempotenceViolation::Database {
                        during: format!("reading the tables {during}"),
                        error,
                    }
                })?;
                &listed
            }
        };
        let mut digest = Digest::new();
        for table in tables {
            let table_digest = C::Backend::digest_table_async(conn, table)
                .await
                .map_err(super::reading_table(table, during))?;
            digest.insert(table.label.clone(), table_digest);
        }
        Ok(digest)
    }
}

fn no_transaction_open<C>(conn: &mut C) -> Result<(), IdempotenceViolation>
where
    C: AsyncConnection,
{
    super::no_transaction_in(C::TransactionManager::transaction_manager_status_mut(conn))
}

/// The blocking probe's steps, awaited: one delivery inside a transaction of the
/// check's own, rolled back whatever happens (a panic is resumed after the
/// rollback).
async fn probe<C, F, R, E>(conn: &mut C, deliver: &mut F) -> Result<(), IdempotenceViolation>
where
    C: AsyncConnection,
    F: AsyncFnMut(&mut C) -> Result<R, E>,
    E: fmt::Display,
{
    C::TransactionManager::begin_transaction(conn)
        .await
        .map_err(|error| IdempotenceViolation::Database {
            during: "opening the probe's transaction".to_owned(),
            error,
        })?;
    let delivered = AssertUnwindSafe(async {
        deliver(&mut *conn)
            .await
            .map(drop)
            .map_err(|error| error.to_string())
    })
    .catch_unwind()
    .await;
    let rolled_back = C::TransactionManager::rollback_transaction(conn).await;
    let delivered = match delivered {
        Ok(delivered) => delivered,
        Err(panic) => std::panic::resume_unwind(panic),
    };
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

async fn count_claims<C>(conn: &mut C, during: &'static str) -> Result<i64, IdempotenceViolation>
where
    C: AsyncConnection,
    C::Backend: DigestBackend,
{
    C::Backend::count_claims_async(conn)
        .await
        .map_err(|error| IdempotenceViolation::Database {
            during: format!("counting the rows of inbox_messages {during}"),
            error,
        })
}
