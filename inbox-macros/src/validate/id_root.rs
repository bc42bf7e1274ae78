//! Checks that the id expression is rooted in a message parameter.
//!
//! Deduplication only works on an id the producer assigned: a value the
//! consumer computes (`Uuid::new_v4()`, `now()`) differs on every delivery,
//! and a literal or a static is the same for every message. So the id must be
//! *read from* a handler parameter other than the connection.
//!
//! The root of an expression is found by walking through field accesses,
//! method-call receivers, index bases, `&`, `*`, parentheses, casts and `?`
//! down to a single identifier, which must be a parameter (or `self`).
//! `format!` is understood: each of its arguments must be rooted.

use proc_macro2::Ident;
use syn::punctuated::Punctuated;
use syn::visit::Visit;
use syn::{Expr, ExprMacro, FnArg, Lit, Signature, Token, UnOp};

use crate::errors::Errors;
use crate::render::code;

/// What the id expression may be rooted in.
pub(crate) struct Scope {
    /// Every name the parameter patterns bind (`msg`, or `id` in `Msg { id, .. }: Msg`).
    params: Vec<Ident>,
    /// Whether `self` is a parameter.
    has_receiver: bool,
    /// The connection parameter, which is not a message.
    conn: Option<Ident>,
}

impl Scope {
    /// The parameters of `sig`; `conn` is the connection parameter, if found.
    pub(crate) fn of(sig: &Signature, conn: Option<&Ident>) -> Scope {
        let mut collector = BindingCollector::default();
        for arg in &sig.inputs {
            if let FnArg::Typed(param) = arg {
                collector.visit_pat(&param.pat);
            }
        }
        Scope {
            params: collector.names,
            has_receiver: sig.receiver().is_some(),
            conn: conn.cloned(),
        }
    }

    /// A hint naming the parameters the id can be read from.
    fn hint(&self) -> String {
        let mut names: Vec<String> = Vec::new();
        if self.has_receiver {
            names.push("`self`".to_owned());
        }
        names.extend(
            self.params
                .iter()
                .filter(|name| self.conn.as_ref() != Some(*name))
                .map(|name| format!("`{name}`")),
        );
        if names.is_empty() {
            "this handler has no parameter besides the connection to read it from".to_owned()
        } else {
            format!("read it from {}", names.join(", "))
        }
    }
}

/// Collects the names bound by parameter patterns.
#[derive(Default)]
struct BindingCollector {
    names: Vec<Ident>,
}

impl<'ast> Visit<'ast> for BindingCollector {
    fn visit_pat_ident(&mut self, node: &'ast syn::PatIdent) {
        self.names.push(node.ident.clone());
        syn::visit::visit_pat_ident(self, node);
    }
}

/// Records an error for every part of `id` not rooted in a message parameter.
pub(crate) fn check(id: &Expr, scope: &Scope, errors: &mut Errors) {
    rooted(id, scope, errors);
}

/// The start of every id error.
const PREFIX: &str = "the message id must come from the message";

/// Whether `expr` is rooted in a message parameter; records why not if it is not.
fn rooted(expr: &Expr, scope: &Scope, errors: &mut Errors) -> bool {
    match expr {
        Expr::Path(path) if path.qself.is_none() && path.path.get_ident().is_some() => path
            .path
            .get_ident()
            .is_some_and(|ident| root_ident(ident, scope, errors)),
        Expr::Field(field) => rooted(&field.base, scope, errors),
        Expr::MethodCall(call) => rooted(&call.receiver, scope, errors),
        Expr::Index(index) => rooted(&index.expr, scope, errors),
        Expr::Reference(reference) => rooted(&reference.expr, scope, errors),
        Expr::Unary(unary) if matches!(unary.op, UnOp::Deref(_)) => {
            rooted(&unary.expr, scope, errors)
        }
        Expr::Paren(paren) => rooted(&paren.expr, scope, errors),
        Expr::Group(group) => rooted(&group.expr, scope, errors),
        Expr::Cast(cast) => rooted(&cast.expr, scope, errors),
        Expr::Try(try_expr) => rooted(&try_expr.expr, scope, errors),
        Expr::Macro(mac) if is_format(mac) => rooted_format(mac, scope, errors),
        other => {
            errors.push(unrooted(other));
            false
        }
    }
}

/// Checks a root identifier: a parameter other than the connection, or `self`.
fn root_ident(ident: &Ident, scope: &Scope, errors: &mut Errors) -> bool {
    let is_param = if ident == "self" {
        scope.has_receiver
    } else {
        scope.params.contains(ident)
    };
    let message = if scope.conn.as_ref() == Some(ident) {
        format!(
            "{PREFIX}: `{ident}` is the database connection, not the message; {}",
            scope.hint()
        )
    } else if !is_param {
        format!(
            "{PREFIX}: `{ident}` is not a parameter of this handler; a value from outside the \
             message (a static, a constant, a global) is not the message's own id; {}",
            scope.hint()
        )
    } else {
        return true;
    };
    errors.push(syn::Error::new(ident.span(), message));
    false
}

/// The error for an expression that cannot be rooted, by kind.
fn unrooted(expr: &Expr) -> syn::Error {
    let text = code(expr);
    let message = match expr {
        Expr::Lit(_) => format!(
            "{PREFIX}: `{text}` is a literal, and a literal is the same for every message, so \
             every message after the first would be skipped as a duplicate"
        ),
        Expr::Path(_) => format!(
            "{PREFIX}: `{text}` is a path to an item, not a handler parameter; a static or \
             constant is the same for every message, so every message after the first would be \
             skipped as a duplicate"
        ),
        Expr::Macro(_) => format!(
            "{PREFIX}: `{text}` is a macro call whose result the attribute cannot trace to a \
             handler parameter; read the id from the message (of macros, only `format!` with \
             explicit arguments is understood)"
        ),
        _ => format!(
            "{PREFIX}: `{text}` is not rooted in a handler parameter; deduplication must key on \
             a stable, producer-assigned id, and a value the consumer generates is different on \
             every delivery"
        ),
    };
    syn::Error::new_spanned(expr, message)
}

/// Whether `mac` is `format!` (also `std::format!`, `alloc::format!`).
pub(super) fn is_format(mac: &ExprMacro) -> bool {
    mac.mac
        .path
        .segments
        .last()
        .is_some_and(|last| last.ident == "format")
        && mac.mac.path.segments.iter().all(|segment| {
            matches!(
                segment.ident.to_string().as_str(),
                "std" | "alloc" | "format"
            )
        })
}

/// Checks `format!(fmt, args..)`: every argument rooted, at least one given.
fn rooted_format(mac: &ExprMacro, scope: &Scope, errors: &mut Errors) -> bool {
    let parsed = mac
        .mac
        .parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated);
    let Some(args) = errors.keep(parsed) else {
        return false;
    };
    let mut args = args.into_iter().peekable();
    // The format string itself is a literal by necessity.
    if matches!(args.peek(), Some(Expr::Lit(lit)) if matches!(lit.lit, Lit::Str(_))) {
        args.next();
    }
    let mut count = 0;
    let mut all_rooted = true;
    for arg in args {
        count += 1;
        // `name = value`: the value is what must be rooted.
        let value = match &arg {
            Expr::Assign(assign) => &*assign.right,
            other => other,
        };
        all_rooted &= rooted(value, scope, errors);
    }
    if count == 0 {
        errors.push(no_format_args(mac));
        return false;
    }
    all_rooted
}

/// The error for a `format!` without arguments.
fn no_format_args(mac: &ExprMacro) -> syn::Error {
    syn::Error::new_spanned(
        mac,
        format!(
            "{PREFIX}: this `format!` has no argument rooted in a handler parameter; inline \
             `{{name}}` captures in the format string are not checked, so pass the argument \
             explicitly, e.g. `format!(\"{{}}\", msg.id)`"
        ),
    )
}
