//! Checks of the function itself: `const`, `async`, `#[async_trait]` output
//! and the return type.

use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{Block, Expr, ItemFn, ReturnType, Signature, Stmt, Type, TypeImplTrait};

use crate::errors::Errors;
use crate::model::Flavor;

/// Whether the handler is sync or async; refuses `const fn`, and `async`
/// handlers until the runtime supports them.
pub(crate) fn flavor(function: &ItemFn, errors: &mut Errors) -> Flavor {
    let sig = &function.sig;
    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new(
            constness.span,
            "`#[idempotent]` cannot be applied to a `const fn`: the handler runs a database \
             transaction, which is not possible at compile time",
        ));
    }
    if let Some(asyncness) = &sig.asyncness {
        errors.push(syn::Error::new(
            asyncness.span,
            "`#[idempotent]` does not support `async fn` yet: async handlers need the \
             `async` support of `inbox_runtime` (diesel-async), which is not available yet; \
             use a sync handler with a sync Diesel connection",
        ));
        return Flavor::Async;
    }
    if is_async_trait_body(&function.block) {
        errors.push(syn::Error::new(
            sig.ident.span(),
            "`#[idempotent]` cannot wrap a method rewritten by `#[async_trait]`: its body is a \
             boxed future (`Box::pin(async move { .. })`), and async handlers need the `async` \
             support of `inbox_runtime`, which is not available yet",
        ));
    }
    Flavor::Sync
}

/// Whether `block` is what `#[async_trait]` makes of an `async fn`: a body
/// ending in `Box::pin(async move { .. })`.
fn is_async_trait_body(block: &Block) -> bool {
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
/// the runtime's `check_output`, which names the problem where the type is.
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
