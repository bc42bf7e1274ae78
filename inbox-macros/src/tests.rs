//! Unit tests of the whole attribute on token streams: the expansion's shape
//! and the text of every error. Compile-level behaviour (spans, warnings,
//! type errors) is covered by the UI tests of the workspace.

use proc_macro2::TokenStream;

use crate::idempotent_impl;

/// Runs the attribute on `args` and `item` and renders the result.
fn expand(args: &str, item: &str) -> String {
    let args: TokenStream = args.parse().expect("args tokenize");
    let item: TokenStream = item.parse().expect("item tokenizes");
    idempotent_impl(args, item).to_string()
}

/// The messages of the `compile_error!`s in an expansion.
fn errors(args: &str, item: &str) -> Vec<String> {
    let output = expand(args, item);
    let mut found = Vec::new();
    let mut rest = output.as_str();
    while let Some(start) = rest.find("compile_error ! {") {
        rest = &rest[start..];
        let open = rest.find('"').expect("message");
        let close = rest[open + 1..].find("\" }").expect("end of message");
        found.push(rest[open + 1..open + 1 + close].replace("\\\"", "\""));
        rest = &rest[open + 1 + close..];
    }
    found
}

/// Asserts that the only error mentions every fragment in `fragments`.
fn assert_one_error(args: &str, item: &str, fragments: &[&str]) {
    let found = errors(args, item);
    assert_eq!(found.len(), 1, "expected one error, got {found:#?}");
    for fragment in fragments {
        assert!(
            found[0].contains(fragment),
            "{:?} lacks {fragment:?}",
            found[0]
        );
    }
}

const HANDLER: &str =
    "fn apply(conn: &mut PgConnection, msg: &Payment) -> Result<(), AppError> { Ok(()) }";

#[test]
fn expands_the_sync_shape() {
    let out = expand("id = msg.id", HANDLER);
    let expected = "fn apply (conn : & mut PgConnection , msg : & Payment) -> Result < () , AppError > { \
        let __inbox_key = :: inbox_runtime :: __private :: claim_key (:: core :: concat ! (:: core :: module_path ! () , \"::\" , \"apply\") , & msg . id) ; \
        :: inbox_runtime :: __private :: run_sync :: < _ , Result < () , AppError > , _ > (& mut * conn , __inbox_key , | conn | -> Result < () , AppError > { Ok (()) }) }";
    assert_eq!(out, expected);
}

#[test]
fn keeps_attributes_and_moves_inner_attributes_into_the_body() {
    let out = expand(
        "id = \"msg.id\", handler = \"billing.apply\", crate = \"::my_inbox\"",
        "#[doc = \"a\"] #[inline] pub(crate) fn apply<'a, T: Clone>(&self, conn: &'a mut T, msg: &Payment) \
         -> Result<(), E> where T: Send { #![allow(unused)] let x = 1; Ok(()) }",
    );
    assert!(out.starts_with(
        "# [doc = \"a\"] # [inline] pub (crate) fn apply < 'a , T : Clone > (& self , conn : & 'a mut T , msg : & Payment) -> Result < () , E > where T : Send { # ! [allow (unused)] let __inbox_key = :: my_inbox :: __private :: claim_key (\"billing.apply\" , & msg . id) ;"
    ), "{out}");
    assert!(
        out.ends_with("| conn | -> Result < () , E > { let x = 1 ; Ok (()) }) }"),
        "{out}"
    );
}

#[test]
fn lends_owned_connections_without_new_mut_warnings() {
    let owned = expand(
        "id = msg.id",
        "fn f(conn: PooledConnection<M>, msg: Msg) -> Result<(), E> { Ok(()) }",
    );
    assert!(owned.contains("let mut __inbox_conn = conn ; :: inbox_runtime :: __private :: run_sync :: < _ , Result < () , E > , _ > (& mut __inbox_conn , __inbox_key , | conn |"), "{owned}");
    let owned_mut = expand(
        "id = msg.id",
        "fn f(mut conn: PooledConnection<M>, msg: Msg) -> Result<(), E> { Ok(()) }",
    );
    assert!(
        owned_mut.contains("> (& mut conn , __inbox_key , | conn |"),
        "{owned_mut}"
    );
    let ref_mut = expand(
        "id = msg.id",
        "fn f(mut conn: &mut C, msg: Msg) -> Result<(), E> { Ok(()) }",
    );
    assert!(
        ref_mut.contains(
            "> (:: core :: ops :: DerefMut :: deref_mut (& mut conn) , __inbox_key , | mut conn |"
        ),
        "{ref_mut}"
    );
}

#[test]
fn picks_the_connection() {
    // `conn = ...` wins over detection.
    let named = expand(
        "id = msg.id, conn = db",
        "fn f(other: &mut Vec<u8>, db: &mut C, msg: &Msg) -> Result<(), E> { Ok(()) }",
    );
    assert!(
        named.contains("> (& mut * db , __inbox_key , | db |"),
        "{named}"
    );
    // A by-value `...Connection` is found when there is no `&mut`.
    let pooled = expand(
        "id = msg.id",
        "fn f(msg: &Msg, c: r2d2::PooledConnection<M>) -> Result<(), E> { Ok(()) }",
    );
    assert!(pooled.contains("| c |"), "{pooled}");
    // `&mut self` is never the connection.
    let method = expand(
        "id = self.id, handler = \"h\"",
        "fn f(&mut self, conn: &mut C) -> Result<(), E> { Ok(()) }",
    );
    assert!(
        method.contains("& self . id") && method.contains("| conn |"),
        "{method}"
    );
}

#[test]
fn accepts_rooted_ids() {
    let item = "fn f(&self, conn: &mut C, msg: &Msg, (a, b): (u32, u32), Env { key, .. }: Env) -> Result<(), E> { Ok(()) }";
    for id in [
        "msg.id",
        "&msg.id",
        "*msg.id",
        "msg.header(\"id\")?.as_str()",
        "msg.ids[now()]",
        "(msg.seq as u64)",
        "msg.seq as u64",
        "a",
        "key.to_string()",
        "self.id",
        "format!(\"{}-{}\", msg.kind, b)",
        "format!(\"{}-{n}\", msg.kind, n = b)",
        "std::format!(\"{}\", msg.id)",
        "\"msg.id\"",
    ] {
        assert_eq!(
            errors(&format!("id = {id}, handler = \"h\""), item),
            Vec::<String>::new(),
            "id = {id}"
        );
    }
}

#[test]
fn parenthesizes_casts_behind_the_borrow() {
    let out = expand("id = msg.seq as u64", HANDLER);
    assert!(out.contains("& (msg . seq as u64)"), "{out}");
}

#[test]
fn refuses_ids_the_consumer_generates() {
    let prefix = "the message id must come from the message: ";
    let cases: &[(&str, &str)] = &[
        ("Uuid::new_v4()", "`Uuid::new_v4()` is not rooted in a handler parameter; deduplication must key on a stable, producer-assigned id, and a value the consumer generates is different on every delivery"),
        ("now()", "`now()` is not rooted"),
        ("rand::random::<u64>()", "`rand::random::<u64>()` is not rooted"),
        ("SystemTime::now().elapsed()", "`SystemTime::now()` is not rooted"),
        ("{ msg.id }", "`{ msg.id }` is not rooted"),
        ("\"abc\".to_string()", "`\"abc\"` is a literal, and a literal is the same for every message"),
        ("42", "`42` is a literal"),
        ("ID", "`ID` is not a parameter of this handler"),
        ("crate::ID", "`crate::ID` is a path to an item, not a handler parameter"),
        ("conn.id", "`conn` is the database connection, not the message; read it from `msg`"),
        ("self.id", "`self` is not a parameter of this handler"),
        ("uuid!(\"x\")", "`uuid!(\"x\")` is a macro call"),
        ("format!(\"{msg_id}\")", "this `format!` has no argument rooted in a handler parameter; inline `{name}` captures in the format string are not checked"),
        ("format!(\"{}\", now())", "`now()` is not rooted"),
    ];
    for (id, message) in cases {
        assert_one_error(&format!("id = {id}"), HANDLER, &[prefix, message]);
    }
}

#[test]
fn reports_argument_mistakes_together() {
    let found = errors(
        "id = msg.id, id = msg.id, colour = \"red\", handler = 42, conn = a.b, crate = 1",
        HANDLER,
    );
    assert_eq!(
        found,
        [
            "duplicate argument `id`: each argument may be given only once",
            "unknown argument `colour`; `#[idempotent]` takes `id`, `handler`, `conn`, `crate` and `outside_transaction`",
            "`handler` takes a string literal, e.g. `handler = \"billing.apply_payment\"`",
            "`conn` takes the name of the connection parameter, e.g. `conn = db`",
            "`crate` takes the path of the `inbox_runtime` crate, e.g. `crate = \"::my_inbox\"`",
        ]
    );
}

#[test]
fn reports_missing_empty_and_unparsable_ids() {
    assert_one_error("", HANDLER, &["missing `id = ...`"]);
    assert_one_error("handler = \"x\"", HANDLER, &["missing `id = ...`"]);
    assert_one_error("id = \"\"", HANDLER, &["`id` is empty"]);
    assert_one_error(
        "id = \"msg.\"",
        HANDLER,
        &["`id = \"msg.\"` is not a Rust expression"],
    );
    assert_one_error("id", HANDLER, &["`id` needs a value: write `id = ...`"]);
    assert_eq!(errors("id = , handler = \"\"", HANDLER).len(), 2);
}

#[test]
fn validates_literal_handler_names() {
    assert_one_error(
        "id = msg.id, handler = \"\"",
        HANDLER,
        &["the handler name is empty"],
    );
    let long = format!("id = msg.id, handler = \"{}\"", "h".repeat(256));
    assert_one_error(
        &long,
        HANDLER,
        &["the handler name is 256 bytes long; the inbox table stores at most 255 bytes"],
    );
    assert_one_error(
        "id = msg.id, handler = \"a\\0b\"",
        HANDLER,
        &["NUL character"],
    );
    assert!(errors(
        &format!("id = msg.id, handler = \"{}\"", "h".repeat(255)),
        HANDLER
    )
    .is_empty());
}

#[test]
fn checks_the_signature() {
    assert_one_error(
        "id = msg.id",
        "fn f(conn: &mut C, msg: &M) { }",
        &["an idempotent handler must return `Result<_, _>`"],
    );
    assert_one_error(
        "id = msg.id",
        "fn f(conn: &mut C, msg: &M) -> ! { loop {} }",
        &["must return `Result<_, _>`"],
    );
    assert_one_error(
        "id = msg.id",
        "fn f(conn: &mut C, msg: &M) -> Result<impl Debug, E> { todo!() }",
        &["`impl Trait` cannot appear in the return type"],
    );
    assert_one_error(
        "id = msg.id",
        "const fn f(conn: &mut C, msg: &M) -> Result<(), E> { Ok(()) }",
        &["cannot be applied to a `const fn`"],
    );
    assert_one_error(
        "id = msg.id, handler = \"h\"",
        "fn f<'a, 'async_trait>(&'a self, conn: &'a mut C, msg: &'a M) -> Pin<Box<dyn Future<Output = Result<(), E>> + Send + 'async_trait>> { Box::pin(async move { Ok(()) }) }",
        &["cannot wrap a method rewritten by `#[async_trait]`"],
    );
    assert_one_error(
        "id = msg.id",
        "struct S;",
        &["applies to a function with a body"],
    );
}

#[test]
fn methods_need_an_explicit_handler_name() {
    let needs_name = "a method needs an explicit `handler = \"...\"`: the default scope (module path and function name) would be shared by a method of the same name on another type in this module, and the two would skip each other's messages";
    for item in [
        "fn f(&self, conn: &mut C, msg: &M) -> Result<(), E> { Ok(()) }",
        "fn f(&mut self, conn: &mut C, msg: &M) -> Result<(), E> { Ok(()) }",
        "fn f(self: Box<Self>, conn: &mut C, msg: &M) -> Result<(), E> { Ok(()) }",
        "fn f(mut self, conn: &mut C, msg: &M) -> Result<(), E> { Ok(()) }",
        "fn f(conn: &mut C, msg: &Self) -> Result<(), E> { Ok(()) }",
        "fn f(conn: &mut C, msg: &M) -> Result<Outcome<Self>, E> { todo!() }",
        "fn f(conn: &mut C, msg: &M) -> Result<(), Self::Error> { Ok(()) }",
        "fn f<T>(conn: &mut C, msg: &M) -> Result<(), E> where T: From<Self> { Ok(()) }",
        "fn f(conn: &mut C, msg: &M, other: ty!(Self)) -> Result<(), E> { Ok(()) }",
    ] {
        assert_one_error("id = msg.id", item, &[needs_name]);
        assert!(
            errors("id = msg.id, handler = \"billing.handle\"", item).is_empty(),
            "{item}"
        );
    }
    // `Self` in the body only is not a method's signature; the body is the user's.
    assert!(errors(
        "id = msg.id",
        "fn f(conn: &mut C, msg: &M) -> Result<(), E> { let _ = Self::X; Ok(()) }"
    )
    .is_empty());
    // An invalid `handler = ...` is reported once, not also as missing.
    assert_one_error(
        "id = msg.id, handler = \"\"",
        "fn f(&self, conn: &mut C, msg: &M) -> Result<(), E> { Ok(()) }",
        &["the handler name is empty"],
    );
}

#[test]
fn checks_the_connection_parameter() {
    assert_one_error("id = msg.id", "fn f(msg: &M) -> Result<(), E> { Ok(()) }", &["this handler has no connection parameter; the attribute needs the `&mut` Diesel connection its body writes through (or name it with `conn = ...`)"]);
    assert_one_error("id = msg.id, conn = db", HANDLER, &["`db` is not a parameter of this handler; `conn = ...` must name the connection parameter (its parameters are `conn`, `msg`)"]);
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
fn emits_the_function_with_all_errors() {
    let out = expand("id = Uuid::new_v4(), bogus = 1", "fn f(msg: &M) { }");
    assert_eq!(
        errors("id = Uuid::new_v4(), bogus = 1", "fn f(msg: &M) { }").len(),
        4
    );
    assert!(
        out.ends_with("fn f (msg : & M) { let _ = & msg ; }"),
        "{out}"
    );
}

#[test]
fn expands_the_async_shape_without_a_closure() {
    let out = expand(
        "id = msg.id, handler = \"billing.apply\"",
        "async fn apply(conn: &mut AsyncPgConnection, msg: &Payment) -> Result<(), E> { Ok(()) }",
    );
    assert!(out.starts_with("async fn apply"), "{out}");
    for step in [
        ":: inbox_runtime :: __private :: begin_async :: < _ , Result < () , E > > (& mut * conn , __inbox_key) . await",
        "Err (__inbox_done) => return __inbox_done",
        ":: inbox_runtime :: __private :: typed :: < Result < () , E > , _ > (async { let conn = __inbox_transaction . conn () ; { Ok (()) } })",
        ":: inbox_runtime :: __private :: finish_async :: < _ , Result < () , E > > (__inbox_transaction , __inbox_result) . await }",
    ] {
        assert!(out.contains(step), "missing {step:?} in {out}");
    }
    assert!(!out.contains('|'), "no closure: {out}");
}

/// Asserts that `item` expands without errors under `args`.
fn assert_no_errors(args: &str, item: &str) {
    let found = errors(args, item);
    assert!(found.is_empty(), "{item}: {found:#?}");
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
    let two = errors(
        "id = msg.id",
        "fn f(a: &PgConnection, b: &deadpool::Object<M>, msg: &M) -> Result<(), E> { Ok(()) }",
    );
    assert_eq!(two.len(), 2, "{two:#?}");
    assert!(
        two[0].contains("`a` is a shared reference (`&PgConnection`)"),
        "{two:#?}"
    );
    assert!(
        two[1].contains("`b` is a shared reference (`&deadpool::Object<M>`)"),
        "{two:#?}"
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
        assert_one_error("id = msg.id", item, &["`pool` is a connection pool (`", "not a connection", "handler(&mut pool.get()?, &msg)"]);
    }
    assert_one_error(
        "id = msg.id, conn = pool",
        "fn f(pool: Pool<M>, msg: &M) -> Result<(), E> { Ok(()) }",
        &["`pool` is a connection pool (`Pool<M>`), not a connection"],
    );
    // Next to a connection candidate, a pool is a second connection.
    let found = errors(
        "id = msg.id",
        "fn f(conn: &PgConnection, pool: &DbPool, msg: &M) -> Result<(), E> { Ok(()) }",
    );
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found[0].contains("`conn` is a shared reference"),
        "{found:#?}"
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
fn detects_connections_by_their_type() {
    // deadpool's `Object<..>` by value.
    for item in [
        "async fn f(conn: Object<Manager>, msg: &M) -> Result<(), E> { Ok(()) }",
        "async fn f(conn: deadpool::managed::Object<AsyncDieselConnectionManager<AsyncPgConnection>>, msg: &M) -> Result<(), E> { Ok(()) }",
    ] {
        let out = expand("id = msg.id", item);
        assert!(out.contains("let mut __inbox_conn = conn ;"), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
    }
    // A `&mut` connection wins over an earlier `&mut` of another type.
    let out = expand(
        "id = msg.id",
        "fn f(buf: &mut Vec<u8>, db: &mut PgConnection, msg: &M) -> Result<(), E> { Ok(()) }",
    );
    assert!(out.contains("(& mut * db , __inbox_key , | db |"), "{out}");
    // So does a type parameter bounded by a connection trait.
    let out = expand(
        "id = msg.id",
        "fn f<B, C>(buf: &mut B, conn: &mut C, msg: &M) -> Result<(), E> where C: Connection { Ok(()) }",
    );
    assert!(
        out.contains("(& mut * conn , __inbox_key , | conn |"),
        "{out}"
    );
}

#[test]
fn rebinds_the_connection_after_an_error_so_the_body_adds_none() {
    // A shared reference: `conn` becomes a `&mut` that never exists.
    let out = expand(
        "id = msg.id",
        "fn f(conn: &PgConnection, msg: &M) -> Result<(), E> { #![allow(unused)] run(conn) }",
    );
    assert!(out.ends_with(
        "fn f (conn : & PgConnection , msg : & M) -> Result < () , E > { # ! [allow (unused)] \
         let _ = & msg ; \
         let conn : & mut PgConnection = { let _ = conn ; :: core :: option :: Option :: < & mut PgConnection > :: None . expect (\"not run: `#[idempotent]` reported an error\") } ; \
         run (conn) }"
    ), "{out}");
    // An owned connection, whatever the error: lent as the expansion would.
    let out = expand(
        "id = Uuid::new_v4()",
        "fn f(conn: PooledConnection<M>, msg: &M) -> Result<(), E> { run(conn) }",
    );
    assert!(
        out.ends_with(
            "{ let _ = & msg ; let mut __inbox_conn = conn ; let conn = & mut __inbox_conn ; run (conn) }"
        ),
        "{out}"
    );
    let out = expand(
        "id = msg.id",
        "fn f(mut conn: Conn, msg: &M) -> Result<(), E> { run(conn) }",
    );
    assert!(
        out.ends_with("{ let _ = & msg ; let conn = & mut conn ; run (conn) }"),
        "{out}"
    );
    // A `&mut` connection needs no rebinding.
    let out = expand(
        "id = Uuid::new_v4()",
        "fn f(conn: &mut PgConnection, (a, b): (u8, u8)) -> Result<(), E> { run(conn) }",
    );
    assert!(
        out.ends_with(
            "fn f (conn : & mut PgConnection , (a , b) : (u8 , u8)) -> Result < () , E > { let _ = & conn ; run (conn) }"
        ),
        "{out}"
    );
    // Nor does a body rewritten by `#[async_trait]`, which moves its
    // parameters into a boxed future.
    let out = expand(
        "id = msg.id, handler = \"h\"",
        "fn f<'a, 'async_trait>(&'a self, conn: PooledConnection<M>, msg: &'a M) -> Pin<Box<dyn Future<Output = Result<(), E>> + Send + 'async_trait>> { Box::pin(async move { Ok(()) }) }",
    );
    assert!(!out.contains("__inbox_conn"), "{out}");
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
        &["`pool` is a connection pool (`&DbPool`): what the body writes through a connection taken from it is not part of this handler's transaction"],
    );
    assert_one_error(
        "id = msg.id",
        "fn f(conn: &mut PgConnection, audit: &mut PgConnection, msg: &M) -> Result<(), E> { Ok(()) }",
        &["`audit` is a second database connection (`&mut PgConnection`): what the body writes through it is not part of this handler's transaction"],
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
                &format!("`{call}` takes another connection from a pool: what the body writes through it is not part of this handler's transaction"),
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
    let found = errors(
        "id = msg.id",
        "fn f(conn: &mut PgConnection, pool: &DbPool, msg: &M) -> Result<(), E> { let c = pool.get(); Ok(()) }",
    );
    assert_eq!(found.len(), 1, "{found:#?}");
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
        &["`replica` in `outside_transaction` is neither a parameter of this handler nor a pool the body takes a connection from"],
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
