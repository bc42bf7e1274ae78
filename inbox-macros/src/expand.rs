//! Generates the rewritten function.
//!
//! The signature is re-emitted token for token; only the body changes:
//!
//! ```text
//! {
//!     #![inner attributes]
//!     let __inbox_key = KRATE::__private::claim_key(HANDLER, &ID);   // at the id's span
//!     KRATE::__private::check_output::<RET>();                       // at the return type's span
//!     KRATE::__private::run_sync(&mut *conn, __inbox_key, |conn| -> RET { body })
//! }
//! ```
//!
//! Locals the expansion introduces are `Span::mixed_site()` identifiers, so
//! the user's body cannot see them; the closure parameter reuses the user's
//! connection name, so the body can only reach the transaction's connection.

use proc_macro2::{Delimiter, Group, Ident, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{AttrStyle, Expr, ItemFn, LitStr, Path, Type};

use crate::model::{ConnPassing, Connection, Flavor, Handler};

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
    let name = handler_expr(handler_name.as_ref(), &sig.ident);
    let claim = claim_key(&krate, &key, &name, &id);
    let check = check_output(&krate, &output);
    let lent = lend(&connection);
    let run = run(
        flavor,
        &RunParts {
            krate: &krate,
            key: &key,
            lent: &lent,
            output: &output,
            body: braced(body_span, quote!(#(#stmts)*)),
        },
    );
    let setup = &lent.setup;
    let new_body = braced(
        body_span,
        quote! {
            #(#inner_attrs)*
            #claim
            #check
            #setup
            #run
        },
    );
    quote! {
        #(#outer_attrs)*
        #vis #sig #new_body
    }
}

/// A `{ ... }` group whose braces carry `span` (the user's body braces).
fn braced(span: Span, content: TokenStream) -> Group {
    let mut group = Group::new(Delimiter::Brace, content);
    group.set_span(span);
    group
}

/// The handler name: the literal given, or `module_path!()::fn_name`.
fn handler_expr(explicit: Option<&LitStr>, fn_name: &Ident) -> TokenStream {
    match explicit {
        Some(name) => name.to_token_stream(),
        None => {
            let fn_name = LitStr::new(&fn_name.unraw().to_string(), fn_name.span());
            quote!(::core::concat!(::core::module_path!(), "::", #fn_name))
        }
    }
}

/// `let __inbox_key = claim_key(..);`, spanned at the id expression so a
/// wrong id type is reported there.
fn claim_key(krate: &Path, key: &Ident, name: &TokenStream, id: &Expr) -> TokenStream {
    // The runtime path keeps the attribute's span here: the compiler then
    // underlines the argument (the user's id) and labels the attribute as
    // the call, rather than drawing both over the id's first token.
    let span = id.span();
    let id = if needs_parens(id) {
        quote_spanned!(span=> (#id))
    } else {
        id.to_token_stream()
    };
    quote_spanned! {span=>
        let #key = #krate::__private::claim_key(#name, &#id);
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

/// `check_output::<RET>();`, spanned at the return type so a non-`Result`
/// (or a bad `Ok`/`Err` type) is reported there.
fn check_output(krate: &Path, output: &Type) -> TokenStream {
    let span = output.span();
    let krate = respanned(krate, span);
    quote_spanned! {span=>
        #krate::__private::check_output::<#output>();
    }
}

/// The tokens of `path`, every one carrying `span`.
///
/// A call whose path keeps the attribute's span while its arguments have the
/// user's would be reported at the attribute; with one span throughout, the
/// compiler points at the user's expression or type. The runtime path is
/// absolute (`::inbox_runtime`) or was written by the user (`crate = ".."`),
/// so resolving it at the user's span finds the same crate.
fn respanned(path: &Path, span: Span) -> TokenStream {
    fn respan(stream: TokenStream, span: Span) -> TokenStream {
        stream
            .into_iter()
            .map(|mut tree| {
                if let TokenTree::Group(group) = &tree {
                    let mut inner = Group::new(group.delimiter(), respan(group.stream(), span));
                    inner.set_span(span);
                    tree = TokenTree::Group(inner);
                } else {
                    tree.set_span(span);
                }
                tree
            })
            .collect()
    }
    respan(path.to_token_stream(), span)
}

/// How the connection is handed to the runtime.
struct Lent {
    /// Statements run before the transaction (a `let mut` for owned connections).
    setup: TokenStream,
    /// The `&mut` expression passed to the runtime.
    arg: TokenStream,
    /// The closure's parameter: the user's connection name.
    param: TokenStream,
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
        },
        // `mut conn: &mut T`: borrowing the binding mutably keeps its `mut`
        // used (no `unused_mut`), and the closure parameter keeps it too.
        ConnPassing::Reborrow { mut_binding: true } => Lent {
            setup: TokenStream::new(),
            arg: quote_spanned!(span=> ::core::ops::DerefMut::deref_mut(&mut #conn)),
            param: quote_spanned!(span=> mut #conn),
        },
        ConnPassing::BorrowBinding => Lent {
            setup: TokenStream::new(),
            arg: quote_spanned!(span=> &mut #conn),
            param: quote!(#conn),
        },
        ConnPassing::MoveIntoLocal => {
            let local = Ident::new("__inbox_conn", Span::mixed_site());
            Lent {
                setup: quote_spanned!(span=> let mut #local = #conn;),
                arg: quote_spanned!(span=> &mut #local),
                param: quote!(#conn),
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
    /// The user's body, in the user's braces.
    body: Group,
}

/// The call that runs the body in the transaction, per flavor.
///
/// The closure is not `move`, and returns exactly the function's return type,
/// so `return` and `?` in the body behave as they did in the function.
fn run(flavor: Flavor, parts: &RunParts) -> TokenStream {
    let RunParts {
        krate,
        key,
        lent,
        output,
        body,
    } = parts;
    let Lent { arg, param, .. } = lent;
    match flavor {
        Flavor::Sync => quote! {
            #krate::__private::run_sync(#arg, #key, |#param| -> #output #body)
        },
        Flavor::Async => quote! {
            #krate::__private::run_async(#arg, #key, async |#param| -> #output #body).await
        },
    }
}
