//! Unit tests of the whole attribute on token streams.
//!
//! The output is read back with `syn`, so each test states a property of the
//! generated code (what is called with what, which binding the body sees)
//! rather than its spelling, and a harmless change of the generated tokens
//! breaks none of them. Compile-level behaviour (spans, warnings, type
//! errors) is covered by the UI tests of the workspace.
//!
//! - `syntax`: reads an output back into the pieces the tests look at;
//! - `expansion`: the code generated for a valid handler;
//! - `fallback`: the function emitted next to the errors;
//! - `errors` and `connections`: the text of every error.

mod connections;
mod errors;
mod expansion;
mod fallback;
mod syntax;

use proc_macro2::TokenStream;
use syn::{File, Item, ItemFn, LitStr};

use crate::idempotent_impl;

/// A valid handler most tests start from.
const HANDLER: &str =
    "fn apply(conn: &mut PgConnection, msg: &Payment) -> Result<(), AppError> { Ok(()) }";

/// What the attribute produced for one input.
struct Output {
    /// The messages of its `compile_error!`s, in order.
    errors: Vec<String>,
    /// The other items it emitted.
    items: Vec<Item>,
}

/// Runs the attribute on `args` and `item` and parses what it produced.
fn run(args: &str, item: &str) -> Output {
    let args: TokenStream = args.parse().expect("args tokenize");
    let item: TokenStream = item.parse().expect("item tokenizes");
    let output = idempotent_impl(args, item);
    let file: File = syn::parse2(output.clone())
        .unwrap_or_else(|error| panic!("the output does not parse ({error}): {output}"));
    let mut errors = Vec::new();
    let mut items = Vec::new();
    for item in file.items {
        match item {
            Item::Macro(call) if ends_with(&call.mac.path, "compile_error") => {
                let message: LitStr = call.mac.parse_body().expect("a string message");
                errors.push(message.value());
            }
            other => items.push(other),
        }
    }
    Output { errors, items }
}

/// Whether the last segment of `path` is `name`.
fn ends_with(path: &syn::Path, name: &str) -> bool {
    path.segments
        .last()
        .is_some_and(|segment| segment.ident == name)
}

/// The messages of the errors the attribute reports.
fn errors(args: &str, item: &str) -> Vec<String> {
    run(args, item).errors
}

/// Asserts that the attribute reports one error per entry of `expected`, in
/// order, each mentioning every fragment of its entry. Returns the messages.
fn assert_errors(args: &str, item: &str, expected: &[&[&str]]) -> Vec<String> {
    let found = errors(args, item);
    assert_eq!(
        found.len(),
        expected.len(),
        "expected {} errors, got {found:#?}",
        expected.len()
    );
    for (message, fragments) in found.iter().zip(expected) {
        for fragment in *fragments {
            assert!(message.contains(fragment), "{message:?} lacks {fragment:?}");
        }
    }
    found
}

/// Asserts that the only error mentions every fragment in `fragments`.
fn assert_one_error(args: &str, item: &str, fragments: &[&str]) {
    assert_errors(args, item, &[fragments]);
}

/// Asserts that `item` expands without errors under `args`.
fn assert_no_errors(args: &str, item: &str) {
    let found = errors(args, item);
    assert!(found.is_empty(), "{item}: {found:#?}");
}

/// The one function in `items`.
fn only_function(items: Vec<Item>) -> ItemFn {
    match <[Item; 1]>::try_from(items) {
        Ok([Item::Fn(function)]) => function,
        Ok([other]) => panic!("expected a function, got {}", quote::quote!(#other)),
        Err(items) => panic!("expected one item, got {}", items.len()),
    }
}

/// A handler as written, and the function the attribute made of it.
struct Expanded {
    /// The input, parsed.
    input: ItemFn,
    /// The output.
    output: ItemFn,
}

/// Expands a valid handler, asserting that no error is reported.
fn expand(args: &str, item: &str) -> Expanded {
    let Output { errors, items } = run(args, item);
    assert!(errors.is_empty(), "{item}: {errors:#?}");
    Expanded {
        input: syn::parse_str(item).expect("the handler parses"),
        output: only_function(items),
    }
}

/// A rejected handler: the errors, and the function emitted after them.
struct Rejected {
    /// The error messages.
    errors: Vec<String>,
    /// The input, parsed.
    input: ItemFn,
    /// The function emitted after the errors.
    output: ItemFn,
}

/// Runs the attribute on a handler it rejects.
fn reject(args: &str, item: &str) -> Rejected {
    let Output { errors, items } = run(args, item);
    assert!(!errors.is_empty(), "{item}: expected errors");
    Rejected {
        errors,
        input: syn::parse_str(item).expect("the handler parses"),
        output: only_function(items),
    }
}
