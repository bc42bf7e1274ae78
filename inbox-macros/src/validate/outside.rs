//! Refuses handlers that can write outside their own transaction: a second
//! connection or a pool among the parameters, or a connection taken from a
//! pool inside the body.
//!
//! Only the connection parameter is the transaction's connection. Anything
//! written through another connection commits on its own: it is not rolled
//! back when the handler fails, and it is written again when the message is
//! redelivered, which is exactly what the attribute exists to prevent. So
//! these are compile errors, each at the parameter or call, unless the
//! handler says the second connection is intended with `outside_transaction
//! = name` (a read replica, an audit log that must survive a rollback).
//!
//! What is checked, judged by names as `kind` describes:
//!
//! - every parameter other than the connection whose type is a connection or
//!   a pool, also behind `&`, `&mut`, `Arc`, `Box`, `Mutex` and the like
//!   (`&mut PgConnection`, `AsyncPgConnection`, `PooledConnection<..>`,
//!   `Object<..>`, `&DbPool`, `Arc<r2d2::Pool<..>>`, `&mut C` with `C:
//!   Connection`);
//! - in the body, `.get()` (and r2d2's, deadpool's and bb8's other checkout
//!   methods) on something named like a pool: `pool.get()`,
//!   `self.db_pool.get()`, `POOL.get()`.
//!
//! What is not: a pool or connection behind a type alias or struct whose
//! name says nothing (`type Pools = Pool<..>`, `state: &AppState` holding a
//! pool), code inside macro calls in the body (`tokio::join!(..)`), helper
//! functions that take a connection of their own (`establish_connection()`),
//! and a handler called on connection `b` inside a transaction the caller
//! opened on connection `a`. Those remain the caller's responsibility; the
//! documentation of `inbox_runtime` says so.

use proc_macro2::Ident;
use syn::visit::Visit;
use syn::{Block, Expr, ExprMethodCall, Item, Member, Pat, Signature};

use crate::errors::Errors;
use crate::render::code;
use crate::validate::connection::typed_params;
use crate::validate::kind::{Classifier, Kind, is_pool_name};

/// The methods that check a connection out of a pool: r2d2 (`get`,
/// `try_get`, `get_timeout`), deadpool (`get`, `timeout_get`), bb8 (`get`,
/// `get_owned`, `dedicated_connection`).
const CHECKOUT_METHODS: [&str; 6] = [
    "get",
    "try_get",
    "get_timeout",
    "timeout_get",
    "get_owned",
    "dedicated_connection",
];

/// What the handler is allowed to reach, and what it writes through.
pub(crate) struct Context<'a> {
    /// The handler's connection parameter, if found.
    pub(crate) connection: Option<&'a Ident>,
    /// Whether the attribute chose the connection itself (the first
    /// connection parameter), rather than `conn = ...`.
    pub(crate) detected: bool,
    /// Positions in `sig.inputs` already accounted for (the connection, and
    /// parameters already reported as a wrong connection).
    pub(crate) claimed: &'a [usize],
    /// The names given in `outside_transaction = ...`.
    pub(crate) allowed: &'a [Ident],
}

/// Records an error for every second connection or pool in `sig` and every
/// pool checkout in `body` that `outside_transaction` does not allow, and
/// for every name in `outside_transaction` that matches nothing.
pub(crate) fn check(
    sig: &Signature,
    body: &Block,
    classifier: &Classifier,
    context: &Context,
    errors: &mut Errors,
) {
    let mut matched: Vec<&Ident> = Vec::new();
    let mut param_names: Vec<&Ident> = Vec::new();
    // Parameters whose checkouts in the body are covered by what is said
    // about the parameter itself (an error, or `outside_transaction`).
    let mut covered: Vec<&Ident> = Vec::new();
    for (index, param) in typed_params(sig) {
        let name = match &*param.pat {
            Pat::Ident(binding) => Some(&binding.ident),
            _ => None,
        };
        param_names.extend(name);
        if context.claimed.contains(&index) {
            covered.extend(name);
            continue;
        }
        let kind = classifier.reaches(&param.ty);
        // Without a connection (`conn = ...` names nothing), a connection
        // parameter is more likely the one meant than a second one.
        if kind == Kind::Other || (kind == Kind::Connection && context.connection.is_none()) {
            continue;
        }
        covered.extend(name);
        if let Some(allowed) = name.and_then(|name| context.allowed.iter().find(|a| *a == name)) {
            matched.push(allowed);
            continue;
        }
        let what = match kind {
            Kind::Pool => "a connection pool",
            _ => "a second database connection",
        };
        errors.push(syn::Error::new_spanned(
            param,
            format!(
                "`{}` is {what} (`{}`): {}",
                name.map_or_else(|| code(&param.pat), Ident::to_string),
                code(&param.ty),
                consequence(kind, context.connection, name),
            ) + &other_choice(kind, context, name),
        ));
    }

    let mut checkouts = Checkouts::default();
    checkouts.visit_block(body);
    for (call, name) in checkouts.found {
        if let Some(allowed) = context.allowed.iter().find(|a| **a == name) {
            matched.push(allowed);
            continue;
        }
        // A pool parameter is reported (or allowed) at the parameter.
        if covered.iter().any(|param| **param == name) {
            continue;
        }
        errors.push(syn::Error::new_spanned(
            call,
            format!(
                "`{}` takes another connection from a pool: {}",
                code(call),
                consequence(Kind::Connection, context.connection, Some(&name))
            ),
        ));
    }

    for allowed in context.allowed {
        if context.connection == Some(allowed) {
            errors.push(syn::Error::new(
                allowed.span(),
                format!(
                    "`{allowed}` is the handler's connection, on which its transaction runs; \
                     `outside_transaction` lists the other connections or pools the body uses"
                ),
            ));
        } else if !matched.contains(&allowed) && !param_names.contains(&allowed) {
            errors.push(syn::Error::new(
                allowed.span(),
                format!(
                    "`{allowed}` in `outside_transaction` is neither a parameter of this handler \
                     nor a pool the body takes a connection from (`{allowed}.get()`); list the \
                     names of the connections or pools that are meant to write outside the \
                     handler's transaction"
                ),
            ));
        }
    }
}

/// Why a second connection is refused, and what to do instead.
fn consequence(kind: Kind, connection: Option<&Ident>, name: Option<&Ident>) -> String {
    let it = match kind {
        Kind::Pool => "a connection taken from it",
        _ => "it",
    };
    let through = connection.map_or_else(
        || "the handler's connection parameter".to_owned(),
        |conn| format!("`{conn}`"),
    );
    let opt_out = name.map_or_else(
        || "name it and list it in `outside_transaction = ...`".to_owned(),
        |name| format!("say so with `#[idempotent(outside_transaction = {name}, ..)]`"),
    );
    format!(
        "what the body writes through {it} is not part of this handler's transaction, so it is \
         not rolled back when the handler fails and is written again when the message is \
         redelivered; write through {through} only, or, if reaching outside the transaction is \
         intended (a read replica, an audit record that must survive a rollback), {opt_out}"
    )
}

/// When the attribute took the first of two connection parameters as the
/// handler's and the second is named like the handler's connection while
/// the first is not (`audit: &mut PgConnection, conn: &mut PgConnection`):
/// how to name the second instead. Empty otherwise.
fn other_choice(kind: Kind, context: &Context, name: Option<&Ident>) -> String {
    match (kind, context.detected, context.connection, name) {
        (Kind::Connection, true, Some(first), Some(name))
            if named_like_a_connection(name) && !named_like_a_connection(first) =>
        {
            format!(
                "; the attribute took `{first}`, the first connection parameter, as the \
                 handler's connection: if `{name}` is the one the handler writes through, \
                 name it with `#[idempotent(conn = {name}, ..)]` (and list `{first}` in \
                 `outside_transaction` if it is meant to reach outside)"
            )
        }
        _ => String::new(),
    }
}

/// Whether a parameter's name reads as a handler's connection (`conn`,
/// `db_conn`, `connection`, `db`, `tx`).
fn named_like_a_connection(name: &Ident) -> bool {
    let name = name.to_string().to_ascii_lowercase();
    let name = name.trim_start_matches('_');
    name.contains("conn") || matches!(name, "db" | "database" | "tx" | "txn")
}

/// The pool checkouts in a body: `pool.get()` and the like, with the pool's name.
#[derive(Default)]
struct Checkouts<'ast> {
    found: Vec<(&'ast ExprMethodCall, Ident)>,
}

impl<'ast> Visit<'ast> for Checkouts<'ast> {
    fn visit_expr_method_call(&mut self, call: &'ast ExprMethodCall) {
        let is_checkout = CHECKOUT_METHODS.iter().any(|method| call.method == method);
        if is_checkout {
            if let Some(name) = receiver_name(&call.receiver) {
                if is_pool_name(&name.to_string()) {
                    self.found.push((call, name));
                }
            }
        }
        syn::visit::visit_expr_method_call(self, call);
    }

    /// Items nested in the body (`fn helper(..)`) are not the handler's code.
    fn visit_item(&mut self, _: &'ast Item) {}
}

/// The name a receiver ends in: `pool`, `self.pool`, `state.db_pool()`, `POOL`.
fn receiver_name(receiver: &Expr) -> Option<Ident> {
    match receiver {
        Expr::Path(path) if path.qself.is_none() => {
            path.path.segments.last().map(|last| last.ident.clone())
        }
        Expr::Field(field) => match &field.member {
            Member::Named(ident) => Some(ident.clone()),
            Member::Unnamed(_) => None,
        },
        Expr::MethodCall(call) if call.args.is_empty() => Some(call.method.clone()),
        Expr::Reference(reference) => receiver_name(&reference.expr),
        Expr::Paren(paren) => receiver_name(&paren.expr),
        Expr::Group(group) => receiver_name(&group.expr),
        _ => None,
    }
}
