//! Checks a function and its arguments, producing the [`Handler`] to expand.
//!
//! Every check records its errors and carries on, so all problems of one
//! handler are reported in one build.

mod connection;
mod id_root;
mod kind;
mod outside;
mod per_delivery;
mod signature;
mod subject;

use syn::{ItemFn, parse_quote};

use crate::attr::Args;
use crate::errors::Errors;
use crate::model::{Handler, Shadow};
use subject::Subject;

/// A handler that failed validation: every error, and what the fallback
/// expansion needs to emit the function without a cascade of type errors.
pub(crate) struct Rejected {
    /// Every error, combined.
    pub(crate) error: syn::Error,
    /// The function as the user wrote it.
    pub(crate) function: ItemFn,
    /// The parameters the body uses as its `&mut` connection, to rebind at
    /// the start of the body.
    pub(crate) shadows: Vec<Shadow>,
}

/// Validates `function` against `args`, adding to the errors `errors` already
/// holds (from argument parsing). Returns the handler if nothing was wrong,
/// otherwise every error combined.
pub(crate) fn handler(
    function: ItemFn,
    args: Args,
    mut errors: Errors,
) -> Result<Handler, Box<Rejected>> {
    let flavor = signature::flavor(&function, &mut errors);
    let output = signature::output(&function.sig, &mut errors);
    signature::method_scope(&function.sig, args.handler_given, &mut errors);
    if let (Some(span), false) = (args.shared_scope, args.handler_given) {
        errors.push(syn::Error::new(
            span,
            "`shared_scope` declares that other handlers use this handler's scope on purpose; \
             name that scope with `handler = \"…\"`, so the handlers sharing it all name it \
             (the default scope, the function's path, is this function's alone)",
        ));
    }
    let classifier = kind::Classifier::of(&function.sig);
    let found = connection::find(&function.sig, args.conn.as_ref(), &classifier, &mut errors);
    let conn_ident = found.connection.as_ref().map(|c| &c.ident);
    outside::check(
        &function.sig,
        &function.block,
        &classifier,
        &outside::Context {
            connection: conn_ident,
            detected: args.conn.is_none(),
            claimed: &found.claimed,
            allowed: &args.outside_transaction,
        },
        &mut errors,
    );
    let scope = id_root::Scope::of(&function.sig, conn_ident);
    if let Some(id) = &args.id {
        id_root::check(id, &scope, Subject::Id, &mut errors);
        per_delivery::check(id, Subject::Id, &mut errors);
    }
    if let Some(fingerprint) = &args.fingerprint {
        id_root::check(fingerprint, &scope, Subject::Fingerprint, &mut errors);
        per_delivery::check(fingerprint, Subject::Fingerprint, &mut errors);
    }
    if let Err(error) = errors.finish() {
        // A body rewritten by `#[async_trait]` moves its parameters into a
        // boxed future; rebinding them would only add borrow errors.
        let shadows = if signature::is_async_trait_body(&function.block) {
            Vec::new()
        } else {
            found.shadows
        };
        return Err(Box::new(Rejected {
            error,
            function,
            shadows,
        }));
    }
    match (output, found.connection, args.id) {
        (Some(output), Some(connection), Some(id)) => Ok(Handler {
            function,
            flavor,
            connection,
            id,
            handler_name: args.handler,
            krate: args.krate.unwrap_or_else(|| parse_quote!(::inbox_runtime)),
            output,
            max_attempts: args.max_attempts,
            claim_wait: args.claim_wait,
            fingerprint: args.fingerprint,
            trace: args.trace,
            store_result: args.store_result.is_some(),
            shared_scope: args.shared_scope.is_some(),
        }),
        // Every `None` above was recorded as an error, so this is not reached.
        _ => Err(Box::new(Rejected {
            error: syn::Error::new(
                proc_macro2::Span::call_site(),
                "internal error in `#[idempotent]`: a check failed without an error",
            ),
            function,
            shadows: Vec::new(),
        })),
    }
}
