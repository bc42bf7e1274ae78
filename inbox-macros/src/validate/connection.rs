//! Finds the connection parameter: named by `conn = ...`, or detected.
//!
//! Detection, judged by the parameters' types as written (see `kind`):
//!
//! 1. the first `&mut` parameter whose type is a connection (`&mut
//!    PgConnection`, `&mut PooledConnection<..>`, `&mut C` with `C:
//!    Connection`), else the first connection taken by value
//!    (`PooledConnection<..>`, deadpool's `Object<..>`);
//! 2. otherwise, unless a parameter looks like a connection held by shared
//!    reference, the first `&mut` parameter of any type other than a pool
//!    (an alias such as `&mut Pooled`, a `&mut C` bounded elsewhere).
//!
//! When nothing is found, each parameter that looks like it was meant to be
//! the connection gets an error of its own saying what is wrong with it: a
//! shared reference (`&PgConnection`), a pool (`&DbPool`), or an owned value
//! whose type the attribute cannot see through (`conn: Conn`, an alias: name
//! it with `conn = conn`). Only when no parameter looks like one is the error
//! "this handler has no connection parameter".

use proc_macro2::Ident;
use syn::{FnArg, Pat, PatIdent, PatType, Signature, Type};

use crate::errors::Errors;
use crate::model::{ConnPassing, Connection, Shadow, View};
use crate::render::code;
use crate::validate::kind::{Access, Classifier, Kind, peel, suggests_connection};

/// What the search for the connection parameter found.
#[derive(Default)]
pub(crate) struct Found {
    /// The connection parameter, if one was found and can be lent.
    pub(crate) connection: Option<Connection>,
    /// The positions in `sig.inputs` of the connection and of every
    /// parameter already reported as a wrong connection, which the
    /// second-connection check leaves alone.
    pub(crate) claimed: Vec<usize>,
    /// How the body would see the parameters that were meant as the
    /// connection; used to emit the function after an error without a
    /// cascade of type errors from the body (see `expand::fallback`).
    pub(crate) shadows: Vec<Shadow>,
}

/// Finds the connection parameter of `sig`, recording what is wrong if it
/// cannot be found or used.
pub(crate) fn find(
    sig: &Signature,
    requested: Option<&Ident>,
    classifier: &Classifier,
    errors: &mut Errors,
) -> Found {
    let chosen = match requested {
        Some(name) => errors.keep(named(sig, name)),
        None => match detected(sig, classifier) {
            Ok(chosen) => Some(chosen),
            Err(found) => {
                for error in found.errors {
                    errors.push(error);
                }
                return Found {
                    connection: None,
                    claimed: found.claimed,
                    shadows: found.shadows,
                };
            }
        },
    };
    let Some((index, param)) = chosen else {
        return Found::default();
    };
    let mut found = Found {
        claimed: vec![index],
        ..Found::default()
    };
    if classifier.shape(&param.ty).1 == Kind::Pool {
        errors.push(pool_as_connection(param));
        return found;
    }
    match connection(param) {
        Ok(connection) => {
            if let ConnPassing::BorrowBinding | ConnPassing::MoveIntoLocal = connection.passing {
                found.shadows.push(Shadow {
                    ident: connection.ident.clone(),
                    view: View::Lent(connection.passing),
                });
            }
            found.connection = Some(connection);
        }
        Err(error) => {
            if let Some(shadow) = shared_shadow(param) {
                found.shadows.push(shadow);
            }
            errors.push(error);
        }
    }
    found
}

/// The typed parameters of `sig` with their positions, receivers left out.
pub(crate) fn typed_params(sig: &Signature) -> impl Iterator<Item = (usize, &PatType)> {
    sig.inputs
        .iter()
        .enumerate()
        .filter_map(|(index, arg)| match arg {
            FnArg::Typed(param) => Some((index, param)),
            FnArg::Receiver(_) => None,
        })
}

/// The parameter `conn = name` names.
fn named<'a>(sig: &'a Signature, name: &Ident) -> syn::Result<(usize, &'a PatType)> {
    if name == "self" {
        return Err(syn::Error::new(
            name.span(),
            "`self` cannot be the connection parameter: the body reaches the transaction's \
             connection through a parameter of its own; pass it as e.g. `conn: &mut PgConnection`",
        ));
    }
    let found = typed_params(sig).find(|(_, param)| match &*param.pat {
        Pat::Ident(binding) => binding.ident == *name,
        _ => false,
    });
    found.ok_or_else(|| {
        let names: Vec<String> = typed_params(sig)
            .filter_map(|(_, param)| match &*param.pat {
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

/// Why detection found no connection: one error per parameter that looks
/// meant as one.
struct NotFound {
    errors: Vec<syn::Error>,
    claimed: Vec<usize>,
    shadows: Vec<Shadow>,
}

/// The detected connection parameter (see the module documentation).
fn detected<'a>(
    sig: &'a Signature,
    classifier: &Classifier,
) -> Result<(usize, &'a PatType), NotFound> {
    let shaped: Vec<(usize, &PatType, Access, Kind)> = typed_params(sig)
        .map(|(index, param)| {
            let (access, kind) = classifier.shape(&param.ty);
            (index, param, access, kind)
        })
        .collect();
    let first = |wanted: &dyn Fn(Access, Kind) -> bool| {
        shaped
            .iter()
            .find(|(_, _, access, kind)| wanted(*access, *kind))
            .map(|(index, param, _, _)| (*index, *param))
    };
    if let Some(found) = first(&|access, kind| access == Access::MutRef && kind == Kind::Connection)
        .or_else(|| first(&|access, kind| access == Access::Owned && kind == Kind::Connection))
    {
        return Ok(found);
    }
    let shared: Vec<_> = shaped
        .iter()
        .filter(|(_, param, access, kind)| {
            *access == Access::SharedRef
                && (*kind == Kind::Connection || suggests_connection(binding(param), &param.ty))
        })
        .collect();
    if shared.is_empty() {
        if let Some(found) = first(&|access, kind| access == Access::MutRef && kind != Kind::Pool) {
            return Ok(found);
        }
    }

    let mut not_found = NotFound {
        errors: Vec::new(),
        claimed: Vec::new(),
        shadows: Vec::new(),
    };
    let unrecognized = |access: Access, kind: Kind, param: &PatType| {
        access == Access::Owned
            && kind != Kind::Pool
            && suggests_connection(binding(param), &param.ty)
    };
    // A pool is reported as the connection that is missing only if nothing
    // else looks like one; otherwise it is a second connection, which the
    // `outside` check reports.
    let pool_meant = shared.is_empty()
        && !shaped
            .iter()
            .any(|(_, param, access, kind)| unrecognized(*access, *kind, param));
    for (index, param, access, kind) in &shaped {
        let error = if shared.iter().any(|(other, ..)| other == index) {
            not_found.shadows.extend(shared_shadow(param));
            shared_reference(param)
        } else if *kind == Kind::Pool && pool_meant {
            pool_as_connection(param)
        } else if unrecognized(*access, *kind, param) {
            if let Some(binding) = binding(param) {
                not_found.shadows.push(Shadow {
                    ident: binding.clone(),
                    view: View::Lent(owned_passing(param)),
                });
            }
            unrecognized_owned(param)
        } else {
            continue;
        };
        not_found.claimed.push(*index);
        not_found.errors.push(error);
    }
    if not_found.errors.is_empty() {
        not_found.errors.push(syn::Error::new(
            sig.paren_token.span.join(),
            "this handler has no connection parameter; the attribute needs the `&mut` Diesel \
             connection its body writes through (or name it with `conn = ...`)",
        ));
    }
    Err(not_found)
}

/// The name of a `name: T` parameter.
fn binding(param: &PatType) -> Option<&Ident> {
    match &*param.pat {
        Pat::Ident(binding) => Some(&binding.ident),
        _ => None,
    }
}

/// How an owned connection is lent: `&mut conn` if the binding is `mut`,
/// else moved into a local first.
fn owned_passing(param: &PatType) -> ConnPassing {
    match &*param.pat {
        Pat::Ident(binding) if binding.mutability.is_some() => ConnPassing::BorrowBinding,
        _ => ConnPassing::MoveIntoLocal,
    }
}

/// Checks that `param` can be lent to the transaction and says how.
fn connection(param: &PatType) -> syn::Result<Connection> {
    let binding = plain_binding(param)?;
    let passing = match peel(&param.ty) {
        Type::Reference(reference) if reference.mutability.is_some() => ConnPassing::Reborrow {
            mut_binding: binding.mutability.is_some(),
        },
        Type::Reference(_) => return Err(shared_reference(param)),
        _ => owned_passing(param),
    };
    Ok(Connection {
        ident: binding.ident.clone(),
        passing,
    })
}

/// The error for a connection parameter held by shared reference.
fn shared_reference(param: &PatType) -> syn::Error {
    let name = code(&param.pat);
    let (written, fixed) = match peel(&param.ty) {
        Type::Reference(reference) => {
            let mut fixed = reference.clone();
            fixed.mutability = Some(Default::default());
            (code(reference), code(&fixed))
        }
        other => (code(other), code(other)),
    };
    syn::Error::new_spanned(
        &param.ty,
        format!(
            "the connection parameter `{name}` is a shared reference (`{written}`); it must be \
             `&mut` (or owned), since the transaction needs exclusive use of the connection: \
             write `{name}: {fixed}`"
        ),
    )
}

/// The body's view of a connection held by shared reference, as if it were
/// `&mut` (the fallback never runs: it only keeps the body type-checking).
fn shared_shadow(param: &PatType) -> Option<Shadow> {
    let Type::Reference(reference) = peel(&param.ty) else {
        return None;
    };
    let contains_impl = code(&reference.elem).contains("impl ");
    let ident = binding(param)?.clone();
    (!contains_impl).then(|| Shadow {
        ident,
        view: View::Unreachable(reference.elem.clone()),
    })
}

/// The error for a pool where the connection should be.
fn pool_as_connection(param: &PatType) -> syn::Error {
    syn::Error::new_spanned(
        param,
        format!(
            "`{}` is a connection pool (`{}`), not a connection: the handler's transaction runs \
             on one connection, and its effects must be written through it; take the connection \
             from the pool where you call the handler and pass it, e.g. `conn: &mut \
             PooledConnection<..>` called as `handler(&mut pool.get()?, &msg)`",
            code(&param.pat),
            code(&param.ty)
        ),
    )
}

/// The error for an owned parameter that may be a connection behind a type
/// alias.
fn unrecognized_owned(param: &PatType) -> syn::Error {
    let name = code(&param.pat);
    let ty = code(&param.ty);
    let named = binding(param).map_or_else(|| "conn = ...".to_owned(), |b| format!("conn = {b}"));
    syn::Error::new_spanned(
        param,
        format!(
            "this handler has no connection parameter the attribute recognizes; `{name}: {ty}` \
             may be one behind a type alias, which the attribute cannot see through (it detects \
             `&mut` parameters and owned types named `..Connection` or deadpool's `Object<..>`): \
             if `{name}` is the connection, name it with `#[idempotent({named}, ..)]`; if not, \
             add the `&mut` Diesel connection the body writes through"
        ),
    )
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
