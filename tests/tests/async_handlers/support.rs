//! What the async tests share: a fresh database with the effects table,
//! counts of effects and claims, a deterministic cancellation, a shuffle,
//! and lock waits.

use std::time::{Duration, Instant};

use inbox_tests::proxy::Proxy;
use inbox_tests::{AsyncSqlRows, ServerBackend, TestBackend};

use crate::handlers::{EFFECTS_DDL, literal};

/// A fresh schema with the suite's effects table, a direct connection to
/// it, and one through a proxy that counts its round trips.
pub struct Counted<B: TestBackend> {
    /// Kept to the end: its schema is dropped with it.
    _db: B,
    pub direct: B::AsyncConnection,
    pub proxy: Proxy,
    pub conn: B::AsyncConnection,
}

/// [`Counted`], or `None` when the server is skipped.
pub async fn counted<B: ServerBackend>() -> Option<Counted<B>> {
    use diesel_async::AsyncConnection;
    let (db, direct) = B::open_async_with_effects(EFFECTS_DDL).await?;
    let (template, upstream) = Proxy::split_url(db.url(), B::DEFAULT_PORT);
    let proxy = Proxy::start(&upstream);
    let url = B::async_tcp_url(&proxy.url(&template));
    let conn = B::AsyncConnection::establish(&url)
        .await
        .expect("connect through the proxy");
    Some(Counted {
        _db: db,
        direct,
        proxy,
        conn,
    })
}

/// Round trips of one delivery through `proxy`.
pub async fn flights<T>(proxy: &Proxy, delivery: impl Future<Output = T>) -> (T, u64) {
    let before = proxy.flights();
    let result = delivery.await;
    (result, proxy.flights() - before)
}

/// A fresh database with the effects table, and a connection to it.
pub async fn fresh<B: TestBackend>() -> Option<(B, B::AsyncConnection)> {
    B::open_async_with_effects(EFFECTS_DDL).await
}

/// The effects recorded for message `id`.
pub async fn effects(conn: &mut impl AsyncSqlRows, id: &str) -> i64 {
    conn.bigint(&format!(
        "SELECT COUNT(*) AS value FROM async_effects WHERE message_id = {}",
        literal(id)
    ))
    .await
}

/// Every effect recorded.
pub async fn all_effects(conn: &mut impl AsyncSqlRows) -> i64 {
    conn.bigint("SELECT COUNT(*) AS value FROM async_effects")
        .await
}

/// The claims of `handler` for message `id`.
pub async fn claims(conn: &mut impl AsyncSqlRows, handler: &str, id: &str) -> i64 {
    conn.bigint(&format!(
        "SELECT COUNT(*) AS value FROM inbox_messages WHERE handler = {} AND message_id = {}",
        literal(handler),
        literal(id)
    ))
    .await
}

/// The effects of `id` and its claims by `handler` (see [`effects`],
/// [`claims`]) read by one statement, so in one snapshot: a `COMMIT` the
/// server finishes after its client dropped the connection cannot land
/// between the two reads.
pub async fn effects_and_claims(
    conn: &mut impl AsyncSqlRows,
    handler: &str,
    id: &str,
) -> (i64, i64) {
    let both = conn
        .bigint(&format!(
            "SELECT (SELECT COUNT(*) FROM async_effects WHERE message_id = {id}) * 1000 \
             + (SELECT COUNT(*) FROM inbox_messages WHERE handler = {handler} \
                AND message_id = {id}) AS value",
            id = literal(id),
            handler = literal(handler),
        ))
        .await;
    (both / 1000, both % 1000)
}

/// Every claim in the inbox.
pub async fn all_claims(conn: &mut impl AsyncSqlRows) -> i64 {
    conn.bigint("SELECT COUNT(*) AS value FROM inbox_messages")
        .await
}

pub use inbox_tests::transaction_depth_async as depth;

/// Waits until `count` of the connections `ids` are inside their claim
/// statement, behind the holder's lock.
pub async fn wait_for_lock_waiters<B: ServerBackend>(
    observer: &mut B::AsyncConnection,
    ids: &[i64],
    count: i64,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting = observer
            .bigint(&format!("SELECT {} AS value", B::lock_waiters_sql(ids)))
            .await;
        if waiting >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{ids:?} never waited for the claim"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub use inbox_tests::CancelAfter;

/// A std-only xorshift64 generator to shuffle delivery orders.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            items.swap(i, (self.0 % (i as u64 + 1)) as usize);
        }
    }
}

/// Requires `T: Send` at compile time.
pub fn assert_send<T: Send>(value: T) -> T {
    value
}
