//! Diesel's transaction depth on a connection, as the suites assert it
//! after a delivery (a handler must leave the depth it found).

/// Diesel's transaction depth on `conn` (0: none open).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::{Connection, SqliteConnection};
/// let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// assert_eq!(inbox_tests::transaction_depth(&mut conn), 0);
/// conn.transaction(|conn| {
///     assert_eq!(inbox_tests::transaction_depth(conn), 1);
///     diesel::QueryResult::Ok(())
/// })
/// .unwrap();
/// # }
/// ```
pub fn transaction_depth<C: diesel::Connection>(conn: &mut C) -> u32 {
    use diesel::connection::TransactionManager;
    C::TransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .expect("the transaction manager is not broken")
        .map_or(0, std::num::NonZeroU32::get)
}

/// Diesel-async's transaction depth on `conn` (0: none open).
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) {
/// assert_eq!(inbox_tests::transaction_depth_async(conn), 0);
/// # }
/// ```
#[cfg(feature = "async")]
pub fn transaction_depth_async<C: diesel_async::AsyncConnection>(conn: &mut C) -> u32 {
    <C::TransactionManager as diesel_async::TransactionManager<C>>::transaction_manager_status_mut(
        conn,
    )
    .transaction_depth()
    .expect("the transaction manager is not broken")
    .map_or(0, std::num::NonZeroU32::get)
}
