//! The text of the errors about the connection parameter, second
//! connections and pools.

use super::{HANDLER, assert_errors, assert_no_errors, assert_one_error};

#[test]
fn checks_the_connection_parameter() {
    assert_one_error(
        "id = msg.id",
        "fn f(msg: &M) -> Result<(), E> { Ok(()) }",
        &[
            "this handler has no connection parameter; the attribute needs the `&mut` Diesel connection its body writes through (or name it with `conn = ...`)",
        ],
    );
    assert_one_error(
        "id = msg.id, conn = db",
        HANDLER,
        &[
            "`db` is not a parameter of this handler; `conn = ...` must name the connection parameter (its parameters are `conn`, `msg`)",
        ],
    );
    assert_one_error(
        "id = self.id, conn = self, handler = \"h\"",
        "fn f(&mut self, c: &mut C) -> Result<(), E> { Ok(()) }",
        &["`self` cannot be the connection parameter"],
    );
    assert_one_error(
        "id = msg.id, conn = conn",
        "fn f(conn: &C, msg: &M) -> Result<(), E> { Ok(()) }",
        &["the connection parameter `conn` is a shared reference"],
    );
    assert_one_error(
        "id = msg.id",
        "fn f(_: &mut C, msg: &M) -> Result<(), E> { Ok(()) }",
        &["the connection parameter must be a plain name"],
    );
}

#[test]
fn says_what_is_wrong_with_each_connection_candidate() {
    let shared = "the connection parameter `conn` is a shared reference (`&PgConnection`); it must be `&mut` (or owned), since the transaction needs exclusive use of the connection: write `conn: &mut PgConnection`";
    assert_one_error(
        "id = msg.id",
        "fn f(conn: &PgConnection, msg: &M) -> Result<(), E> { Ok(()) }",
        &[shared],
    );
    // A `&mut` message is not taken for the connection when a shared
    // connection is what was meant.
    assert_one_error(
        "id = msg.id",
        "fn f(conn: &PgConnection, msg: &mut M) -> Result<(), E> { Ok(()) }",
        &[shared],
    );
    assert_one_error(
        "id = msg.id",
        "async fn f(conn: &'a AsyncPgConnection, msg: &M) -> Result<(), E> { Ok(()) }",
        &[
            "`conn` is a shared reference (`&'a AsyncPgConnection`)",
            "write `conn: &'a mut AsyncPgConnection`",
        ],
    );
    assert_one_error(
        "id = msg.id",
        "fn f(conn: &Conn, msg: &M) -> Result<(), E> { Ok(()) }",
        &["`conn` is a shared reference (`&Conn`)"],
    );
    // One error per candidate.
    assert_errors(
        "id = msg.id",
        "fn f(a: &PgConnection, b: &deadpool::Object<M>, msg: &M) -> Result<(), E> { Ok(()) }",
        &[
            &["`a` is a shared reference (`&PgConnection`)"],
            &["`b` is a shared reference (`&deadpool::Object<M>`)"],
        ],
    );
    // An owned value whose type hides the connection: name it.
    assert_one_error(
        "id = msg.id",
        "fn f(conn: Conn, msg: &M) -> Result<(), E> { Ok(()) }",
        &[
            "`conn: Conn` may be one behind a type alias",
            "name it with `#[idempotent(conn = conn, ..)]`",
        ],
    );
    assert_one_error(
        "id = msg.id",
        "fn f(mut c: Pooled, msg: &M) -> Result<(), E> { Ok(()) }",
        &[
            "`mut c: Pooled` may be one behind a type alias",
            "`#[idempotent(conn = c, ..)]`",
        ],
    );
    // A pool where the connection should be.
    for item in [
        "fn f(pool: &DbPool, msg: &M) -> Result<(), E> { Ok(()) }",
        "fn f(pool: &mut r2d2::Pool<ConnectionManager<PgConnection>>, msg: &M) -> Result<(), E> { Ok(()) }",
    ] {
        assert_one_error(
            "id = msg.id",
            item,
            &[
                "`pool` is a connection pool (`",
                "not a connection",
                "handler(&mut pool.get()?, &msg)",
            ],
        );
    }
    assert_one_error(
        "id = msg.id, conn = pool",
        "fn f(pool: Pool<M>, msg: &M) -> Result<(), E> { Ok(()) }",
        &["`pool` is a connection pool (`Pool<M>`), not a connection"],
    );
    // Next to a connection candidate, a pool is a second connection.
    let found = assert_errors(
        "id = msg.id",
        "fn f(conn: &PgConnection, pool: &DbPool, msg: &M) -> Result<(), E> { Ok(()) }",
        &[&["`conn` is a shared reference"], &[]],
    );
    assert!(
        found[1].starts_with("`pool` is a connection pool (`&DbPool`): what the body writes"),
        "{found:#?}"
    );
    // Nothing that looks like a connection: the error at the parameter list.
    assert_one_error(
        "id = msg.id",
        "fn f(msg: &M, n: u32) -> Result<(), E> { Ok(()) }",
        &["this handler has no connection parameter"],
    );
}

#[test]
fn refuses_second_connections_and_pools() {
    let consequence = "is not part of this handler's transaction, so it is not rolled back when the handler fails and is written again when the message is redelivered; write through `conn` only, or, if reaching outside the transaction is intended (a read replica, an audit record that must survive a rollback), say so with `#[idempotent(outside_transaction = other, ..)]`";
    for (param, what) in [
        (
            "other: &mut PgConnection",
            "a second database connection (`&mut PgConnection`)",
        ),
        (
            "other: &mut SqliteConnection",
            "a second database connection",
        ),
        (
            "other: &mut MysqlConnection",
            "a second database connection",
        ),
        (
            "other: &PgConnection",
            "a second database connection (`&PgConnection`)",
        ),
        (
            "other: AsyncPgConnection",
            "a second database connection (`AsyncPgConnection`)",
        ),
        (
            "mut other: PooledConnection<ConnectionManager<PgConnection>>",
            "a second database connection",
        ),
        (
            "other: deadpool::Object<AsyncPgConnection>",
            "a second database connection",
        ),
        (
            "other: Arc<Mutex<PgConnection>>",
            "a second database connection",
        ),
        (
            "other: &mut impl Connection",
            "a second database connection",
        ),
        ("other: &mut D", "a second database connection (`&mut D`)"),
        (
            "other: Pool<ConnectionManager<PgConnection>>",
            "a connection pool (`Pool<ConnectionManager<PgConnection>>`)",
        ),
        (
            "other: &r2d2::Pool<M>",
            "a connection pool (`&r2d2::Pool<M>`)",
        ),
        (
            "other: &deadpool::Pool<AsyncPgConnection>",
            "a connection pool",
        ),
        (
            "other: bb8::Pool<AsyncDieselConnectionManager<AsyncPgConnection>>",
            "a connection pool",
        ),
        ("other: &Arc<DbPool>", "a connection pool (`&Arc<DbPool>`)"),
        ("other: PgPool", "a connection pool"),
    ] {
        let item = format!(
            "fn f<D: Connection>(conn: &mut PgConnection, {param}, msg: &M) -> Result<(), E> {{ Ok(()) }}"
        );
        assert_one_error(
            "id = msg.id",
            &item,
            &[&format!("`other` is {what}"), consequence],
        );
        // The opt-out.
        assert_no_errors("id = msg.id, outside_transaction = other", &item);
        assert_no_errors("id = msg.id, outside_transaction = [other]", &item);
    }
    assert_one_error(
        "id = msg.id",
        "fn f(conn: &mut PgConnection, pool: &DbPool, msg: &M) -> Result<(), E> { Ok(()) }",
        &[
            "`pool` is a connection pool (`&DbPool`): what the body writes through a connection taken from it is not part of this handler's transaction",
        ],
    );
    assert_one_error(
        "id = msg.id",
        "fn f(conn: &mut PgConnection, audit: &mut PgConnection, msg: &M) -> Result<(), E> { Ok(()) }",
        &[
            "`audit` is a second database connection (`&mut PgConnection`): what the body writes through it is not part of this handler's transaction",
        ],
    );
    // Names that are not about databases are left alone.
    for param in [
        "other: &ThreadPool",
        "other: &mut Vec<u8>",
        "other: &mut B",
        "other: WorkerPool",
        "other: &Settings",
    ] {
        assert_no_errors(
            "id = msg.id",
            &format!(
                "fn f<B>(conn: &mut PgConnection, {param}, msg: &M) -> Result<(), E> {{ Ok(()) }}"
            ),
        );
    }
}

#[test]
fn refuses_pool_checkouts_in_the_body() {
    for (call, name) in [
        ("pool.get()", "pool"),
        ("self.pool.get()", "pool"),
        ("self.db_pool.try_get()", "db_pool"),
        ("POOL.get()", "POOL"),
        ("state.pg_pool().get_owned()", "pg_pool"),
        ("(&pool).get_timeout(d)", "pool"),
    ] {
        let item = format!(
            "fn f(&self, conn: &mut PgConnection, msg: &M) -> Result<(), E> {{ let c = {call}; Ok(()) }}"
        );
        assert_one_error(
            "id = msg.id, handler = \"h\"",
            &item,
            &[
                &format!(
                    "`{call}` takes another connection from a pool: what the body writes through it is not part of this handler's transaction"
                ),
                &format!("say so with `#[idempotent(outside_transaction = {name}, ..)]`"),
            ],
        );
        assert_no_errors(
            &format!("id = msg.id, handler = \"h\", outside_transaction = {name}"),
            &item,
        );
    }
    // Inside closures and async blocks too.
    assert_one_error(
        "id = msg.id",
        "async fn f(conn: &mut AsyncPgConnection, msg: &M) -> Result<(), E> { let c = async { pool.get().await }; Ok(()) }",
        &["`pool.get()` takes another connection from a pool"],
    );
    // Not a pool, or not the handler's code.
    assert_no_errors(
        "id = msg.id",
        "fn f(conn: &mut PgConnection, msg: &M) -> Result<(), E> { cache.get(); thread_pool.get(); msg.headers.get(\"x\"); fn helper() { pool.get(); } Ok(()) }",
    );
    // A pool parameter is reported once, at the parameter.
    let found = assert_errors(
        "id = msg.id",
        "fn f(conn: &mut PgConnection, pool: &DbPool, msg: &M) -> Result<(), E> { let c = pool.get(); Ok(()) }",
        &[&[]],
    );
    assert!(
        found[0].starts_with("`pool` is a connection pool (`&DbPool`)"),
        "{found:#?}"
    );
    // A pool parameter whose type hides it is caught at the checkout.
    assert_one_error(
        "id = msg.id",
        "fn f(conn: &mut PgConnection, pool: &Pools, msg: &M) -> Result<(), E> { let c = pool.get(); Ok(()) }",
        &["`pool.get()` takes another connection from a pool"],
    );
}

#[test]
fn checks_the_outside_transaction_list() {
    let item = "fn f(conn: &mut PgConnection, audit: &mut PgConnection, msg: &M) -> Result<(), E> { Ok(()) }";
    assert_no_errors("id = msg.id, outside_transaction = [audit]", item);
    assert_one_error(
        "id = msg.id, outside_transaction = [audit, conn]",
        item,
        &["`conn` is the handler's connection, on which its transaction runs"],
    );
    assert_one_error(
        "id = msg.id, outside_transaction = [audit, replica]",
        item,
        &[
            "`replica` in `outside_transaction` is neither a parameter of this handler nor a pool the body takes a connection from",
        ],
    );
    assert_one_error(
        "id = msg.id, outside_transaction = [audit, audit]",
        item,
        &["`audit` is listed twice in `outside_transaction`"],
    );
    assert_one_error(
        "id = msg.id, outside_transaction = \"audit\"",
        "fn f(conn: &mut PgConnection, msg: &M) -> Result<(), E> { Ok(()) }",
        &["`outside_transaction` takes the names of the parameters or pools"],
    );
    // Listing a parameter whose type the attribute does not recognize is
    // allowed: it documents a pool behind an alias.
    assert_no_errors(
        "id = msg.id, outside_transaction = pools",
        "fn f(conn: &mut PgConnection, pools: &Pools, msg: &M) -> Result<(), E> { Ok(()) }",
    );
}
