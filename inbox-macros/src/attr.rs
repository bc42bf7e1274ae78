//! Parses the attribute's arguments: `id`, `handler`, `conn`, `crate`,
//! `outside_transaction`, `max_attempts`, `claim_wait`, `fingerprint`,
//! `trace`, `store_result` and `shared_scope` (documented for users on
//! `inbox_runtime::idempotent`).
//!
//! Every argument is `name = value`, separated by commas, except the flags
//! `store_result` and `shared_scope`. The parser never
//! stops at the first mistake: a bad argument is recorded and skipped up to
//! the next comma, so all mistakes of one attribute are reported together.

use proc_macro2::{Ident, Span, TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Expr, ExprLit, Lit, LitStr, Path, Token};

use crate::errors::Errors;

/// The longest handler name the inbox table stores, in bytes.
pub(crate) const MAX_HANDLER_BYTES: usize = 255;

/// The arguments of one `#[idempotent(...)]`, each present if given and valid.
#[derive(Default)]
pub(crate) struct Args {
    /// `id = msg.id` or `id = "msg.id"`: the expression of the message id.
    pub(crate) id: Option<Expr>,
    /// `handler = "billing.apply_payment"`: the deduplication scope.
    pub(crate) handler: Option<LitStr>,
    /// Whether `handler = ...` was written, valid or not (an invalid one is
    /// already reported, and is not also reported as missing).
    pub(crate) handler_given: bool,
    /// `conn = name`: the connection parameter, instead of detecting it.
    pub(crate) conn: Option<Ident>,
    /// `crate = "path"`: where `inbox_runtime` is, for a renamed dependency.
    pub(crate) krate: Option<Path>,
    /// `outside_transaction = audit_pool` or `= [audit_pool, replica]`: the
    /// connections or pools the body may use besides its connection, on
    /// purpose (see `validate::outside`).
    pub(crate) outside_transaction: Vec<Ident>,
    /// `max_attempts = 5` or `max_attempts = unbounded`: the handler's limit
    /// of failed attempts, instead of the runtime's default.
    pub(crate) max_attempts: Option<MaxAttempts>,
    /// `claim_wait = "2s"` or `claim_wait = unbounded`: how long the claim
    /// waits for a delivery of the same id in flight.
    pub(crate) claim_wait: Option<ClaimWait>,
    /// `fingerprint = msg.body`: the payload whose fingerprint is stored
    /// with the claim and compared on duplicates.
    pub(crate) fingerprint: Option<Expr>,
    /// `trace = msg.traceparent`: the incoming message's W3C trace context
    /// header, which the messages the body sends continue.
    pub(crate) trace: Option<Expr>,
    /// `store_result` (a flag, at its span): the body's result is stored
    /// with the claim and returned to duplicates.
    pub(crate) store_result: Option<Span>,
    /// `shared_scope` (a flag, at its span): other handlers declare this
    /// handler's scope too, on purpose.
    pub(crate) shared_scope: Option<Span>,
}

impl Args {
    /// Parses `tokens` (what is inside the attribute's parentheses).
    ///
    /// Mistakes go to `errors`; the arguments that were valid are returned.
    /// A missing `id` is an error, reported at the attribute.
    pub(crate) fn parse(tokens: TokenStream, errors: &mut Errors) -> Args {
        let mut args = Args::default();
        let mut seen: Vec<String> = Vec::new();
        let parser = |input: ParseStream| {
            parse_list(input, &mut args, &mut seen, errors);
            Ok(())
        };
        // `parse_list` consumes every token, so this cannot fail; keep any error anyway.
        let result = parser.parse2(tokens);
        errors.keep(result);
        args.handler_given = seen.iter().any(|name| name == "handler");
        if args.id.is_none() && !seen.iter().any(|name| name == "id") {
            errors.push(syn::Error::new(
                Span::call_site(),
                "missing `id = ...`: the attribute needs the expression of the message's \
                 producer-assigned id, e.g. `#[idempotent(id = msg.id)]`",
            ));
        }
        args
    }
}

/// Parses `name = value, ...` until the end of `input`, recording mistakes.
fn parse_list(input: ParseStream, args: &mut Args, seen: &mut Vec<String>, errors: &mut Errors) {
    while !input.is_empty() {
        if let Err(error) = parse_one(input, args, seen, errors) {
            errors.push(error);
            skip_to_comma(input);
        }
        if input.is_empty() {
            break;
        }
        if let Err(error) = input.parse::<Token![,]>() {
            errors.push(error);
            skip_to_comma(input);
            let _ = input.parse::<Option<Token![,]>>();
        }
    }
}

/// Skips tokens up to (not including) the next top-level comma.
fn skip_to_comma(input: ParseStream) {
    let _ = input.step(|cursor| {
        let mut rest = *cursor;
        while let Some((tree, next)) = rest.token_tree() {
            if matches!(&tree, TokenTree::Punct(punct) if punct.as_char() == ',') {
                break;
            }
            rest = next;
        }
        Ok(((), rest))
    });
}

/// Parses one `name = value` and stores it in `args`.
///
/// On an error the caller skips the rest of the argument, value included.
fn parse_one(
    input: ParseStream,
    args: &mut Args,
    seen: &mut Vec<String>,
    errors: &mut Errors,
) -> syn::Result<()> {
    let name = if input.peek(Token![crate]) {
        let token: Token![crate] = input.parse()?;
        Ident::new("crate", token.span)
    } else {
        input.call(Ident::parse_any)?
    };
    let key = name.to_string();
    if !matches!(
        key.as_str(),
        "id" | "handler"
            | "conn"
            | "crate"
            | "outside_transaction"
            | "max_attempts"
            | "claim_wait"
            | "fingerprint"
            | "trace"
            | "store_result"
            | "shared_scope"
    ) {
        return Err(syn::Error::new(
            name.span(),
            format!(
                "unknown argument `{key}`; `#[idempotent]` takes `id`, `handler`, `conn`, \
                 `max_attempts`, `claim_wait`, `fingerprint`, `trace`, `store_result`, \
                 `shared_scope`, `crate` and `outside_transaction`"
            ),
        ));
    }
    if seen.contains(&key) {
        return Err(syn::Error::new(
            name.span(),
            format!("duplicate argument `{key}`: each argument may be given only once"),
        ));
    }
    seen.push(key.clone());
    if key == "store_result" || key == "shared_scope" {
        if input.peek(Token![=]) {
            return Err(syn::Error::new(
                name.span(),
                format!("`{key}` is a flag and takes no value: write `{key}` on its own"),
            ));
        }
        if key == "store_result" {
            args.store_result = Some(name.span());
        } else {
            args.shared_scope = Some(name.span());
        }
        return Ok(());
    }
    if !input.peek(Token![=]) {
        return Err(syn::Error::new(
            name.span(),
            format!("`{key}` needs a value: write `{key} = ...`"),
        ));
    }
    input.parse::<Token![=]>()?;
    let value: Expr = input.parse()?;

    match key.as_str() {
        "id" => args.id = errors.keep(id_expr(value)),
        "handler" => args.handler = errors.keep(handler_name(value)),
        "conn" => args.conn = errors.keep(conn_name(value)),
        "outside_transaction" => args.outside_transaction = outside_names(value, errors),
        "max_attempts" => args.max_attempts = errors.keep(max_attempts(value)),
        "claim_wait" => args.claim_wait = errors.keep(claim_wait(value)),
        "fingerprint" => args.fingerprint = Some(value),
        "trace" => args.trace = Some(value),
        _ => args.krate = errors.keep(crate_path(value)),
    }
    Ok(())
}

/// `max_attempts = 5` (a positive integer that fits in `u32`) or
/// `max_attempts = unbounded`.
fn max_attempts(value: Expr) -> syn::Result<MaxAttempts> {
    const USAGE: &str = "`max_attempts` takes a positive whole number or `unbounded`, \
                         e.g. `max_attempts = 5`";
    match &value {
        Expr::Lit(ExprLit {
            attrs,
            lit: Lit::Int(int),
        }) if attrs.is_empty() => match int.base10_parse::<u32>() {
            Ok(0) => Err(syn::Error::new(
                int.span(),
                "`max_attempts = 0` would never run the handler: a message gets at least one \
                 attempt; write `max_attempts = 1` to give up after the first failure",
            )),
            Ok(limit) => Ok(MaxAttempts::Limit(limit, int.span())),
            Err(_) => Err(syn::Error::new(
                int.span(),
                format!("{USAGE}; `{int}` does not fit in a u32 (for no limit, write `unbounded`)"),
            )),
        },
        Expr::Path(path) if path.path.is_ident("unbounded") => {
            Ok(MaxAttempts::Unbounded(path.path.segments[0].ident.span()))
        }
        other => Err(syn::Error::new_spanned(other, USAGE)),
    }
}

/// `claim_wait = "2s"` (a whole number of `ms`, `s` or `m`),
/// `claim_wait = unbounded`, or any other expression: an
/// `inbox_runtime::ClaimWait` evaluated on each delivery (a setting of the
/// service's, `claim_wait = req.claim_wait`).
fn claim_wait(value: Expr) -> syn::Result<ClaimWait> {
    const USAGE: &str = "`claim_wait` takes a duration such as `\"2s\"`, `\"500ms\"` or \
                         `\"1m\"`, `unbounded`, or an expression of type `ClaimWait`";
    if let Expr::Path(path) = &value {
        if path.path.is_ident("unbounded") {
            return Ok(ClaimWait::Unbounded(path.path.segments[0].ident.span()));
        }
    }
    if matches!(&value, Expr::Lit(_)) && as_str_lit(&value).is_none() {
        return Err(syn::Error::new_spanned(value, USAGE));
    }
    let Some(text) = as_str_lit(&value) else {
        return Ok(ClaimWait::Expr(Box::new(value)));
    };
    let written = text.value();
    let digits = written
        .trim()
        .trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &written.trim()[digits.len()..];
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        _ => return Err(syn::Error::new(text.span(), USAGE)),
    };
    match digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(millis_per_unit))
    {
        Some(millis) => Ok(ClaimWait::Bounded(millis, text.span())),
        None => Err(syn::Error::new(text.span(), USAGE)),
    }
}

/// The value of `claim_wait = ...`, with the span of what the user wrote.
#[derive(Clone, Debug)]
pub(crate) enum ClaimWait {
    /// At most this many milliseconds.
    Bounded(u64, Span),
    /// As long as the first delivery takes.
    Unbounded(Span),
    /// An expression of type `ClaimWait`, evaluated on each delivery.
    Expr(Box<Expr>),
}

/// The value of `max_attempts = ...`, with the span of what the user wrote.
#[derive(Clone, Copy, Debug)]
pub(crate) enum MaxAttempts {
    /// A limit of failed attempts, at least 1.
    Limit(u32, Span),
    /// No limit.
    Unbounded(Span),
}

/// The string literal `value` is, if it is one.
fn as_str_lit(value: &Expr) -> Option<&LitStr> {
    match value {
        Expr::Lit(ExprLit {
            attrs,
            lit: Lit::Str(lit),
        }) if attrs.is_empty() => Some(lit),
        _ => None,
    }
}

/// `id = msg.id` as is; `id = "msg.id"` parsed from the string.
///
/// `LitStr::parse` gives every token of the parsed expression the literal's
/// span, so errors about it point at the string.
fn id_expr(value: Expr) -> syn::Result<Expr> {
    let Some(lit) = as_str_lit(&value) else {
        return Ok(value);
    };
    if lit.value().trim().is_empty() {
        return Err(syn::Error::new(
            lit.span(),
            "`id` is empty: give the expression of the message id, e.g. `id = msg.id`",
        ));
    }
    lit.parse::<Expr>().map_err(|error| {
        syn::Error::new(
            lit.span(),
            format!(
                "`id = {}` is not a Rust expression ({error}); write the expression of the \
                 message id, e.g. `id = msg.id` or `id = \"msg.id\"`",
                crate::render::code(lit)
            ),
        )
    })
}

/// `handler = "..."`: a string literal the inbox table can store.
fn handler_name(value: Expr) -> syn::Result<LitStr> {
    let Some(lit) = as_str_lit(&value) else {
        return Err(syn::Error::new_spanned(
            value,
            "`handler` takes a string literal, e.g. `handler = \"billing.apply_payment\"`",
        ));
    };
    check_handler_name(lit)?;
    Ok(lit.clone())
}

/// Checks what the runtime would otherwise reject on every call.
pub(crate) fn check_handler_name(lit: &LitStr) -> syn::Result<()> {
    let name = lit.value();
    let problem = if name.is_empty() {
        "the handler name is empty; name the deduplication scope, e.g. `handler = \"billing.apply_payment\"`"
            .to_owned()
    } else if name.len() > MAX_HANDLER_BYTES {
        format!(
            "the handler name is {} bytes long; the inbox table stores at most {MAX_HANDLER_BYTES} bytes",
            name.len()
        )
    } else if name.contains('\0') {
        "the handler name contains a NUL character, which the inbox table cannot store".to_owned()
    } else {
        return Ok(());
    };
    Err(syn::Error::new(lit.span(), problem))
}

/// `conn = name`: a single identifier.
fn conn_name(value: Expr) -> syn::Result<Ident> {
    if let Expr::Path(path) = &value {
        if path.attrs.is_empty() && path.qself.is_none() {
            // `self` is accepted here and refused, with a reason, by the connection check.
            if let Some(ident) = path.path.get_ident() {
                return Ok(ident.clone());
            }
        }
    }
    Err(syn::Error::new_spanned(
        value,
        "`conn` takes the name of the connection parameter, e.g. `conn = db`",
    ))
}

/// `outside_transaction = name` or `outside_transaction = [name, ...]`:
/// plain names, each once. Mistakes are recorded; the valid names returned.
fn outside_names(value: Expr, errors: &mut Errors) -> Vec<Ident> {
    let elems: Vec<Expr> = match value {
        Expr::Array(array) if array.attrs.is_empty() => array.elems.into_iter().collect(),
        single => vec![single],
    };
    let mut names: Vec<Ident> = Vec::new();
    for elem in elems {
        let name = match &elem {
            Expr::Path(path) if path.attrs.is_empty() && path.qself.is_none() => {
                path.path.get_ident().cloned()
            }
            _ => None,
        };
        match name {
            Some(name) if names.contains(&name) => errors.push(syn::Error::new(
                name.span(),
                format!("`{name}` is listed twice in `outside_transaction`"),
            )),
            Some(name) => names.push(name),
            None => errors.push(syn::Error::new_spanned(
                elem,
                "`outside_transaction` takes the names of the parameters or pools that are meant \
                 to write outside the handler's transaction, e.g. `outside_transaction = \
                 audit_pool` or `outside_transaction = [audit_pool, replica]`",
            )),
        }
    }
    names
}

/// `crate = "path"` (or an unquoted path): where the runtime crate is.
fn crate_path(value: Expr) -> syn::Result<Path> {
    let parsed = match &value {
        Expr::Path(path) if path.attrs.is_empty() && path.qself.is_none() => {
            Some(path.path.clone())
        }
        _ => as_str_lit(&value).and_then(|lit| lit.parse::<Path>().ok()),
    };
    parsed.ok_or_else(|| {
        syn::Error::new_spanned(
            &value,
            "`crate` takes the path of the `inbox_runtime` crate, e.g. `crate = \"::my_inbox\"`",
        )
    })
}
