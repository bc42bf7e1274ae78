//! Finds the connection parameter: named by `conn = ...`, or detected.
//!
//! Detection takes the first `&mut T` parameter (receivers aside) and, failing
//! that, the first parameter taken by value whose type's last path segment
//! ends in `Connection` (`PgConnection`, `PooledConnection<..>`).

use proc_macro2::Ident;
use syn::spanned::Spanned;
use syn::{FnArg, Pat, PatIdent, PatType, Signature, Type};

use crate::errors::Errors;
use crate::model::{ConnPassing, Connection};

/// The connection parameter of `sig`, or `None` after recording why not.
pub(crate) fn find(
    sig: &Signature,
    requested: Option<&Ident>,
    errors: &mut Errors,
) -> Option<Connection> {
    let param = match requested {
        Some(name) => named(sig, name),
        None => detected(sig),
    };
    errors.keep(param.and_then(connection))
}

/// The typed parameters of `sig`, receivers left out.
fn typed_params(sig: &Signature) -> impl Iterator<Item = &PatType> {
    sig.inputs.iter().filter_map(|arg| match arg {
        FnArg::Typed(param) => Some(param),
        FnArg::Receiver(_) => None,
    })
}

/// `ty` without parentheses or invisible groups around it.
fn peel(ty: &Type) -> &Type {
    match ty {
        Type::Paren(inner) => peel(&inner.elem),
        Type::Group(inner) => peel(&inner.elem),
        other => other,
    }
}

/// The parameter `conn = name` names.
fn named<'a>(sig: &'a Signature, name: &Ident) -> syn::Result<&'a PatType> {
    if name == "self" {
        return Err(syn::Error::new(
            name.span(),
            "`self` cannot be the connection parameter: the body reaches the transaction's \
             connection through a parameter of its own; pass it as e.g. `conn: &mut PgConnection`",
        ));
    }
    let found = typed_params(sig).find(|param| match &*param.pat {
        Pat::Ident(binding) => binding.ident == *name,
        _ => false,
    });
    found.ok_or_else(|| {
        let names: Vec<String> = typed_params(sig)
            .filter_map(|param| match &*param.pat {
                Pat::Ident(binding) => Some(format!("`{}`", binding.ident)),
                _ => None,
            })
            .collect();
        let listed = if names.is_empty() {
            "it has no named parameter".to_owned()
        } else {
            format!("its parameters are {}", names.join(", "))
        };
        syn::Error::new(
            name.span(),
            format!(
                "`{name}` is not a parameter of this handler; `conn = ...` must name the \
                 connection parameter ({listed})"
            ),
        )
    })
}

/// The first `&mut T` parameter, else the first owned `..Connection` one.
fn detected(sig: &Signature) -> syn::Result<&PatType> {
    let by_mut_ref = typed_params(sig).find(|param| {
        matches!(peel(&param.ty), Type::Reference(reference) if reference.mutability.is_some())
    });
    let by_value = || typed_params(sig).find(|param| is_owned_connection(&param.ty));
    by_mut_ref.or_else(by_value).ok_or_else(|| {
        syn::Error::new(
            sig.paren_token.span.join(),
            "this handler has no connection parameter; the attribute needs the `&mut` Diesel \
             connection its body writes through (or name it with `conn = ...`)",
        )
    })
}

/// Whether `ty` is a path type whose last segment ends in `Connection`.
fn is_owned_connection(ty: &Type) -> bool {
    match peel(ty) {
        Type::Path(path) => path
            .path
            .segments
            .last()
            .is_some_and(|segment| segment.ident.to_string().ends_with("Connection")),
        _ => false,
    }
}

/// Checks that `param` can be lent to the transaction and says how.
fn connection(param: &PatType) -> syn::Result<Connection> {
    let binding = plain_binding(param)?;
    let passing = match peel(&param.ty) {
        Type::Reference(reference) if reference.mutability.is_some() => ConnPassing::Reborrow {
            mut_binding: binding.mutability.is_some(),
        },
        Type::Reference(reference) => {
            return Err(syn::Error::new(
                reference.span(),
                format!(
                    "the connection parameter `{}` is a shared reference; it must be `&mut` \
                     (or owned), since the transaction needs exclusive use of the connection",
                    binding.ident
                ),
            ))
        }
        _ if binding.mutability.is_some() => ConnPassing::BorrowBinding,
        _ => ConnPassing::MoveIntoLocal,
    };
    Ok(Connection {
        ident: binding.ident.clone(),
        passing,
    })
}

/// The `name` of a `name: T` or `mut name: T` parameter.
fn plain_binding(param: &PatType) -> syn::Result<&PatIdent> {
    match &*param.pat {
        Pat::Ident(binding) if binding.by_ref.is_none() && binding.subpat.is_none() => Ok(binding),
        pat => Err(syn::Error::new_spanned(
            pat,
            "the connection parameter must be a plain name such as `conn: &mut PgConnection`: \
             the body is given the transaction's connection under that name",
        )),
    }
}
