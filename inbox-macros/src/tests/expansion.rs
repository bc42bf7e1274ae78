//! The code generated for a valid handler.

use syn::{Expr, ReturnType, Type, parse_quote};

use super::syntax::{self, binding, closures, local, named, runtime, runtime_roots, text};
use super::{Expanded, HANDLER, expand};

/// The function's return type.
fn output(expanded: &Expanded) -> Type {
    match &expanded.input.sig.output {
        ReturnType::Type(_, ty) => (**ty).clone(),
        ReturnType::Default => panic!("a handler returns a `Result`"),
    }
}

/// Asserts the sync form: the signature kept, and the body one
/// `KRATE::__private::run_sync::<_, RET, _>(CONN, KEY, OPTIONS, |PARAM| -> RET { body })`
/// whose key is the claimed one and whose closure is not `move` and returns
/// the function's type around the body as written (so `return` and `?` in the
/// body behave as they did in the function).
fn assert_runs_sync(expanded: &Expanded, krate: &str) {
    expanded.assert_function_kept();
    let ret = output(expanded);
    let run = expanded.run_sync();
    assert_eq!(run.call.entry, runtime(krate, "run_sync"));
    assert_eq!(
        run.call.types,
        [parse_quote!(_), ret.clone(), parse_quote!(_)]
    );
    assert_eq!(run.call.args.len(), 4, "connection, key, options, body");
    assert_eq!(
        run.call.args[1],
        named(&expanded.claim().key),
        "the claimed key"
    );
    let default_options: syn::Expr = syn::parse_str(&format!("{krate}::Options::new()")).unwrap();
    assert_eq!(
        run.call.args[2], default_options,
        "no `max_attempts`: the runtime's default"
    );
    let closure = &run.closure;
    assert!(closure.capture.is_none(), "not `move`");
    assert!(closure.asyncness.is_none(), "not `async`");
    assert_eq!(
        closure.output,
        expanded.input.sig.output,
        "returns {}",
        text(&ret)
    );
    let Expr::Block(body) = &*closure.body else {
        panic!("the body in braces: {}", text(&closure.body));
    };
    assert!(
        body.attrs.is_empty(),
        "inner attributes stay on the function"
    );
    assert_eq!(
        body.block.stmts, expanded.input.block.stmts,
        "the body as written"
    );
}

/// Asserts that the body sees the connection as `param` and the runtime
/// receives `arg`, with no statement in between.
fn assert_lends(expanded: &Expanded, arg: Expr, param: syn::Pat) {
    assert!(expanded.setup().is_empty(), "{}", text(&expanded.output));
    let lent = expanded.lent();
    assert_eq!(lent.arg, arg, "lent as {}", text(&lent.arg));
    assert_eq!(lent.param, param, "received as {}", text(&lent.param));
}

/// Asserts that the sync handler `item` expands with its connection lent as
/// `arg` and received by the body as `param`.
fn assert_sync_lends(args: &str, item: &str, arg: Expr, param: syn::Pat) {
    let out = expand(args, item);
    assert_runs_sync(&out, "::inbox_runtime");
    assert_lends(&out, arg, param);
}

/// Asserts that an owned `conn` without `mut` is moved into a `let mut`
/// local of the expansion and lent as `&mut` to it, so the user's binding
/// needs no `mut` (the signature stays as written, and gets no `unused_mut`).
fn assert_moves_into_a_local(expanded: &Expanded, conn: &str) {
    expanded.assert_function_kept();
    let [setup] = expanded.setup() else {
        panic!("one `let mut` before the call: {}", text(&expanded.output));
    };
    let (pat, value) = local(setup);
    let (moved_to, is_mut) = binding(pat);
    assert!(is_mut, "{}", text(setup));
    assert_ne!(moved_to, conn, "a local of the expansion");
    assert_eq!(text(value), conn, "moves the parameter");
    let lent = expanded.lent();
    assert_eq!(lent.arg, parse_quote!(&mut #moved_to));
    assert_eq!(
        text(&lent.param),
        conn,
        "the body sees the parameter's name"
    );
}

#[test]
fn expands_the_sync_shape() {
    let out = expand("id = msg.id", HANDLER);
    assert_runs_sync(&out, "::inbox_runtime");
    let claim = out.claim();
    assert_eq!(claim.entry, runtime("::inbox_runtime", "claim_key"));
    // The default scope: module path and function name, checked when the
    // handler compiles, in a `const` item the claim and the registration
    // both name.
    assert_eq!(claim.handler, parse_quote!(__INBOX_HANDLER));
    let items = out.items();
    let [scope, registration] = items else {
        panic!("the scope and the registration: {items:?}");
    };
    let scope: syn::Stmt = scope.clone();
    // Braces: rustfmt leaves the tokens as written (no trailing comma).
    let expected: syn::Stmt = parse_quote! {
        const __INBOX_HANDLER: &'static str = ::inbox_runtime::__private::checked_handler(
            ::core::concat!(::core::module_path!(), "::", "apply")
        );
    };
    assert_eq!(scope, expected);
    let expected: syn::Stmt = parse_quote!(::inbox_runtime::__private::inventory::submit! {
        ::inbox_runtime::__private::registered(
            __INBOX_HANDLER,
            ::core::module_path!(),
            "apply",
            ::core::file!(),
            ::core::line!(),
            ::core::column!(),
            ::core::option::Option::None,
            (false, false, false, false),
            ::inbox_runtime::__private::ErrorTypeProbe::new(|| {
                use ::inbox_runtime::__private::{ProbeHandlerError as _, ProbeNothing as _};
                (&::inbox_runtime::__private::ErrorTypeOf::<Result<(), AppError> >::new())
                    .probe_error_type()
            }),
        )
    });
    assert_eq!(text(registration), text(&expected));
    assert_eq!(
        claim.id,
        parse_quote!(msg.id),
        "borrowed without parentheses"
    );
    assert_lends(&out, parse_quote!(&mut *conn), parse_quote!(conn));
}

#[test]
fn keeps_attributes_and_moves_inner_attributes_into_the_body() {
    let out = expand(
        "id = \"msg.id\", handler = \"billing.apply\", crate = \"::my_inbox\"",
        "#[doc = \"a\"] #[inline] pub(crate) fn apply<'a, T: Clone>(&self, conn: &'a mut T, msg: &Payment) \
         -> Result<(), E> where T: Send { #![allow(unused)] let x = 1; Ok(()) }",
    );
    // Outer and inner attributes, visibility, generics, receiver and
    // `where` clause as written; the inner attribute stays the function's
    // (the closure's body has none).
    assert_runs_sync(&out, "::my_inbox");
    let inner: syn::Attribute = parse_quote!(#![allow(unused)]);
    assert!(out.output.attrs.contains(&inner), "{}", text(&out.output));
    let claim = out.claim();
    assert_eq!(claim.entry, runtime("::my_inbox", "claim_key"));
    assert_eq!(claim.handler, parse_quote!("billing.apply"));
    assert_eq!(claim.id, parse_quote!(msg.id), "`id = \"..\"` is parsed");
    assert_lends(&out, parse_quote!(&mut *conn), parse_quote!(conn));
}

#[test]
fn passes_claim_wait_to_the_runtime() {
    let cases: [(&str, Expr); 5] = [
        (
            "id = msg.id, claim_wait = msg.claim_wait",
            parse_quote!(::inbox_runtime::Options::new().claim_wait(msg.claim_wait)),
        ),
        (
            "id = msg.id, claim_wait = \"2s\"",
            parse_quote!(::inbox_runtime::Options::new().claim_wait(
                ::inbox_runtime::ClaimWait::Bounded(::core::time::Duration::from_millis(2000u64))
            )),
        ),
        (
            "id = msg.id, claim_wait = \"500ms\"",
            parse_quote!(::inbox_runtime::Options::new().claim_wait(
                ::inbox_runtime::ClaimWait::Bounded(::core::time::Duration::from_millis(500u64))
            )),
        ),
        (
            "id = msg.id, claim_wait = unbounded, max_attempts = 3",
            parse_quote!(
                ::inbox_runtime::Options::new()
                    .max_attempts(::inbox_runtime::MaxAttempts::limit(3u32))
                    .claim_wait(::inbox_runtime::ClaimWait::Unbounded)
            ),
        ),
        (
            "id = msg.id, claim_wait = \"1m\"",
            parse_quote!(::inbox_runtime::Options::new().claim_wait(
                ::inbox_runtime::ClaimWait::Bounded(::core::time::Duration::from_millis(60000u64))
            )),
        ),
    ];
    for (args, expected) in cases {
        let out = expand(args, HANDLER);
        assert_eq!(out.run_sync().call.args[2], expected, "{args}");
        let out = expand(
            args,
            "async fn apply(conn: &mut AsyncPgConnection, msg: &Payment) -> Result<(), E> { Ok(()) }",
        );
        assert_eq!(out.run_async().begin.args[2], expected, "{args} (async)");
    }
}

#[test]
fn passes_max_attempts_to_the_runtime() {
    let cases: [(&str, Expr); 3] = [
        (
            "id = msg.id, max_attempts = 3",
            parse_quote!(
                ::inbox_runtime::Options::new()
                    .max_attempts(::inbox_runtime::MaxAttempts::limit(3u32))
            ),
        ),
        (
            "id = msg.id, max_attempts = 1",
            parse_quote!(
                ::inbox_runtime::Options::new()
                    .max_attempts(::inbox_runtime::MaxAttempts::limit(1u32))
            ),
        ),
        (
            "id = msg.id, max_attempts = unbounded",
            parse_quote!(
                ::inbox_runtime::Options::new()
                    .max_attempts(::inbox_runtime::MaxAttempts::Unbounded)
            ),
        ),
    ];
    for (args, expected) in cases {
        let out = expand(args, HANDLER);
        assert_eq!(out.run_sync().call.args[2], expected, "{args}");
        let out = expand(
            args,
            "async fn apply(conn: &mut AsyncPgConnection, msg: &Payment) -> Result<(), E> { Ok(()) }",
        );
        assert_eq!(out.run_async().begin.args[2], expected, "{args} (async)");
    }
}

#[test]
fn fingerprints_the_payload_and_stores_results() {
    let sync = expand("id = msg.id, fingerprint = msg.body, store_result", HANDLER);
    let claim = sync
        .output
        .block
        .stmts
        .iter()
        .find(|stmt| matches!(stmt, syn::Stmt::Local(_)))
        .expect("the claim");
    let (_, value) = local(claim);
    let claim = syntax::call(value);
    assert_eq!(claim.entry, runtime("::inbox_runtime", "fingerprinted_key"));
    assert_eq!(claim.args.len(), 3, "name, id, payload: {}", text(value));
    assert_eq!(claim.args[2], parse_quote!(&msg.body));
    assert_eq!(
        sync.run_sync().call.entry,
        runtime("::inbox_runtime", "run_sync_storing")
    );

    let only_fingerprint = expand("id = msg.id, fingerprint = msg.body", HANDLER);
    assert_eq!(
        only_fingerprint.run_sync().call.entry,
        runtime("::inbox_runtime", "run_sync"),
        "a fingerprint alone stores no result"
    );

    let run = expand(
        "id = msg.id, fingerprint = msg.body, store_result",
        "async fn apply(conn: &mut AsyncPgConnection, msg: &Payment) -> Result<StoredOutcome<u8>, E> { todo!() }",
    )
    .run_async();
    assert_eq!(
        run.begin.entry,
        runtime("::inbox_runtime", "begin_async_storing")
    );
    assert_eq!(
        run.finish.entry,
        runtime("::inbox_runtime", "finish_async_storing")
    );
}

#[test]
fn uses_the_crate_path_everywhere() {
    for item in [
        HANDLER,
        "async fn apply(conn: &mut AsyncPgConnection, msg: &Payment) -> Result<(), E> { Ok(()) }",
    ] {
        let out = expand("id = msg.id, crate = \"::my_inbox\"", item);
        let roots = runtime_roots(&out.output);
        assert!(roots.len() >= 2, "{roots:?}");
        assert!(roots.iter().all(|root| root == "::my_inbox"), "{roots:?}");
        assert!(!text(&out.output).contains("inbox_runtime"), "{item}");
    }
}

#[test]
fn lends_owned_connections_without_new_mut_warnings() {
    let owned = expand(
        "id = msg.id",
        "fn f(conn: PooledConnection<M>, msg: Msg) -> Result<(), E> { Ok(()) }",
    );
    assert_runs_sync(&owned, "::inbox_runtime");
    assert_moves_into_a_local(&owned, "conn");
    // `mut conn: T`: the binding's `mut` is used by the borrow.
    assert_sync_lends(
        "id = msg.id",
        "fn f(mut conn: PooledConnection<M>, msg: Msg) -> Result<(), E> { Ok(()) }",
        parse_quote!(&mut conn),
        parse_quote!(conn),
    );
    // `mut conn: &mut C`: the binding is borrowed mutably (its `mut` used),
    // and the closure parameter keeps the `mut`.
    assert_sync_lends(
        "id = msg.id",
        "fn f(mut conn: &mut C, msg: Msg) -> Result<(), E> { Ok(()) }",
        parse_quote!(::core::ops::DerefMut::deref_mut(&mut conn)),
        parse_quote!(mut conn),
    );
}

#[test]
fn picks_the_connection() {
    // `conn = ...` wins over detection.
    assert_sync_lends(
        "id = msg.id, conn = db",
        "fn f(other: &mut Vec<u8>, db: &mut C, msg: &Msg) -> Result<(), E> { Ok(()) }",
        parse_quote!(&mut *db),
        parse_quote!(db),
    );
    // A by-value `...Connection` is found when there is no `&mut`.
    let pooled = expand(
        "id = msg.id",
        "fn f(msg: &Msg, c: r2d2::PooledConnection<M>) -> Result<(), E> { Ok(()) }",
    );
    assert_moves_into_a_local(&pooled, "c");
    // `&mut self` is never the connection.
    let method = expand(
        "id = self.id, handler = \"h\"",
        "fn f(&mut self, conn: &mut C) -> Result<(), E> { Ok(()) }",
    );
    assert_eq!(method.claim().id, parse_quote!(self.id));
    assert_lends(&method, parse_quote!(&mut *conn), parse_quote!(conn));
}

#[test]
fn detects_connections_by_their_type() {
    // deadpool's `Object<..>` by value.
    for item in [
        "async fn f(conn: Object<Manager>, msg: &M) -> Result<(), E> { Ok(()) }",
        "async fn f(conn: deadpool::managed::Object<AsyncDieselConnectionManager<AsyncPgConnection>>, msg: &M) -> Result<(), E> { Ok(()) }",
    ] {
        assert_moves_into_a_local(&expand("id = msg.id", item), "conn");
    }
    // A `&mut` connection wins over an earlier `&mut` of another type.
    assert_sync_lends(
        "id = msg.id",
        "fn f(buf: &mut Vec<u8>, db: &mut PgConnection, msg: &M) -> Result<(), E> { Ok(()) }",
        parse_quote!(&mut *db),
        parse_quote!(db),
    );
    // So does a type parameter bounded by a connection trait.
    assert_sync_lends(
        "id = msg.id",
        "fn f<B, C>(buf: &mut B, conn: &mut C, msg: &M) -> Result<(), E> where C: Connection { Ok(()) }",
        parse_quote!(&mut *conn),
        parse_quote!(conn),
    );
}

#[test]
fn parenthesizes_casts_behind_the_borrow() {
    let out = expand("id = msg.seq as u64", HANDLER);
    // `&msg.seq as u64` would cast the borrow; the borrow must cover the id.
    assert_eq!(out.claim().id, parse_quote!((msg.seq as u64)));
}

#[test]
fn expands_the_async_shape_without_a_closure() {
    let out = expand(
        "id = msg.id, handler = \"billing.apply\"",
        "async fn apply(conn: &mut AsyncPgConnection, msg: &Payment) -> Result<(), E> { Ok(()) }",
    );
    out.assert_function_kept();
    let ret = output(&out);
    let key = out.claim().key;
    assert!(out.setup().is_empty());
    let run = out.run_async();
    let (transaction, transaction_mut) = &run.transaction;
    assert!(transaction_mut, "`conn()` borrows the transaction mutably");
    // `let mut T = match begin_async::<_, RET, _>(ROUTE, &mut *conn, KEY, OPTIONS).await { .. }`
    assert_eq!(run.begin.entry, runtime("::inbox_runtime", "begin_async"));
    assert_eq!(
        run.begin.types,
        [parse_quote!(_), ret.clone(), parse_quote!(_)]
    );
    // ROUTE: the connection's type picks, by autoref, how it begins.
    let route: Expr = parse_quote!({
        use ::inbox_runtime::__private::{RoutePipelined as _, RouteSequential as _};
        (&::inbox_runtime::__private::ConnRoute::of(&&mut *conn)).inbox_route()
    });
    assert_eq!(run.route, route, "{}", text(&run.route));
    assert_eq!(
        run.begin.args,
        [
            parse_quote!(&mut *conn),
            named(&key),
            parse_quote!(::inbox_runtime::Options::new())
        ]
    );
    // `Ok(t) => t`: the transaction; `Err(done) => return done`: the outcome
    // without running the body (a duplicate, an invalid id, a failure).
    let [ok, err] = &run.begun.arms[..] else {
        panic!("two arms: {}", text(&run.begun));
    };
    let (ok_variant, ok_bound, ok_body) = variant_arm(ok);
    assert_eq!(ok_variant, "::core::result::Result::Ok");
    assert_eq!(ok_body, named(&ok_bound));
    let (err_variant, err_bound, err_body) = variant_arm(err);
    assert_eq!(err_variant, "::core::result::Result::Err");
    let returned = named(&err_bound);
    assert_eq!(err_body, parse_quote!(return #returned));
    // `let R = catch_unwind(observed(&T), typed::<RET, _>(async { let conn = T.conn(); { body } })).await`
    assert_eq!(
        run.catch_unwind.entry,
        runtime("::inbox_runtime", "catch_unwind")
    );
    assert_eq!(run.observed.entry, runtime("::inbox_runtime", "observed"));
    assert_eq!(run.observed.args, [parse_quote!(&#transaction)]);
    assert_eq!(run.typed.entry, runtime("::inbox_runtime", "typed"));
    assert_eq!(run.typed.types, [ret.clone(), parse_quote!(_)]);
    let [conn, syn::Stmt::Expr(Expr::Block(body), None)] = &run.body.stmts[..] else {
        panic!("the connection, then the body: {}", text(&run.body));
    };
    let (param, source) = local(conn);
    assert_eq!(*param, parse_quote!(conn));
    assert_eq!(*source, parse_quote!(#transaction.conn()));
    assert!(body.attrs.is_empty());
    assert_eq!(
        body.block.stmts, out.input.block.stmts,
        "the body as written"
    );
    // `finish_async::<_, RET>(T, R).await` is the function's value.
    assert_eq!(run.finish.entry, runtime("::inbox_runtime", "finish_async"));
    assert_eq!(run.finish.types, [parse_quote!(_), ret]);
    assert_eq!(run.finish.args, [named(transaction), named(&run.result)]);
    // No closure: the handler's future holds nothing higher-ranked.
    assert_eq!(closures(&out.output.block), 0, "{}", text(&out.output));
}

/// `PATH(x) => BODY`: the variant's path as text, `x` and the body.
fn variant_arm(arm: &syn::Arm) -> (String, syn::Ident, Expr) {
    let syn::Pat::TupleStruct(pat) = &arm.pat else {
        panic!("not a variant pattern: {}", text(&arm.pat));
    };
    let [bound] = pat.elems.iter().collect::<Vec<_>>()[..] else {
        panic!("one field: {}", text(pat));
    };
    let (bound, _) = binding(bound);
    assert!(arm.guard.is_none());
    (
        text(&pat.path).replace(' ', ""),
        bound.clone(),
        (*arm.body).clone(),
    )
}

#[test]
fn probes_the_error_type_only_where_the_registration_can_name_it() {
    let probed = |handler: &str| {
        let out = expand("id = msg.id, handler = \"h\"", handler);
        let items = out.items();
        let [registration] = items else {
            panic!("the registration: {items:?}");
        };
        let registration = text(registration);
        assert!(registration.contains("ErrorTypeProbe"), "{registration}");
        !registration.contains("ErrorTypeProbe :: NONE")
    };
    assert!(probed(
        "fn f<C: Conn>(conn: &mut C, msg: &M) -> Result<(), AppError> { Ok(()) }"
    ));
    assert!(probed(
        "async fn f(conn: &mut AsyncPgConnection, msg: &M) -> QueryResult<u8> { Ok(1) }"
    ));
    for unnameable in [
        "fn f<E>(conn: &mut PgConnection, msg: &M) -> Result<(), E> { Ok(()) }",
        "fn f<const N: usize>(conn: &mut PgConnection, msg: &M) -> Result<[u8; N], E> { todo!() }",
        "fn f(conn: &mut PgConnection, msg: &M) -> Result<(), Self::Error> { Ok(()) }",
        "fn f(conn: &mut PgConnection, msg: &M) -> Result<Cow<'static, str>, E> { todo!() }",
        "fn f(&self, conn: &mut PgConnection, msg: &M) -> Result<(), AppError> { Ok(()) }",
    ] {
        assert!(!probed(unnameable), "{unnameable}");
    }
}
