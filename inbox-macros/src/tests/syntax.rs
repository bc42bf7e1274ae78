//! Reads an expansion back into the pieces the tests assert on.
//!
//! Each reader panics, naming what it found, when the code does not have the
//! expected form: the form itself is then what the test reports as broken.

use quote::ToTokens;
use syn::visit::Visit;
use syn::{
    Block, Expr, ExprClosure, ExprMatch, GenericArgument, Ident, ItemFn, Pat, Path, PathArguments,
    Stmt, Type,
};

use super::{Expanded, Rejected};

/// The tokens of `node` as text, for failure messages.
pub(super) fn text(node: &impl ToTokens) -> String {
    node.to_token_stream().to_string()
}

/// `KRATE::__private::NAME`: an entry point of the runtime.
pub(super) fn runtime(krate: &str, name: &str) -> Path {
    syn::parse_str(&format!("{krate}::__private::{name}")).expect("a runtime path")
}

/// The expression naming `ident`.
pub(super) fn named(ident: &Ident) -> Expr {
    syn::parse_quote!(#ident)
}

/// A call of a function by its path, e.g. `a::b::<T, _>(x, y)`.
pub(super) struct Call {
    /// The function's path, without the turbofish.
    pub(super) entry: Path,
    /// The turbofish's types (`_` included).
    pub(super) types: Vec<Type>,
    /// The arguments.
    pub(super) args: Vec<Expr>,
}

/// Reads `expr` as a call of a function by its path.
pub(super) fn call(expr: &Expr) -> Call {
    let Expr::Call(call) = expr else {
        panic!("not a call: {}", text(expr));
    };
    let Expr::Path(func) = &*call.func else {
        panic!("not a call by path: {}", text(expr));
    };
    let mut entry = func.path.clone();
    let last = entry.segments.last_mut().expect("a path has a segment");
    let types = match std::mem::replace(&mut last.arguments, PathArguments::None) {
        PathArguments::None => Vec::new(),
        PathArguments::AngleBracketed(generics) => generics
            .args
            .into_iter()
            .map(|arg| match arg {
                GenericArgument::Type(ty) => ty,
                other => panic!("not a type argument: {}", text(&other)),
            })
            .collect(),
        PathArguments::Parenthesized(_) => panic!("not a function path: {}", text(expr)),
    };
    Call {
        entry,
        types,
        args: call.args.iter().cloned().collect(),
    }
}

/// The future `expr` awaits.
pub(super) fn awaited(expr: &Expr) -> &Expr {
    match expr {
        Expr::Await(awaited) => &awaited.base,
        other => panic!("not an `.await`: {}", text(other)),
    }
}

/// What `expr` borrows with a shared `&`.
pub(super) fn borrowed(expr: &Expr) -> &Expr {
    match expr {
        Expr::Reference(borrow) if borrow.mutability.is_none() => &borrow.expr,
        other => panic!("not a shared borrow: {}", text(other)),
    }
}

/// The pattern and the value of `let PAT = VALUE;`.
pub(super) fn local(stmt: &Stmt) -> (&Pat, &Expr) {
    match stmt {
        Stmt::Local(local) => match &local.init {
            Some(init) if init.diverge.is_none() => (&local.pat, &init.expr),
            _ => panic!("not `let .. = ..;`: {}", text(stmt)),
        },
        other => panic!("not a `let`: {}", text(other)),
    }
}

/// The name a plain binding pattern binds, and whether it is `mut`.
pub(super) fn binding(pat: &Pat) -> (&Ident, bool) {
    match pat {
        Pat::Ident(binding) if binding.by_ref.is_none() && binding.subpat.is_none() => {
            (&binding.ident, binding.mutability.is_some())
        }
        other => panic!("not a plain binding: {}", text(other)),
    }
}

/// The name `let _ = &name;` touches, if `stmt` is such a statement.
pub(super) fn touched(stmt: &Stmt) -> Option<String> {
    let Stmt::Local(local) = stmt else {
        return None;
    };
    let init = local.init.as_ref()?;
    match (&local.pat, &*init.expr) {
        (Pat::Wild(_), Expr::Reference(borrow)) if borrow.mutability.is_none() => {
            match &*borrow.expr {
                Expr::Path(path) => path.path.get_ident().map(Ident::to_string),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The tail expression of a statement list, i.e. what a block evaluates to.
fn tail(stmts: &[Stmt]) -> &Expr {
    match stmts.last() {
        Some(Stmt::Expr(expr, None)) => expr,
        other => panic!("no tail expression: {}", text(&other.cloned())),
    }
}

/// The claim statement, `let KEY = KRATE::__private::claim_key(HANDLER, &ID);`.
pub(super) struct Claim {
    /// The local the key is bound to.
    pub(super) key: Ident,
    /// The function called.
    pub(super) entry: Path,
    /// The handler name expression.
    pub(super) handler: Expr,
    /// What is borrowed as the id.
    pub(super) id: Expr,
}

/// `run_sync::<..>(CONN, KEY, CLOSURE)`.
pub(super) struct RunSync {
    /// The call, with the closure among its arguments.
    pub(super) call: Call,
    /// The closure running the body.
    pub(super) closure: ExprClosure,
}

/// The async steps, written out in the handler's body:
///
/// ```text
/// let mut TRANSACTION = match BEGIN(CONN, KEY).await { ARMS };
/// let RESULT = CATCH_UNWIND(TYPED(async { let PARAM = SOURCE; BODY })).await;
/// FINISH(TRANSACTION, RESULT).await
/// ```
pub(super) struct RunAsync {
    /// The local holding the transaction, and whether it is `mut`.
    pub(super) transaction: (Ident, bool),
    /// The call beginning the transaction, without its first argument,
    /// the route ([`route`](Self::route)).
    pub(super) begin: Call,
    /// The first argument of `begin`: how the connection's type begins
    /// its claim.
    pub(super) route: Expr,
    /// The `match` on what `begin` returned.
    pub(super) begun: ExprMatch,
    /// The local holding the body's result.
    pub(super) result: Ident,
    /// The call catching a panic of the body.
    pub(super) catch_unwind: Call,
    /// The call taking the delivery's span for the body.
    pub(super) observed: Call,
    /// The call pinning the body's output type.
    pub(super) typed: Call,
    /// The `async` block running the body.
    pub(super) body: Block,
    /// The call finishing the transaction.
    pub(super) finish: Call,
}

/// How the connection is lent to the runtime, in either flavor.
pub(super) struct Lent {
    /// What the runtime receives.
    pub(super) arg: Expr,
    /// The binding under which the body sees the connection.
    pub(super) param: Pat,
}

/// Asserts that `output` has the attributes (inner ones included, which can
/// only come from the body), visibility and signature of `input`.
fn assert_function_kept(input: &ItemFn, output: &ItemFn) {
    assert_eq!(output.attrs, input.attrs, "attributes");
    assert_eq!(output.vis, input.vis, "visibility");
    assert_eq!(output.sig, input.sig, "signature");
}

impl Expanded {
    /// Asserts that the function around the body is the one written.
    pub(super) fn assert_function_kept(&self) {
        assert_function_kept(&self.input, &self.output);
    }

    /// How many statements the runtime call takes at the end of the body.
    fn run_len(&self) -> usize {
        if self.output.sig.asyncness.is_some() {
            3
        } else {
            1
        }
    }

    /// The items the expansion puts first: the default scope's `const`
    /// (when no `handler = "…"` is given) and the registration
    /// (`inventory::submit! { .. }`).
    pub(super) fn items(&self) -> &[Stmt] {
        &self.output.block.stmts[..self.items_len()]
    }

    fn items_len(&self) -> usize {
        self.output
            .block
            .stmts
            .iter()
            .take_while(|stmt| matches!(stmt, Stmt::Item(_) | Stmt::Macro(_)))
            .count()
    }

    /// The first statement after the items: the claim.
    pub(super) fn claim(&self) -> Claim {
        let stmt = self
            .output
            .block
            .stmts
            .get(self.items_len())
            .expect("a statement");
        let (pat, value) = local(stmt);
        let (key, _) = binding(pat);
        let call = call(value);
        let [handler, id] = &call.args[..] else {
            panic!("`claim_key` takes two arguments: {}", text(value));
        };
        Claim {
            key: key.clone(),
            entry: call.entry,
            handler: handler.clone(),
            id: borrowed(id).clone(),
        }
    }

    /// The statements between the claim and the runtime call.
    pub(super) fn setup(&self) -> &[Stmt] {
        let stmts = &self.output.block.stmts;
        &stmts[self.items_len() + 1..stmts.len() - self.run_len()]
    }

    /// The runtime call of a sync handler.
    pub(super) fn run_sync(&self) -> RunSync {
        let call = call(tail(&self.output.block.stmts));
        let Some(Expr::Closure(closure)) = call.args.last() else {
            panic!("`run_sync` takes the body as a closure last");
        };
        RunSync {
            closure: closure.clone(),
            call,
        }
    }

    /// The runtime steps of an async handler.
    pub(super) fn run_async(&self) -> RunAsync {
        let stmts = &self.output.block.stmts;
        let [begin, result, finish] = &stmts[stmts.len() - 3..] else {
            unreachable!()
        };
        let (pat, value) = local(begin);
        let (transaction, transaction_mut) = binding(pat);
        let Expr::Match(begun) = value else {
            panic!("not a `match`: {}", text(value));
        };
        let (pat, value) = local(result);
        let (result, _) = binding(pat);
        let catch_unwind = call(awaited(value));
        let [observed_call, typed_call] = &catch_unwind.args[..] else {
            panic!(
                "`catch_unwind` takes the span, then the future: {}",
                text(value)
            );
        };
        let typed = call(typed_call);
        let [Expr::Async(body)] = &typed.args[..] else {
            panic!("`typed` takes an `async` block: {}", text(typed_call));
        };
        let mut begin = call(awaited(&begun.expr));
        assert!(
            !begin.args.is_empty(),
            "`begin_async` takes the route first"
        );
        let route = begin.args.remove(0);
        RunAsync {
            transaction: (transaction.clone(), transaction_mut),
            begin,
            route,
            begun: begun.clone(),
            result: result.clone(),
            body: body.block.clone(),
            catch_unwind: Call {
                entry: catch_unwind.entry,
                types: catch_unwind.types,
                args: Vec::new(),
            },
            observed: call(observed_call),
            typed: Call {
                entry: typed.entry,
                types: typed.types,
                args: Vec::new(),
            },
            finish: call(awaited(tail(std::slice::from_ref(finish)))),
        }
    }

    /// The connection handed to the runtime and the binding the body sees.
    pub(super) fn lent(&self) -> Lent {
        if self.output.sig.asyncness.is_some() {
            let run = self.run_async();
            let first = run
                .body
                .stmts
                .first()
                .expect("the async block binds the connection");
            Lent {
                arg: run.begin.args[0].clone(),
                param: local(first).0.clone(),
            }
        } else {
            let run = self.run_sync();
            let [param] = run.closure.inputs.iter().collect::<Vec<_>>()[..] else {
                panic!("the closure takes one parameter: {}", text(&run.closure));
            };
            Lent {
                arg: run.call.args[0].clone(),
                param: param.clone(),
            }
        }
    }
}

impl Rejected {
    /// Asserts that the emitted function is the one written, with
    /// statements added only at the start of its body; returns those.
    pub(super) fn added(&self) -> &[Stmt] {
        assert_function_kept(&self.input, &self.output);
        let stmts = &self.output.block.stmts;
        let written = &self.input.block.stmts;
        let added = stmts
            .len()
            .checked_sub(written.len())
            .expect("no statement removed");
        assert_eq!(&stmts[added..], &written[..], "the body as written");
        &stmts[..added]
    }
}

/// Every path in `function` that goes through a `__private` module, as the
/// text of what precedes `__private`.
pub(super) fn runtime_roots(function: &ItemFn) -> Vec<String> {
    #[derive(Default)]
    struct Roots(Vec<String>);
    impl Visit<'_> for Roots {
        fn visit_path(&mut self, path: &Path) {
            if let Some(at) = path.segments.iter().position(|s| s.ident == "__private") {
                let mut root = path.clone();
                root.segments = root.segments.into_iter().take(at).collect();
                self.0.push(text(&root).replace(' ', ""));
            }
            syn::visit::visit_path(self, path);
        }
    }
    let mut roots = Roots::default();
    roots.visit_item_fn(function);
    roots.0
}

/// How many closures `block` contains.
pub(super) fn closures(block: &Block) -> usize {
    #[derive(Default)]
    struct Closures(usize);
    impl Visit<'_> for Closures {
        fn visit_expr_closure(&mut self, closure: &ExprClosure) {
            self.0 += 1;
            syn::visit::visit_expr_closure(self, closure);
        }
    }
    let mut closures = Closures::default();
    closures.visit_block(block);
    closures.0
}
