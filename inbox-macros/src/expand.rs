//! Generates the rewritten function.
//!
//! The signature is re-emitted token for token; only the body changes:
//!
//! ```text
//! {
//!     #![inner attributes]
//!     KRATE::__private::inventory::submit! { KRATE::__private::registered(HANDLER, module_path!(), NAME, file!(), line!(), column!(), MAX_ATTEMPTS, FLAGS, ERROR_TYPE_PROBE) }
//!     let __inbox_key = KRATE::__private::claim_key(HANDLER, &ID);   // at the id's span
//!     // HANDLER: the literal, or `__INBOX_HANDLER`, defined first as
//!     // const __INBOX_HANDLER: &str = KRATE::__private::checked_handler(concat!(module_path!(), "::", NAME));
//!     KRATE::__private::run_sync::<_, RET, _>(&mut *conn, __inbox_key, OPTIONS, |conn| -> RET { body })
//! }
//! ```
//!
//! An `async fn` gets the same steps written out, without a closure:
//!
//! ```text
//! let mut __inbox_transaction = match KRATE::__private::begin_async::<_, RET, _>(ROUTE, &mut *conn, __inbox_key, OPTIONS).await {
//!     Ok(transaction) => transaction,          // the id is claimed: run the body
//!     Err(done) => return done,                // duplicate, invalid id, database failure
//! };
//! let __inbox_result = KRATE::__private::catch_unwind(
//!     KRATE::__private::observed(&__inbox_transaction),   // the delivery's span
//!     typed::<RET, _>(async {
//!         let conn = __inbox_transaction.conn();
//!         body
//!     }),
//! ).await;
//! KRATE::__private::finish_async::<_, RET>(__inbox_transaction, __inbox_result).await
//! ```
//!
//! `ROUTE` is how the connection's type begins its claim, picked by autoref
//! (`Pipelined`, the `BEGIN` sent with the claim, on `AsyncPgConnection`;
//! `Sequential` on any other type):
//! `{ use KRATE::__private::{RoutePipelined as _, RouteSequential as _}; (&KRATE::__private::ConnRoute::of(&&mut *conn)).inbox_route() }`.
//!
//! `OPTIONS` is the attribute's options as one runtime value,
//! `KRATE::Options::new()` followed by a builder call per argument given
//! (`.max_attempts(KRATE::MaxAttempts::limit(3))`,
//! `.claim_wait(KRATE::ClaimWait::Bounded(Duration::from_millis(2000)))`).
//!
//! With `fingerprint = PAYLOAD`, the key is
//! `KRATE::__private::fingerprinted_key(HANDLER, &ID, &PAYLOAD)`; with
//! `store_result`, the entry points are `run_sync_storing`,
//! `begin_async_storing` and `finish_async_storing`.
//!
//! `run_sync` names the return type `RET` in its turbofish, with the user's
//! spans: a return type that is not `Result<R, E>` (or whose `R` or `E` does
//! not fit) fails `run_sync`'s bounds on it, and the compiler reports that
//! once, at the return type (see `run`).
//!
//! Locals the expansion introduces are `Span::mixed_site()` identifiers, so
//! the user's body cannot see them; the closure parameter reuses the user's
//! connection name, so the body can only reach the transaction's connection.

use proc_macro2::{Delimiter, Group, Ident, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{AttrStyle, Expr, FnArg, ItemFn, LitStr, Pat, Path, Type};

use crate::attr::{ClaimWait, MaxAttempts};
use crate::model::{ConnPassing, Connection, Flavor, Handler, Shadow, View};

/// The function with its body wrapped in the idempotent transaction.
pub(crate) fn handler(handler: Handler) -> TokenStream {
    let Handler {
        function,
        flavor,
        connection,
        id,
        handler_name,
        krate,
        output,
        max_attempts,
        claim_wait,
        fingerprint,
        trace,
        store_result,
        shared_scope,
    } = handler;
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    let (inner_attrs, outer_attrs): (Vec<_>, Vec<_>) = attrs
        .into_iter()
        .partition(|attr| matches!(attr.style, AttrStyle::Inner(_)));
    let body_span = block.brace_token.span.join();
    let stmts = &block.stmts;

    let key = Ident::new("__inbox_key", Span::mixed_site());
    let (scope_item, name) = handler_expr(&krate, handler_name.as_ref(), &sig.ident);
    let registration = registration(
        &krate,
        &name,
        &sig.ident,
        max_attempts,
        [
            fingerprint.is_some(),
            store_result,
            shared_scope,
            flavor == Flavor::Async,
        ],
        error_type_probe(&krate, &sig, &output),
    );
    let claim = claim_key(&krate, &key, &name, &id, fingerprint.as_ref());
    let lent = lend(&connection);
    let run = run(
        flavor,
        &RunParts {
            krate: &krate,
            key: &key,
            lent: &lent,
            output: &output,
            options: options_expr(&krate, max_attempts, claim_wait),
            store_result,
            body: braced(body_span, quote!(#(#stmts)*)),
            trace: trace.as_ref(),
        },
    );
    let setup = &lent.setup;
    let new_body = braced(
        body_span,
        quote! {
            #(#inner_attrs)*
            #scope_item
            #registration
            #claim
            #setup
            #run
        },
    );
    quote! {
        #(#outer_attrs)*
        #vis #sig #new_body
    }
}

/// The function emitted after an error, next to the errors: the user's
/// function, its signature as written, with two kinds of statement put at
/// the start of the body:
///
/// - `let _ = &param;` for every parameter bound to a plain name, so the
///   parameters that only the id expression reads (which the fallback does
///   not evaluate) do not add "unused variable" warnings;
/// - the parameters meant as the connection rebound to what the body would
///   see in the real expansion (a `&mut` connection, see [`Shadow`]).
///
/// Without them, a body written for the expansion (`.execute(conn)` with an
/// owned `conn`, or a `conn: &PgConnection` the error asks to make `&mut`)
/// fails to type-check, and the real error drowns in a cascade of type
/// errors. The function keeps its signature, so callers see no "cannot find
/// function" either, and the body stays visible to the compiler and to IDEs.
/// None of it runs: the crate does not compile.
pub(crate) fn fallback(mut function: ItemFn, shadows: &[Shadow]) -> TokenStream {
    let mut rebinding = TokenStream::new();
    for arg in &function.sig.inputs {
        if let FnArg::Typed(param) = arg {
            if let Pat::Ident(binding) = &*param.pat {
                let name = &binding.ident;
                if binding.subpat.is_none() && !shadows.iter().any(|s| s.ident == *name) {
                    rebinding.extend(quote!(let _ = &#name;));
                }
            }
        }
    }
    for shadow in shadows {
        let conn = &shadow.ident;
        rebinding.extend(match &shadow.view {
            View::Lent(passing) => {
                let lent = lend(&Connection {
                    ident: conn.clone(),
                    passing: *passing,
                });
                let Lent {
                    setup, arg, param, ..
                } = lent;
                quote!(#setup let #param = #arg;)
            }
            View::Unreachable(ty) => quote! {
                let #conn: &mut #ty = {
                    let _ = #conn;
                    ::core::option::Option::<&mut #ty>::None
                        .expect("not run: `#[idempotent]` reported an error")
                };
            },
        });
    }
    let stmts: syn::Block = syn::parse_quote!({ #rebinding });
    function.block.stmts.splice(0..0, stmts.stmts);
    function.into_token_stream()
}

/// A `{ ... }` group whose braces carry `span` (the user's body braces).
fn braced(span: Span, content: TokenStream) -> Group {
    let mut group = Group::new(Delimiter::Brace, content);
    group.set_span(span);
    group
}

/// The handler name, checked once, when the handler compiles: the literal
/// given (checked by the attribute), or `module_path!()::fn_name` (checked
/// by the runtime's `checked_handler` in a `const` item of the body, which
/// the registration and the claim both name, so a name too long is
/// reported once).
fn handler_expr(
    krate: &Path,
    explicit: Option<&LitStr>,
    fn_name: &Ident,
) -> (TokenStream, TokenStream) {
    match explicit {
        Some(name) => (TokenStream::new(), name.to_token_stream()),
        None => {
            let fn_name = LitStr::new(&fn_name.unraw().to_string(), fn_name.span());
            let scope = Ident::new("__INBOX_HANDLER", Span::call_site());
            (
                quote! {
                    const #scope: &'static str = #krate::__private::checked_handler(
                        ::core::concat!(::core::module_path!(), "::", #fn_name)
                    );
                },
                quote!(#scope),
            )
        }
    }
}

/// The handler's entry in the registry (`inbox_runtime::registry`): an item
/// in the handler's body, so it is allowed wherever the function is (a
/// method, a generic or an `async fn`), is emitted once per function (not
/// per monomorphization), and resolves `module_path!()`, `file!()` and
/// `line!()` where the handler is. `inventory::submit!` is a `macro_rules!`
/// of another crate, so its `unsafe` (a life-before-main constructor) is no
/// `unsafe_code` of the user's crate, which may `#![forbid(unsafe_code)]`.
fn registration(
    krate: &Path,
    name: &TokenStream,
    fn_name: &Ident,
    max_attempts: Option<MaxAttempts>,
    [fingerprint, store_result, shared_scope, is_async]: [bool; 4],
    error_type: TokenStream,
) -> TokenStream {
    let fn_name = LitStr::new(&fn_name.unraw().to_string(), fn_name.span());
    let max_attempts = max_attempts_expr(krate, max_attempts);
    quote! {
        #krate::__private::inventory::submit! {
            #krate::__private::registered(
                #name,
                ::core::module_path!(),
                #fn_name,
                ::core::file!(),
                ::core::line!(),
                ::core::column!(),
                #max_attempts,
                (#fingerprint, #store_result, #shared_scope, #is_async),
                #error_type,
            )
        }
    }
}

/// The registration's probe of the handler's error type
/// (`registry::RegisteredHandler::error_type`): a closure that names the
/// return type, `ErrorTypeProbe::new(|| (&ErrorTypeOf::<RET>::new()).probe_error_type())`,
/// whose method resolves to the probe for a `Result` with a handler error
/// type and to a fallback for anything else (a wrong return type is
/// reported by the delivery, once). The registration is an item of its
/// own, so it cannot name the function's generic parameters, `Self` or its
/// lifetimes, nor those of an impl block around a method: for such a
/// return type, and for a method that takes `self`, `ErrorTypeProbe::NONE`.
fn error_type_probe(krate: &Path, sig: &syn::Signature, output: &Type) -> TokenStream {
    let generics: Vec<&Ident> = sig
        .generics
        .type_params()
        .map(|param| &param.ident)
        .chain(sig.generics.const_params().map(|param| &param.ident))
        .collect();
    let nameable =
        sig.receiver().is_none() && !names_outer_items(output.to_token_stream(), &generics);
    if nameable {
        quote! {
            #krate::__private::ErrorTypeProbe::new(|| {
                use #krate::__private::{ProbeHandlerError as _, ProbeNothing as _};
                (&#krate::__private::ErrorTypeOf::<#output>::new()).probe_error_type()
            })
        }
    } else {
        quote!(#krate::__private::ErrorTypeProbe::NONE)
    }
}

/// Whether `tokens` name something an item nested in the function cannot:
/// one of `generics`, `Self`, a lifetime, or an `impl Trait`.
fn names_outer_items(tokens: TokenStream, generics: &[&Ident]) -> bool {
    tokens.into_iter().any(|token| match token {
        TokenTree::Ident(ident) => {
            ident == "Self" || ident == "impl" || generics.iter().any(|g| ident == **g)
        }
        TokenTree::Punct(punct) => punct.as_char() == '\'',
        TokenTree::Group(group) => names_outer_items(group.stream(), generics),
        TokenTree::Literal(_) => false,
    })
}

/// `let __inbox_key = claim_key(..);` (`fingerprinted_key(..)` with a
/// fingerprint), spanned at the id expression so a wrong id type is
/// reported there, and a payload that cannot be fingerprinted at the
/// fingerprint expression.
fn claim_key(
    krate: &Path,
    key: &Ident,
    name: &TokenStream,
    id: &Expr,
    fingerprint: Option<&Expr>,
) -> TokenStream {
    // The runtime path keeps the attribute's span here: the compiler then
    // underlines the argument (the user's id) and labels the attribute as
    // the call, rather than drawing both over the id's first token.
    let span = id.span();
    let id = operand(id);
    match fingerprint {
        None => quote_spanned! {span=>
            let #key = #krate::__private::claim_key(#name, &#id);
        },
        Some(payload) => {
            let payload = operand(payload);
            quote_spanned! {span=>
                let #key = #krate::__private::fingerprinted_key(#name, &#id, &#payload);
            }
        }
    }
}

/// `expr` as the operand of `&`, parenthesized where it needs to be.
fn operand(expr: &Expr) -> TokenStream {
    if needs_parens(expr) {
        quote_spanned!(expr.span()=> (#expr))
    } else {
        expr.to_token_stream()
    }
}

/// Whether `&` must not be written directly in front of `expr`.
///
/// Only expressions that bind at least as tightly as a prefix `&` go without
/// parentheses; those are also the ones a person would write, and extra
/// parentheses there would only risk an `unused_parens` warning.
fn needs_parens(expr: &Expr) -> bool {
    !matches!(
        expr,
        Expr::Path(_)
            | Expr::Field(_)
            | Expr::MethodCall(_)
            | Expr::Index(_)
            | Expr::Call(_)
            | Expr::Macro(_)
            | Expr::Paren(_)
            | Expr::Lit(_)
            | Expr::Try(_)
            | Expr::Reference(_)
            | Expr::Unary(_)
    )
}

/// The tokens of `path`, every one carrying `span`.
///
/// A call whose path keeps the attribute's span would be reported at the
/// attribute; respanned, the compiler points at the user's tokens instead.
/// The runtime path is absolute (`::inbox_runtime`) or was written by the
/// user (`crate = ".."`), so resolving it at the user's span finds the same
/// crate.
fn respanned(path: TokenStream, span: Span) -> TokenStream {
    path.into_iter()
        .map(|mut tree| {
            if let TokenTree::Group(group) = &tree {
                let mut inner = Group::new(group.delimiter(), respanned(group.stream(), span));
                inner.set_span(span);
                tree = TokenTree::Group(inner);
            } else {
                tree.set_span(span);
            }
            tree
        })
        .collect()
}

/// How the connection is handed to the runtime.
struct Lent {
    /// Statements run before the transaction (a `let mut` for owned connections).
    setup: TokenStream,
    /// The `&mut` expression passed to the runtime.
    arg: TokenStream,
    /// The closure's parameter: the user's connection name.
    param: TokenStream,
    /// The span of the connection parameter's name.
    span: Span,
}

/// The tokens lending `connection` to the runtime.
///
/// They are spanned at the parameter's name, so a type that is not a Diesel
/// connection is reported at the parameter.
fn lend(connection: &Connection) -> Lent {
    let conn = &connection.ident;
    let span = conn.span();
    match connection.passing {
        ConnPassing::Reborrow { mut_binding: false } => Lent {
            setup: TokenStream::new(),
            arg: quote_spanned!(span=> &mut *#conn),
            param: quote!(#conn),
            span,
        },
        // `mut conn: &mut T`: borrowing the binding mutably keeps its `mut`
        // used (no `unused_mut`), and the closure parameter keeps it too.
        ConnPassing::Reborrow { mut_binding: true } => Lent {
            setup: TokenStream::new(),
            arg: quote_spanned!(span=> ::core::ops::DerefMut::deref_mut(&mut #conn)),
            param: quote_spanned!(span=> mut #conn),
            span,
        },
        ConnPassing::BorrowBinding => Lent {
            setup: TokenStream::new(),
            arg: quote_spanned!(span=> &mut #conn),
            param: quote!(#conn),
            span,
        },
        ConnPassing::MoveIntoLocal => {
            let local = Ident::new("__inbox_conn", Span::mixed_site());
            Lent {
                setup: quote_spanned!(span=> let mut #local = #conn;),
                arg: quote_spanned!(span=> &mut #local),
                param: quote!(#conn),
                span,
            }
        }
    }
}

/// The pieces of the runtime call.
struct RunParts<'a> {
    /// The runtime crate.
    krate: &'a Path,
    /// The claim key local.
    key: &'a Ident,
    /// The lent connection.
    lent: &'a Lent,
    /// The function's return type, which the closure returns too.
    output: &'a Type,
    /// The handler's options: an `Options` expression built from the
    /// attribute's arguments (none set: the runtime's defaults).
    options: TokenStream,
    /// `store_result`: the storing entry points.
    store_result: bool,
    /// The user's body, in the user's braces.
    body: Group,
    /// `trace = ...`: the body runs in that trace
    /// (`outbox::continuing`, `outbox::continuing_async`).
    trace: Option<&'a Expr>,
}

/// `max_attempts = ...` as the runtime's `Option<MaxAttempts>`, spanned at
/// what the user wrote.
fn max_attempts_expr(krate: &Path, max_attempts: Option<MaxAttempts>) -> TokenStream {
    match max_attempts {
        None => quote!(::core::option::Option::None),
        Some(MaxAttempts::Limit(limit, span)) => quote_spanned! {span=>
            ::core::option::Option::Some(#krate::MaxAttempts::limit(#limit))
        },
        Some(MaxAttempts::Unbounded(span)) => quote_spanned! {span=>
            ::core::option::Option::Some(#krate::MaxAttempts::Unbounded)
        },
    }
}

/// The attribute's options as the runtime's `Options` value: `Options::new()`,
/// then one builder call per argument given, spanned at what the user wrote.
fn options_expr(
    krate: &Path,
    max_attempts: Option<MaxAttempts>,
    claim_wait: Option<ClaimWait>,
) -> TokenStream {
    let mut options = quote!(#krate::Options::new());
    let limit = match max_attempts {
        None => None,
        Some(MaxAttempts::Limit(limit, span)) => {
            Some(quote_spanned!(span=> #krate::MaxAttempts::limit(#limit)))
        }
        Some(MaxAttempts::Unbounded(span)) => {
            Some(quote_spanned!(span=> #krate::MaxAttempts::Unbounded))
        }
    };
    if let Some(limit) = limit {
        options = quote!(#options.max_attempts(#limit));
    }
    let wait = match claim_wait {
        None => None,
        Some(ClaimWait::Bounded(millis, span)) => Some(quote_spanned! {span=>
            #krate::ClaimWait::Bounded(::core::time::Duration::from_millis(#millis))
        }),
        Some(ClaimWait::Unbounded(span)) => {
            Some(quote_spanned!(span=> #krate::ClaimWait::Unbounded))
        }
        Some(ClaimWait::Expr(expr)) => Some(quote!(#expr)),
    };
    if let Some(wait) = wait {
        options = quote!(#options.claim_wait(#wait));
    }
    options
}

/// The call that runs the body in the transaction, per flavor.
///
/// The closure is not `move`, and returns exactly the function's return type,
/// so `return` and `?` in the body behave as they did in the function.
///
/// The sync flavor is one call, `run_sync::<_, RET, _>(conn, key, closure)`;
/// the async flavor writes the same steps out (see below). In both:
/// - the return type is the entry point's second generic argument, with the
///   user's spans, so a wrong return type fails the entry point's bounds once,
///   at the return type;
/// - the call's path starts at the return type's first token and its
///   parentheses end at its last, so the call expression (where a return type
///   that is not a `Result` at all is reported) covers exactly the return type;
/// - the connection's `_` carries the connection parameter's span, so a type
///   that is not a Diesel connection is reported at that parameter.
fn run(flavor: Flavor, parts: &RunParts) -> TokenStream {
    let RunParts {
        krate,
        key,
        lent,
        output,
        options,
        store_result,
        body,
        trace,
    } = parts;
    let entry = |plain: &str, storing: &str| {
        let name = Ident::new(
            if *store_result { storing } else { plain },
            Span::call_site(),
        );
        quote!(#krate::__private::#name)
    };
    let Lent { arg, param, .. } = lent;
    let (first, last) = end_spans(output);
    let conn_type = quote_spanned!(lent.span=> _);
    match flavor {
        Flavor::Sync => {
            let entry = respanned(entry("run_sync", "run_sync_storing"), first);
            let body = match trace {
                None => body.to_token_stream(),
                Some(trace) => quote_spanned! {trace.span()=>
                    { #krate::outbox::continuing(&(#trace), || -> #output #body) }
                },
            };
            let args = parenthesized(
                last,
                quote!(#arg, #key, #options, |#param| -> #output #body),
            );
            quote!(#entry::<#conn_type, #output, _> #args)
        }
        Flavor::Async => {
            // No closure: the steps are written out in the handler's own
            // body, so its future holds nothing higher-ranked and is `Send`
            // whenever the body is (a future holding an async closure over a
            // connection type with a lifetime is not provably `Send` today).
            // `return` and `?` in the body leave the inner `async` block,
            // whose output `typed` pins to the return type.
            let transaction = Ident::new("__inbox_transaction", Span::mixed_site());
            let done = Ident::new("__inbox_done", Span::mixed_site());
            let result = Ident::new("__inbox_result", Span::mixed_site());
            let begin = respanned(entry("begin_async", "begin_async_storing"), first);
            // How the connection's type begins the claim, picked by autoref:
            // `BEGIN` pipelined with the claim on an `AsyncPgConnection`.
            // Spanned at the connection parameter: a type that is not a
            // diesel-async connection is reported there.
            let of = quote_spanned!(lent.span=> #krate::__private::ConnRoute::of(&#arg));
            let route = quote! {
                {
                    use #krate::__private::{RoutePipelined as _, RouteSequential as _};
                    (&#of).inbox_route()
                }
            };
            let begin_args = parenthesized(last, quote!(#route, #arg, #key, #options));
            let typed = respanned(quote!(#krate::__private::typed), first);
            let body = quote! {
                async {
                    let #param = #transaction.conn();
                    #body
                }
            };
            let traced = match trace {
                None => body,
                Some(trace) => quote_spanned! {trace.span()=>
                    #krate::outbox::continuing_async(&(#trace), #body)
                },
            };
            let finish = respanned(entry("finish_async", "finish_async_storing"), first);
            let finish_args = parenthesized(last, quote!(#transaction, #result));
            quote! {
                let mut #transaction = match #begin::<#conn_type, #output, _> #begin_args.await {
                    ::core::result::Result::Ok(#transaction) => #transaction,
                    ::core::result::Result::Err(#done) => return #done,
                };
                let #result = #krate::__private::catch_unwind(
                    #krate::__private::observed(&#transaction),
                    #typed::<#output, _>(#traced),
                )
                .await;
                #finish::<_, #output> #finish_args.await
            }
        }
    }
}

/// The spans of the first and last tokens of `node` (a group's span covers
/// its delimiters).
///
/// A stable proc macro cannot join spans; the compiler does, for an
/// expression whose first and last tokens carry these two.
fn end_spans(node: &impl ToTokens) -> (Span, Span) {
    let mut tokens = node.to_token_stream().into_iter();
    let first = tokens
        .next()
        .map_or_else(Span::call_site, |tree| tree.span());
    let last = tokens.last().map_or(first, |tree| tree.span());
    (first, last)
}

/// A `( ... )` group whose parentheses carry `span`.
fn parenthesized(span: Span, content: TokenStream) -> Group {
    let mut group = Group::new(Delimiter::Parenthesis, content);
    group.set_span(span);
    group
}
