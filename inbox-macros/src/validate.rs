//! Checks a function and its arguments, producing the [`Handler`] to expand.
//!
//! Every check records its errors and carries on, so all problems of one
//! handler are reported in one build.

mod connection;
mod id_root;
mod signature;

use syn::{parse_quote, ItemFn};

use crate::attr::Args;
use crate::errors::Errors;
use crate::model::Handler;

/// Validates `function` against `args`, adding to the errors `errors` already
/// holds (from argument parsing). Returns the handler if nothing was wrong,
/// otherwise every error combined.
pub(crate) fn handler(function: ItemFn, args: Args, mut errors: Errors) -> syn::Result<Handler> {
    let flavor = signature::flavor(&function, &mut errors);
    let output = signature::output(&function.sig, &mut errors);
    signature::method_scope(&function.sig, args.handler_given, &mut errors);
    let connection = connection::find(&function.sig, args.conn.as_ref(), &mut errors);
    if let Some(id) = &args.id {
        let scope = id_root::Scope::of(&function.sig, connection.as_ref().map(|c| &c.ident));
        id_root::check(id, &scope, &mut errors);
    }
    errors.finish()?;
    match (output, connection, args.id) {
        (Some(output), Some(connection), Some(id)) => Ok(Handler {
            function,
            flavor,
            connection,
            id,
            handler_name: args.handler,
            krate: args.krate.unwrap_or_else(|| parse_quote!(::inbox_runtime)),
            output,
        }),
        // Every `None` above was recorded as an error, so this is not reached.
        _ => Err(syn::Error::new(
            proc_macro2::Span::call_site(),
            "internal error in `#[idempotent]`: a check failed without an error",
        )),
    }
}
