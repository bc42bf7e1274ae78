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
use syn::{Expr, ExprMacro, FnArg, Lit, Pat, Signature, Token, Type, UnOp};

use super::Subject;
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
    /// The first `name: Type` parameter besides the connection, with the
    /// name of its type (`msg`, `Payment` for `msg: &Payment`): the message
    /// an id is most likely read from.
    message: Option<(Ident, String)>,
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
        let message = sig.inputs.iter().find_map(|arg| match arg {
            FnArg::Typed(param) => match &*param.pat {
                Pat::Ident(binding) if conn != Some(&binding.ident) => {
                    Some((binding.ident.clone(), type_name(&param.ty)))
                }
                _ => None,
            },
            FnArg::Receiver(_) => None,
        });
        Scope {
            params: collector.names,
            has_receiver: sig.receiver().is_some(),
            conn: conn.cloned(),
            message,
        }
    }

    /// For an id the consumer makes up: where the producer's id would be
    /// read instead, as an example on the handler's own message parameter
    /// (`; read the id the producer set on the message instead, e.g. `id =
    /// msg.id` if `Payment` carries it in a field `id``). Empty without one.
    fn id_example(&self) -> String {
        match &self.message {
            Some((name, ty)) => format!(
                "; read the id the producer set on the message instead, e.g. `id = {name}.id` \
                 if `{ty}` carries it in a field `id`"
            ),
            None => String::new(),
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

/// The name a parameter's type reads as: its last path segment behind
/// references (`Payment` for `&Payment`), or the type as written.
fn type_name(ty: &Type) -> String {
    match ty {
        Type::Reference(reference) => type_name(&reference.elem),
        Type::Paren(paren) => type_name(&paren.elem),
        Type::Group(group) => type_name(&group.elem),
        Type::Path(path) => path
            .path
            .segments
            .last()
            .map_or_else(|| code(ty), |last| last.ident.to_string()),
        other => code(other),
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

/// Records an error for every part of `expr` (the id, or the fingerprinted
/// payload) not rooted in a message parameter.
pub(crate) fn check(expr: &Expr, scope: &Scope, subject: Subject, errors: &mut Errors) {
    Check { scope, subject }.rooted(expr, errors);
}

/// One expression's check.
struct Check<'a> {
    scope: &'a Scope,
    subject: Subject,
}

impl Check<'_> {
    /// Whether `expr` is rooted in a message parameter; records why not if it is not.
    fn rooted(&self, expr: &Expr, errors: &mut Errors) -> bool {
        match expr {
            Expr::Path(path) if path.qself.is_none() && path.path.get_ident().is_some() => path
                .path
                .get_ident()
                .is_some_and(|ident| self.root_ident(ident, errors)),
            Expr::Field(field) => self.rooted(&field.base, errors),
            Expr::MethodCall(call) => self.rooted(&call.receiver, errors),
            Expr::Index(index) => self.rooted(&index.expr, errors),
            Expr::Reference(reference) => self.rooted(&reference.expr, errors),
            Expr::Unary(unary) if matches!(unary.op, UnOp::Deref(_)) => {
                self.rooted(&unary.expr, errors)
            }
            Expr::Paren(paren) => self.rooted(&paren.expr, errors),
            Expr::Group(group) => self.rooted(&group.expr, errors),
            Expr::Cast(cast) => self.rooted(&cast.expr, errors),
            Expr::Try(try_expr) => self.rooted(&try_expr.expr, errors),
            Expr::Macro(mac) if is_format(mac) => self.rooted_format(mac, errors),
            other => {
                errors.push(self.unrooted(other));
                false
            }
        }
    }

    /// Checks a root identifier: a parameter other than the connection, or `self`.
    fn root_ident(&self, ident: &Ident, errors: &mut Errors) -> bool {
        let (scope, prefix) = (self.scope, self.subject.rooted_prefix());
        let is_param = if ident == "self" {
            scope.has_receiver
        } else {
            scope.params.contains(ident)
        };
        let message = if scope.conn.as_ref() == Some(ident) {
            format!(
                "{prefix}: `{ident}` is the database connection, not the message; {}",
                scope.hint()
            )
        } else if !is_param {
            format!(
                "{prefix}: `{ident}` is not a parameter of this handler; a value from outside the \
                 message (a static, a constant, a global) is not the message's own {}; {}",
                self.subject.noun(),
                scope.hint()
            )
        } else {
            return true;
        };
        errors.push(syn::Error::new(ident.span(), message));
        false
    }

    /// The error for an expression that cannot be rooted, by kind.
    fn unrooted(&self, expr: &Expr) -> syn::Error {
        let text = code(expr);
        let (prefix, if_constant) = (self.subject.rooted_prefix(), self.subject.if_constant());
        let message = match expr {
            Expr::Lit(_) => format!(
                "{prefix}: `{text}` is a literal, and a literal is the same for every message, so \
                 {if_constant}"
            ),
            Expr::Path(_) => format!(
                "{prefix}: `{text}` is a path to an item, not a handler parameter; a static or \
                 constant is the same for every message, so {if_constant}"
            ),
            Expr::Macro(_) => format!(
                "{prefix}: `{text}` is a macro call whose result the attribute cannot trace to a \
                 handler parameter; read the {} from the message (of macros, only `format!` with \
                 explicit arguments is understood)",
                self.subject.noun()
            ),
            _ => match self.subject {
                Subject::Id => format!(
                    "{prefix}: `{text}` is not rooted in a handler parameter; deduplication must key \
                     on a stable, producer-assigned id, and a value the consumer generates is \
                     different on every delivery{}",
                    self.scope.id_example()
                ),
                Subject::Fingerprint => format!(
                    "{prefix}: `{text}` is not rooted in a handler parameter; a value the consumer \
                     computes may differ on every delivery, {}",
                    self.subject.if_per_delivery()
                ),
            },
        };
        syn::Error::new_spanned(expr, message)
    }

    /// Checks `format!(fmt, args..)`: every argument rooted, at least one given.
    fn rooted_format(&self, mac: &ExprMacro, errors: &mut Errors) -> bool {
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
            all_rooted &= self.rooted(value, errors);
        }
        if count == 0 {
            errors.push(self.no_format_args(mac));
            return false;
        }
        all_rooted
    }

    /// The error for a `format!` without arguments.
    fn no_format_args(&self, mac: &ExprMacro) -> syn::Error {
        syn::Error::new_spanned(
            mac,
            format!(
                "{}: this `format!` has no argument rooted in a handler parameter; inline \
                 `{{name}}` captures in the format string are not checked, so pass the argument \
                 explicitly, e.g. `format!(\"{{}}\", msg.id)`",
                self.subject.rooted_prefix()
            ),
        )
    }
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
