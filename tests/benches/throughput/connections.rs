//! What differs per connection type: the effect (a one-row `UPDATE` of the
//! delivering connection's own account, through Diesel's DSL; Diesel never
//! caches an `UPDATE`'s prepared statement) and the hand-written claim sent
//! as uncached SQL (`diesel::sql_query` with binds, which Diesel never
//! caches either).

use diesel::connection::LoadConnection;
use diesel::prelude::*;
use diesel::sql_types::{Integer, Text};
use inbox_runtime::InboxBackend;

diesel::table! {
    bench_account (id) {
        id -> BigInt,
        cents -> BigInt,
    }
}

/// The accounts: one row per delivering connection, so that connections
/// never wait on each other's effect.
pub fn accounts_sql(count: usize) -> String {
    let rows: Vec<String> = (0..count).map(|id| format!("({id}, 0)")).collect();
    format!(
        "CREATE TABLE bench_account (id BIGINT PRIMARY KEY, cents BIGINT NOT NULL);
         INSERT INTO bench_account (id, cents) VALUES {};",
        rows.join(", ")
    )
}

/// A blocking connection the bench delivers on.
pub trait BenchConnection: LoadConnection<Backend: InboxBackend> + Send + 'static {
    /// The effect: one row `UPDATE`d.
    fn effect(&mut self, account: i64) -> QueryResult<usize>;

    /// The effects of `count` messages in one statement.
    fn effect_by(&mut self, account: i64, count: i64) -> QueryResult<usize>;

    /// The claim as uncached SQL with two binds: 1 row for a new id, 0 for
    /// a duplicate.
    fn claim_uncached(&mut self, handler: &str, id: &str) -> QueryResult<usize>;

    /// `SELECT 1` as a statement Diesel prepares once and caches: one round
    /// trip from its second execution on.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    fn select_one(&mut self) -> QueryResult<i32>;
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
const ON_CONFLICT_DOLLAR: &str = "INSERT INTO inbox_messages (handler, message_id) VALUES ($1, $2) \
     ON CONFLICT (handler, message_id) DO NOTHING";
#[cfg(feature = "mysql")]
const INSERT_IGNORE: &str = "INSERT IGNORE INTO inbox_messages (handler, message_id) VALUES (?, ?)";

macro_rules! blocking {
    ($connection:ty, $claim:expr) => {
        impl BenchConnection for $connection {
            fn effect(&mut self, account: i64) -> QueryResult<usize> {
                diesel::update(bench_account::table.find(account))
                    .set(bench_account::cents.eq(bench_account::cents + 1))
                    .execute(self)
            }

            fn effect_by(&mut self, account: i64, count: i64) -> QueryResult<usize> {
                diesel::update(bench_account::table.find(account))
                    .set(bench_account::cents.eq(bench_account::cents + count))
                    .execute(self)
            }

            fn claim_uncached(&mut self, handler: &str, id: &str) -> QueryResult<usize> {
                diesel::sql_query($claim)
                    .bind::<Text, _>(handler)
                    .bind::<Text, _>(id)
                    .execute(self)
            }

            fn select_one(&mut self) -> QueryResult<i32> {
                diesel::select(1_i32.into_sql::<Integer>()).get_result(self)
            }
        }
    };
}

#[cfg(feature = "postgres")]
blocking!(diesel::PgConnection, ON_CONFLICT_DOLLAR);
#[cfg(feature = "mysql")]
blocking!(diesel::MysqlConnection, INSERT_IGNORE);
// SQLite reads `$1` and `$2` as numbered parameters.
#[cfg(feature = "sqlite")]
blocking!(diesel::SqliteConnection, ON_CONFLICT_DOLLAR);

#[cfg(feature = "async")]
pub use self::nonblocking::AsyncBenchConnection;

#[cfg(feature = "async")]
mod nonblocking {
    use std::future::Future;

    use diesel::QueryResult;
    use diesel::prelude::*;
    use diesel::sql_types::Text;
    use diesel_async::{AsyncConnection, RunQueryDsl};
    use inbox_runtime::outbox::{self, OutgoingMessage};
    use inbox_runtime::{InboxBackend, InboxError, Outcome, idempotent};

    use super::bench_account;

    /// A diesel-async connection the bench delivers on.
    pub trait AsyncBenchConnection:
        AsyncConnection<Backend: InboxBackend> + Send + 'static
    {
        /// The effect: one row `UPDATE`d.
        fn effect(&mut self, account: i64) -> impl Future<Output = QueryResult<usize>> + Send;

        /// The effects of `count` messages in one statement.
        fn effect_by(
            &mut self,
            account: i64,
            count: i64,
        ) -> impl Future<Output = QueryResult<usize>> + Send;

        /// The claim as uncached SQL with two binds.
        fn claim_uncached<'a>(
            &'a mut self,
            handler: &'a str,
            id: &'a str,
        ) -> impl Future<Output = QueryResult<usize>> + Send + 'a;

        /// The deadlock guard a hand-written claim needs on this server
        /// (`claim-guarded`): its begin, commit and rollback texts; `None`
        /// where a failed statement aborts the transaction (PostgreSQL).
        const GUARD: Option<[&'static str; 3]>;

        /// Message `id` through an `#[idempotent]` handler written for
        /// this connection type, whose body is [`effect`](Self::effect):
        /// what a user's handler on it costs (on `AsyncPgConnection`, its
        /// `BEGIN` travels with the claim).
        fn handle(
            &mut self,
            id: u64,
            account: i64,
        ) -> impl Future<Output = Result<Outcome<()>, InboxError>> + Send;

        /// [`handle`](Self::handle) whose body also records `message`
        /// (`outbox::send_async`): the async `outbox` variants.
        fn announce<'a>(
            &'a mut self,
            id: u64,
            account: i64,
            message: &'a OutgoingMessage,
        ) -> impl Future<Output = Result<Outcome<()>, InboxError>> + Send + 'a;
    }

    macro_rules! nonblocking {
        ($connection:ty, $claim:expr, $guard:expr) => {
            impl AsyncBenchConnection for $connection {
                const GUARD: Option<[&'static str; 3]> = $guard;

                fn effect(
                    &mut self,
                    account: i64,
                ) -> impl Future<Output = QueryResult<usize>> + Send {
                    diesel::update(bench_account::table.find(account))
                        .set(bench_account::cents.eq(bench_account::cents + 1))
                        .execute(self)
                }

                fn effect_by(
                    &mut self,
                    account: i64,
                    count: i64,
                ) -> impl Future<Output = QueryResult<usize>> + Send {
                    diesel::update(bench_account::table.find(account))
                        .set(bench_account::cents.eq(bench_account::cents + count))
                        .execute(self)
                }

                fn claim_uncached<'a>(
                    &'a mut self,
                    handler: &'a str,
                    id: &'a str,
                ) -> impl Future<Output = QueryResult<usize>> + Send + 'a {
                    diesel::sql_query($claim)
                        .bind::<Text, _>(handler)
                        .bind::<Text, _>(id)
                        .execute(self)
                }

                fn handle(
                    &mut self,
                    id: u64,
                    account: i64,
                ) -> impl Future<Output = Result<Outcome<()>, InboxError>> + Send {
                    #[idempotent(id = id, handler = "bench.throughput", shared_scope)]
                    async fn handle(
                        conn: &mut $connection,
                        id: u64,
                        account: i64,
                    ) -> Result<Outcome<()>, InboxError> {
                        conn.effect(account).await?;
                        Ok(Outcome::Processed(()))
                    }
                    handle(self, id, account)
                }

                fn announce<'a>(
                    &'a mut self,
                    id: u64,
                    account: i64,
                    message: &'a OutgoingMessage,
                ) -> impl Future<Output = Result<Outcome<()>, InboxError>> + Send + 'a {
                    #[idempotent(id = id, handler = "bench.throughput", shared_scope)]
                    async fn announce(
                        conn: &mut $connection,
                        id: u64,
                        account: i64,
                        message: &OutgoingMessage,
                    ) -> Result<Outcome<()>, InboxError> {
                        conn.effect(account).await?;
                        outbox::send_async(conn, message).await?;
                        Ok(Outcome::Processed(()))
                    }
                    announce(self, id, account, message)
                }
            }
        };
    }

    #[cfg(feature = "postgres")]
    nonblocking!(
        diesel_async::AsyncPgConnection,
        super::ON_CONFLICT_DOLLAR,
        None
    );
    #[cfg(feature = "mysql")]
    nonblocking!(
        diesel_async::AsyncMysqlConnection,
        super::INSERT_IGNORE,
        Some([
            "SET SESSION autocommit = 0; SAVEPOINT bench_guard",
            "RELEASE SAVEPOINT bench_guard; SET SESSION autocommit = 1",
            "ROLLBACK; SET SESSION autocommit = 1",
        ])
    );
}
