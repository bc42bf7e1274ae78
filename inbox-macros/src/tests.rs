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
            "unknown argument `colour`; `#[idempotent]` takes `id`, `handler`, `conn` and `crate`",
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
fn emits_the_function_unchanged_with_all_errors() {
    let out = expand("id = Uuid::new_v4(), bogus = 1", "fn f(msg: &M) { }");
    assert_eq!(
        errors("id = Uuid::new_v4(), bogus = 1", "fn f(msg: &M) { }").len(),
        4
    );
    assert!(out.ends_with("fn f (msg : & M) { }"), "{out}");
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
