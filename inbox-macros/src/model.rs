//! The validated description of one handler, which `expand` turns into code.

use proc_macro2::Ident;
use syn::{Expr, ItemFn, LitStr, Path, Type};

/// How the handler's body runs: decides which runtime entry point the
/// expansion calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// A plain `fn`: the body runs in a closure passed to `run_sync`.
    Sync,
    /// An `async fn`: the runtime's steps (`begin_async`, the body,
    /// `finish_async`) are written out in the handler's body.
    Async,
}

/// How the connection parameter is lent to the runtime for the transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnPassing {
    /// `conn: &mut T`: reborrowed as `&mut *conn`. `mut_binding` is set for
    /// `mut conn: &mut T`, whose `mut` the closure parameter keeps.
    Reborrow {
        /// Whether the user wrote `mut conn`.
        mut_binding: bool,
    },
    /// `mut conn: T` (an owned connection, e.g. a pooled one): `&mut conn`.
    BorrowBinding,
    /// `conn: T` without `mut`: moved into a hygienic `let mut` local first,
    /// so the user's binding needs no `mut` (and gets no `unused_mut`).
    MoveIntoLocal,
}

/// The handler parameter the body writes through.
#[derive(Clone, Debug)]
pub(crate) struct Connection {
    /// The parameter's name, with the user's span; the closure parameter
    /// reuses it so the body only reaches the transaction's connection.
    pub(crate) ident: Ident,
    /// How it is lent to the runtime.
    pub(crate) passing: ConnPassing,
}

/// How the body sees a parameter meant as the connection, in the function
/// the attribute emits after an error (see `expand::fallback`).
#[derive(Clone, Debug)]
pub(crate) enum View {
    /// Lent as in the real expansion: `conn` is a `&mut` to the owned value.
    Lent(ConnPassing),
    /// A shared reference the transaction cannot use: `conn` is rebound to a
    /// `&mut` of this type that never exists at run time, so the body
    /// type-checks as it would once the parameter is fixed.
    Unreachable(Box<Type>),
}

/// A parameter rebound at the start of the fallback body.
#[derive(Clone, Debug)]
pub(crate) struct Shadow {
    /// The parameter's name.
    pub(crate) ident: Ident,
    /// What the body sees under that name.
    pub(crate) view: View,
}

/// Everything the expansion needs, checked.
pub(crate) struct Handler {
    /// The function as the user wrote it.
    pub(crate) function: ItemFn,
    /// Sync or async.
    pub(crate) flavor: Flavor,
    /// The connection parameter.
    pub(crate) connection: Connection,
    /// The id expression, rooted in a message parameter.
    pub(crate) id: Expr,
    /// The explicit handler name, if `handler = "..."` was given.
    pub(crate) handler_name: Option<LitStr>,
    /// The path of the runtime crate (`::inbox_runtime` unless overridden).
    pub(crate) krate: Path,
    /// The declared return type (for `async fn`, the future's output).
    pub(crate) output: Type,
    /// `max_attempts = ...`, if given.
    pub(crate) max_attempts: Option<crate::attr::MaxAttempts>,
    /// `claim_wait = ...`, if given.
    pub(crate) claim_wait: Option<crate::attr::ClaimWait>,
    /// `fingerprint = ...`: the payload expression, rooted in a message
    /// parameter.
    pub(crate) fingerprint: Option<Expr>,
    /// `trace = ...`: the incoming `traceparent` the body's outgoing
    /// messages continue.
    pub(crate) trace: Option<Expr>,
    /// `store_result`: the body's result is stored and replayed.
    pub(crate) store_result: bool,
    /// `shared_scope`: the scope is shared with other handlers on purpose.
    pub(crate) shared_scope: bool,
}
