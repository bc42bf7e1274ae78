//! The function emitted next to the errors: the user's function as written,
//! with statements at the start of its body that keep the body from adding
//! errors or warnings of its own.

use syn::{Expr, Pat, Stmt, parse_quote};

use super::syntax::{binding, local, text, touched};
use super::{Rejected, reject};

/// The names the added `let _ = &name;` statements touch.
fn touches(added: &[Stmt]) -> Vec<String> {
    added.iter().filter_map(touched).collect()
}

/// The added statements that are not touches.
fn rebinding(added: &[Stmt]) -> Vec<&Stmt> {
    added
        .iter()
        .filter(|stmt| touched(stmt).is_none())
        .collect()
}

/// Asserts that `rejected` adds only `let _ = &name;` for `names`.
fn assert_only_touches(rejected: &Rejected, names: &[&str]) {
    let added = rejected.added();
    assert_eq!(touches(added), names, "{}", text(&rejected.output));
    assert!(rebinding(added).is_empty(), "{}", text(&rejected.output));
}

#[test]
fn emits_the_function_with_all_errors() {
    let out = reject("id = Uuid::new_v4(), bogus = 1", "fn f(msg: &M) { }");
    assert_eq!(out.errors.len(), 4, "{:#?}", out.errors);
    // The parameter only the id reads is touched, so it is not unused.
    assert_only_touches(&out, &["msg"]);
}

#[test]
fn rebinds_a_shared_connection_to_a_mut_that_never_exists() {
    let out = reject(
        "id = msg.id",
        "fn f(conn: &PgConnection, msg: &M) -> Result<(), E> { #![allow(unused)] run(conn) }",
    );
    // The inner attribute stays in the body (`added` checks the attributes).
    let added = out.added();
    assert_eq!(touches(added), ["msg"]);
    let [rebind] = rebinding(added)[..] else {
        panic!("one rebinding: {}", text(&out.output));
    };
    let (pat, value) = local(rebind);
    let Pat::Type(typed) = pat else {
        panic!("a typed binding: {}", text(pat));
    };
    assert_eq!(*typed.pat, parse_quote!(conn));
    assert_eq!(*typed.ty, parse_quote!(&mut PgConnection));
    let Expr::Block(value) = value else {
        panic!("a block: {}", text(value));
    };
    // The parameter is used, and the `&mut` is never produced at run time.
    let [consume, Stmt::Expr(never, None)] = &value.block.stmts[..] else {
        panic!("two statements: {}", text(value));
    };
    assert_eq!(*consume, parse_quote!(let _ = conn;));
    assert_eq!(
        *never,
        parse_quote!(
            ::core::option::Option::<&mut PgConnection>::None
                .expect("not run: `#[idempotent]` reported an error")
        )
    );
}

#[test]
fn lends_an_owned_connection_as_the_expansion_would() {
    // Without `mut`: moved into a `let mut` local, and `conn` is `&mut` to it.
    let out = reject(
        "id = Uuid::new_v4()",
        "fn f(conn: PooledConnection<M>, msg: &M) -> Result<(), E> { run(conn) }",
    );
    let added = out.added();
    assert_eq!(touches(added), ["msg"]);
    let [moved, lent] = rebinding(added)[..] else {
        panic!("two rebinding statements: {}", text(&out.output));
    };
    let (pat, value) = local(moved);
    let (local_name, is_mut) = binding(pat);
    assert!(is_mut && local_name != "conn", "{}", text(moved));
    assert_eq!(*value, parse_quote!(conn));
    let (pat, value) = local(lent);
    assert_eq!(*pat, parse_quote!(conn));
    assert_eq!(*value, parse_quote!(&mut #local_name));
    // With `mut`: `conn` is `&mut` to the binding.
    let out = reject(
        "id = msg.id",
        "fn f(mut conn: Conn, msg: &M) -> Result<(), E> { run(conn) }",
    );
    let added = out.added();
    assert_eq!(touches(added), ["msg"]);
    let [lent] = rebinding(added)[..] else {
        panic!("one rebinding: {}", text(&out.output));
    };
    assert_eq!(*lent, parse_quote!(let conn = &mut conn;));
}

#[test]
fn leaves_a_mut_connection_as_it_is() {
    // Only plain names are touched; `(a, b)` is not one.
    let out = reject(
        "id = Uuid::new_v4()",
        "fn f(conn: &mut PgConnection, (a, b): (u8, u8)) -> Result<(), E> { run(conn) }",
    );
    assert_only_touches(&out, &["conn"]);
}

#[test]
fn leaves_an_async_trait_body_as_it_is() {
    // `#[async_trait]` moves the parameters into a boxed future: a rebinding
    // would only add borrow errors.
    let out = reject(
        "id = msg.id, handler = \"h\"",
        "fn f<'a, 'async_trait>(&'a self, conn: PooledConnection<M>, msg: &'a M) -> Pin<Box<dyn Future<Output = Result<(), E>> + Send + 'async_trait>> { Box::pin(async move { Ok(()) }) }",
    );
    assert_only_touches(&out, &["conn", "msg"]);
}
