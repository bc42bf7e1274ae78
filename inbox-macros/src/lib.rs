//! The `#[idempotent]` attribute of the inbox crates.
//!
//! Do not depend on this crate directly: `inbox_runtime` re-exports the
//! attribute as `inbox_runtime::idempotent`, and the code it generates calls
//! into `inbox_runtime`.
//!
//! ```ignore
//! use inbox_runtime::idempotent;
//!
//! #[idempotent(id = msg.id, handler = "billing.apply_payment")]
//! fn apply_payment(conn: &mut PgConnection, msg: &PaymentReceived) -> Result<(), AppError> {
//!     diesel::insert_into(payments::table).values(msg).execute(conn)?;
//!     Ok(())
//! }
//! ```
//!
//! The signature is kept as written; the body becomes one Diesel transaction
//! that first claims `(handler, id)` in the inbox table and skips the body if
//! the message was already processed. See `inbox_runtime` for the semantics,
//! and `inbox_runtime::idempotent` for the reference of the arguments.
//!
//! Three rules a reader of a handler should know:
//!
//! - **Methods name their scope.** The default scope is `module_path!()` and
//!   the function's name, which `impl A { fn handle }` and `impl B { fn handle
//!   }` in one module would share: each would skip the messages the other
//!   processed. A function with a `self` receiver, or `Self` anywhere in its
//!   signature, must give `handler = "..."`. (An associated function without
//!   either looks like a free function to the attribute; name it too.)
//! - **The connection in the body is `&mut`.** The body runs in a closure
//!   that receives the transaction's connection under the parameter's name.
//!   With a by-value connection (`conn: PooledConnection<..>`), `conn` inside
//!   the body is `&mut` to it, as for a `&mut` parameter: write
//!   `.execute(conn)`, not `.execute(&mut conn)`.
//! - **One connection.** Only the connection parameter is the transaction's
//!   connection; what the body writes through any other connection commits
//!   on its own and is repeated on a redelivery. So a parameter whose type is
//!   a second connection or a pool (`&mut PgConnection`, `AsyncPgConnection`,
//!   `PooledConnection<..>`, `Object<..>`, `&Pool<..>`, `&DbPool`, also in an
//!   `Arc` or a `Mutex`), or a `pool.get()` in the body, is a compile error,
//!   unless `outside_transaction = name` says it is intended. The attribute
//!   judges by names: a pool behind an alias or a struct with another name
//!   (`type Pools = Pool<..>`, `state: &AppState`), code inside macro calls,
//!   helper functions that open their own connection, and a handler called on
//!   connection `b` inside a transaction on connection `a` are not caught.
//!
//! The crate is split by job: `attr` parses the arguments, `validate`
//! checks the function and the id expression into a `model::Handler`, and
//! `expand` generates the code.

mod attr;
mod errors;
mod expand;
mod model;
mod render;
mod validate;

#[cfg(test)]
mod tests;

use proc_macro2::{Span, TokenStream};
use syn::ItemFn;

use crate::errors::Errors;

/// Implemented in the `inbox-macros` crate and re-exported by
/// `inbox-runtime`, the crate to depend on, whose documentation of
/// `inbox_runtime::idempotent` is the reference of the arguments:
/// <https://docs.rs/inbox-runtime/latest/inbox_runtime/attr.idempotent.html>.
#[proc_macro_attribute]
pub fn idempotent(
    args: proc_macro::TokenStream,
    item: proc_macro::TokenStream,
) -> proc_macro::TokenStream {
    idempotent_impl(args.into(), item.into()).into()
}

/// The attribute on `proc_macro2` tokens, so unit tests can call it.
///
/// On any error the function is emitted next to the errors, so one mistake in
/// the attribute does not also cause "cannot find function" errors wherever
/// the handler is called; its body starts by rebinding the connection as the
/// real expansion would lend it, so the body adds no type errors or warnings
/// of its own (`expand::fallback`).
fn idempotent_impl(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let args = attr::Args::parse(args, &mut errors);
    let Ok(function) = syn::parse2::<ItemFn>(item.clone()) else {
        errors.push(syn::Error::new(
            Span::call_site(),
            "`#[idempotent]` applies to a function with a body: a free function, or a method \
             in an `impl` block",
        ));
        return with_original(errors.to_compile_errors(), item);
    };
    match validate::handler(function, args, errors) {
        Ok(handler) => expand::handler(handler),
        Err(rejected) => with_original(
            rejected.error.to_compile_error(),
            expand::fallback(rejected.function, &rejected.shadows),
        ),
    }
}

/// `errors` followed by the item as the user wrote it.
fn with_original(mut errors: TokenStream, item: TokenStream) -> TokenStream {
    errors.extend(item);
    errors
}
