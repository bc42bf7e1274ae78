//! What a parameter's type looks like to the attribute: a Diesel connection,
//! a connection pool, or something else.
//!
//! A proc macro sees tokens, not types, so this judges by names, the way a
//! reader skimming the signature would:
//!
//! - a **connection** is a path type whose last segment ends in `Connection`
//!   (`PgConnection`, `SqliteConnection`, `MysqlConnection`,
//!   `AsyncPgConnection`, r2d2's and bb8's `PooledConnection<..>`),
//!   diesel-async's `SyncConnectionWrapper<..>`, deadpool's `Object<..>`
//!   (with generic arguments, or under a path with a `deadpool..` segment),
//!   a type parameter bounded by a `..Connection` trait (`C: Connection`,
//!   `C: AsyncConnection`), or `impl Connection`;
//! - a **pool** is a path type whose last segment is `Pool` (r2d2, deadpool,
//!   bb8, mobc), or ends in `Pool` after a database word (`DbPool`, `PgPool`,
//!   `ConnectionPool`, `SqlitePool`; not `ThreadPool`).
//!
//! What names cannot show is out of reach: a type alias with another name
//! (`type Pools = r2d2::Pool<..>`), a struct holding a pool, a pool in a
//! static. The checks built on this say so in their messages and docs.

use proc_macro2::Ident;
use syn::{
    GenericArgument, GenericParam, PathArguments, Signature, Type, TypeParamBound, WherePredicate,
};

/// What a type is, as far as names tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A Diesel connection (possibly pooled).
    Connection,
    /// A connection pool.
    Pool,
    /// Anything else (a message, a generic `C` without a connection bound, an alias).
    Other,
}

/// How a parameter holds its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// `&mut T`.
    MutRef,
    /// `&T`.
    SharedRef,
    /// `T`.
    Owned,
}

/// Classifies the types in one signature; knows its connection-bounded
/// type parameters.
pub(crate) struct Classifier {
    /// Type parameters with a `..Connection` trait bound, inline or in the
    /// `where` clause.
    connection_generics: Vec<Ident>,
}

impl Classifier {
    /// The classifier of `sig`'s types.
    pub(crate) fn of(sig: &Signature) -> Classifier {
        let mut connection_generics = Vec::new();
        for param in &sig.generics.params {
            if let GenericParam::Type(param) = param {
                if param.bounds.iter().any(is_connection_bound) {
                    connection_generics.push(param.ident.clone());
                }
            }
        }
        for predicate in sig.generics.where_clause.iter().flat_map(|w| &w.predicates) {
            if let WherePredicate::Type(predicate) = predicate {
                if let Type::Path(path) = peel(&predicate.bounded_ty) {
                    if let Some(ident) = path.path.get_ident() {
                        if predicate.bounds.iter().any(is_connection_bound) {
                            connection_generics.push(ident.clone());
                        }
                    }
                }
            }
        }
        Classifier {
            connection_generics,
        }
    }

    /// How `ty` is held, and what it holds (one reference peeled, nothing else).
    ///
    /// This is what connection detection needs: the runtime takes a `&mut`
    /// to a connection, or a connection by value, and nothing in between.
    pub(crate) fn shape(&self, ty: &Type) -> (Access, Kind) {
        match peel(ty) {
            Type::Reference(reference) => {
                let access = if reference.mutability.is_some() {
                    Access::MutRef
                } else {
                    Access::SharedRef
                };
                (access, self.kind(&reference.elem))
            }
            other => (Access::Owned, self.kind(other)),
        }
    }

    /// What `ty` gives access to, through references and the usual wrappers
    /// (`Arc`, `Rc`, `Box`, `Mutex`, `RwLock`, `RefCell`, `Option`):
    /// `&Arc<DbPool>` is a pool, `Arc<Mutex<PgConnection>>` a connection.
    pub(crate) fn reaches(&self, ty: &Type) -> Kind {
        match peel(ty) {
            Type::Reference(reference) => self.reaches(&reference.elem),
            Type::Path(path) if path.qself.is_none() => {
                let wrapped = path.path.segments.last().and_then(|last| {
                    let wrapper = matches!(
                        last.ident.to_string().as_str(),
                        "Arc" | "Rc" | "Box" | "Mutex" | "RwLock" | "RefCell" | "Option"
                    );
                    wrapper
                        .then(|| single_type_argument(&last.arguments))
                        .flatten()
                });
                match wrapped {
                    Some(inner) => self.reaches(inner),
                    None => self.kind(ty),
                }
            }
            other => self.kind(other),
        }
    }

    /// What `ty` itself is (no reference or wrapper peeled).
    fn kind(&self, ty: &Type) -> Kind {
        match peel(ty) {
            Type::Path(path) => {
                let segments = &path.path.segments;
                let Some(last) = segments.last() else {
                    return Kind::Other;
                };
                let name = last.ident.to_string();
                let deadpool = || {
                    segments
                        .iter()
                        .any(|segment| segment.ident.to_string().starts_with("deadpool"))
                };
                let bounded_generic = path.qself.is_none()
                    && segments.len() == 1
                    && self.connection_generics.contains(&last.ident);
                let pooled_object = name == "Object"
                    && (!matches!(last.arguments, PathArguments::None) || deadpool());
                if bounded_generic || is_connection_name(&name) || pooled_object {
                    Kind::Connection
                } else if is_pool_name(&name) {
                    Kind::Pool
                } else {
                    Kind::Other
                }
            }
            Type::ImplTrait(impl_trait) if impl_trait.bounds.iter().any(is_connection_bound) => {
                Kind::Connection
            }
            _ => Kind::Other,
        }
    }
}

/// `ty` without parentheses or invisible groups around it.
pub(crate) fn peel(ty: &Type) -> &Type {
    match ty {
        Type::Paren(inner) => peel(&inner.elem),
        Type::Group(inner) => peel(&inner.elem),
        other => other,
    }
}

/// Whether a type named `name` is a connection: `..Connection`, or
/// diesel-async's `SyncConnectionWrapper`.
fn is_connection_name(name: &str) -> bool {
    name.ends_with("Connection") || name == "SyncConnectionWrapper"
}

/// Whether `name` (a type, a variable or a field) names a connection pool:
/// `Pool`/`pool`, or a name ending in it after a database word (`DbPool`,
/// `PG_POOL`, `connection_pool`), but not `ThreadPool` or `worker_pool`.
pub(crate) fn is_pool_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase().replace('_', "");
    let Some(prefix) = lower.strip_suffix("pool") else {
        return false;
    };
    const DATABASE_WORDS: [&str; 8] = [
        "db", "database", "pg", "postgres", "sql", "maria", "conn", "diesel",
    ];
    prefix.is_empty() || DATABASE_WORDS.iter().any(|word| prefix.contains(word))
}

/// Whether `bound` is a trait whose last segment ends in `Connection`
/// (`Connection`, `AsyncConnection`, `R2D2Connection`, `LoadConnection`),
/// except r2d2's `ManageConnection`, which connection managers implement.
fn is_connection_bound(bound: &TypeParamBound) -> bool {
    match bound {
        TypeParamBound::Trait(bound) => bound.path.segments.last().is_some_and(|last| {
            let name = last.ident.to_string();
            name.ends_with("Connection") && name != "ManageConnection"
        }),
        _ => false,
    }
}

/// The `T` of `<T>`, if those are the only generic arguments.
fn single_type_argument(arguments: &PathArguments) -> Option<&Type> {
    let PathArguments::AngleBracketed(arguments) = arguments else {
        return None;
    };
    let mut types = arguments.args.iter().filter_map(|arg| match arg {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    });
    let first = types.next()?;
    types.next().is_none().then_some(first)
}

/// Whether a parameter's name or type name suggests a connection the
/// name-based detection did not recognize (an alias such as `Conn` or
/// `Pooled`, a parameter called `conn` or `db`). Used only to explain why no
/// connection was found, never to pick one.
pub(crate) fn suggests_connection(binding: Option<&Ident>, ty: &Type) -> bool {
    let by_binding = binding.is_some_and(|ident| {
        let name = ident.to_string().to_ascii_lowercase();
        let name = name.trim_start_matches('_');
        name.contains("conn") || matches!(name, "db" | "database" | "tx" | "txn")
    });
    let by_type = match peel(ty) {
        Type::Reference(reference) => last_name(&reference.elem),
        other => last_name(other),
    }
    .is_some_and(|name| name.contains("Conn") || name.contains("Pooled") || name == "Object");
    by_binding || by_type
}

/// The last path segment's name of a path type.
fn last_name(ty: &Type) -> Option<String> {
    match peel(ty) {
        Type::Path(path) => path.path.segments.last().map(|last| last.ident.to_string()),
        _ => None,
    }
}
