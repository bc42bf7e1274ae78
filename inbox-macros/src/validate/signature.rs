//! Checks of the function itself: `const`, `async`, `#[async_trait]` output,
//! the return type, and the explicit scope methods need.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{Block, Expr, ItemFn, ReturnType, Signature, Stmt, Type, TypeImplTrait};

use crate::errors::Errors;
use crate::model::Flavor;

/// Whether the handler is sync or async; refuses `const fn` and bodies
/// already rewritten by `#[async_trait]`.
pub(crate) fn flavor(function: &ItemFn, errors: &mut Errors) -> Flavor {
    let sig = &function.sig;
    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new(
            constness.span,
            "`#[idempotent]` cannot be applied to a `const fn`: the handler runs a database \
             transaction, which is not possible at compile time",
        ));
    }
    if sig.asyncness.is_some() {
        return Flavor::Async;
    }
    if is_async_trait_body(&function.block) {
        errors.push(syn::Error::new(
            sig.ident.span(),
            "`#[idempotent]` cannot wrap a method rewritten by `#[async_trait]`: its body is \
             already a boxed future (`Box::pin(async move { .. })`) whose transaction the \
             attribute cannot see; write the trait with a native `async fn` (Rust 1.75+) and \
             drop `#[async_trait]`, or put the idempotent handler in a free `async fn` that the \
             trait method calls",
        ));
    }
    Flavor::Sync
}

/// Whether `block` is what `#[async_trait]` makes of an `async fn`: a body
/// ending in `Box::pin(async move { .. })`.
pub(crate) fn is_async_trait_body(block: &Block) -> bool {
    let Some(Stmt::Expr(Expr::Call(call), None)) = block.stmts.last() else {
        return false;
    };
    let Expr::Path(func) = &*call.func else {
        return false;
    };
    let segments: Vec<String> = func
        .path
        .segments
        .iter()
        .map(|segment| segment.ident.to_string())
        .collect();
    segments.ends_with(&["Box".to_owned(), "pin".to_owned()])
        && call.args.len() == 1
        && matches!(call.args.first(), Some(Expr::Async(_)))
}

/// The declared return type, if it can be the closure's return type and may
/// be a `Result`; whether it *is* a `Result` of the right kind is checked by
/// the bounds of the runtime's `run_sync`, which the expansion hands the type
/// with its own spans, so the problem is named where the type is.
pub(crate) fn output(sig: &Signature, errors: &mut Errors) -> Option<Type> {
    let ty = match &sig.output {
        ReturnType::Type(_, ty) if !matches!(**ty, Type::Never(_)) => ty,
        ReturnType::Type(_, ty) => {
            errors.push(not_a_result(ty.span()));
            return None;
        }
        ReturnType::Default => {
            errors.push(not_a_result(sig.ident.span()));
            return None;
        }
    };
    let mut finder = ImplTraitFinder::default();
    finder.visit_type(ty);
    if finder.found.is_empty() {
        return Some((**ty).clone());
    }
    for impl_trait in finder.found {
        errors.push(syn::Error::new_spanned(
            impl_trait,
            "`impl Trait` cannot appear in the return type of an idempotent handler: the body \
             runs in a closure that must name the function's return type; use a concrete type \
             (or `Box<dyn Trait>`)",
        ));
    }
    None
}

/// The error for a handler without a `Result` return type.
fn not_a_result(span: proc_macro2::Span) -> syn::Error {
    syn::Error::new(
        span,
        "an idempotent handler must return `Result<_, _>`: the transaction commits on `Ok` and \
         rolls back on `Err`; return e.g. `Result<(), diesel::result::Error>`",
    )
}

/// Collects every outermost `impl Trait` in a type.
#[derive(Default)]
struct ImplTraitFinder {
    found: Vec<TypeImplTrait>,
}

impl<'ast> Visit<'ast> for ImplTraitFinder {
    fn visit_type_impl_trait(&mut self, node: &'ast TypeImplTrait) {
        // The outermost `impl` is enough to report; nested ones go with it.
        self.found.push(node.clone());
    }
}

/// Refuses a method (a `self` receiver, or `Self` anywhere in the signature)
/// without an explicit `handler = "..."`.
///
/// The default scope is `module_path!()::fn_name`: `impl A { fn handle }` and
/// `impl B { fn handle }` in one module would get the same scope, and each
/// would skip the messages the other processed. The attribute cannot see the
/// `impl` it is in, so it asks for a name instead. (An associated function
/// without `self` or `Self` looks like a free function and cannot be told
/// apart; the documentation asks for a name there too.)
pub(crate) fn method_scope(sig: &Signature, handler_given: bool, errors: &mut Errors) {
    if handler_given {
        return;
    }
    let span = match sig.receiver() {
        Some(receiver) => Some(receiver.self_token.span),
        None => find_self_type(sig.to_token_stream()),
    };
    if let Some(span) = span {
        errors.push(syn::Error::new(
            span,
            "a method needs an explicit `handler = \"...\"`: the default scope (module path and \
             function name) would be shared by a method of the same name on another type in this \
             module, and the two would skip each other's messages",
        ));
    }
}

/// The span of the first `Self` in `tokens` (macro arguments included).
fn find_self_type(tokens: TokenStream) -> Option<Span> {
    tokens.into_iter().find_map(|tree| match tree {
        TokenTree::Ident(ident) if ident == "Self" => Some(ident.span()),
        TokenTree::Group(group) => find_self_type(group.stream()),
        _ => None,
    })
}
