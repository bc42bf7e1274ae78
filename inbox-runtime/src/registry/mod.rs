//! The handlers of a program: every `#[idempotent]` function linked into it,
//! with its deduplication scope, its source location and its settings.
//!
//! Each `#[idempotent]` function registers itself (through the
//! [`inventory`](https://docs.rs/inventory) crate, which `inbox-runtime`
//! re-exports for the generated code: nothing to add to your `Cargo.toml`),
//! so a program can list its handlers at start-up ([`handlers`]), find two
//! handlers that declare one scope ([`check`], [`shared_scopes`]), and print
//! them with the retention a [`RetentionPolicy`] gives each ([`describe`]).
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use diesel::prelude::*;
//! use inbox_runtime::{idempotent, registry};
//!
//! #[idempotent(id = msg, handler = "docs.registry.ship", max_attempts = 3)]
//! fn ship(conn: &mut SqliteConnection, msg: &str) -> QueryResult<()> {
//!     Ok(())
//! }
//!
//! // No scope declared twice (the handlers of every example on this page
//! // are in one program: edition 2024 merges doctests).
//! registry::check()?;
//! let ship = registry::handlers()
//!     .into_iter()
//!     .find(|handler| handler.scope() == "docs.registry.ship")
//!     .expect("registered");
//! assert_eq!(ship.max_attempts(), Some(inbox_runtime::MaxAttempts::limit(3)));
//! assert!(ship.function().ends_with("::ship"));
//! assert!(ship.file().ends_with(".rs"));
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Two handlers, one scope
//!
//! The scope (`handler = "…"`, by default the function's path) is what the
//! inbox deduplicates on: two handlers that declare the same scope share
//! their claims, so each one skips, as duplicates, the messages the other
//! processed. Unless that is meant (versions of one handler of which one is
//! live at a time, one handler written for two connection types), one of
//! them silently loses messages. So:
//!
//! - [`check`] reports every scope declared by two or more handlers that did
//!   not all say `#[idempotent(shared_scope)]`; call it at start-up to fail
//!   before consuming;
//! - a delivery to a handler whose scope is shared without `shared_scope`
//!   fails with [`InboxError::SharedScope`]
//!   before it claims anything. It is retryable: the body did not run,
//!   nothing was recorded, the message stays in the broker until a deploy
//!   gives each handler its own scope (or declares the sharing). The first
//!   such delivery of the process also reports the whole [`check`] as an
//!   `inbox.shared_scope` event (feature `tracing`) and through `log`
//!   (feature `log`). After the first delivery the check costs an atomic
//!   load per delivery, and a binary search when some scope is shared.
//!
//! The check is done at run time, over the handlers linked into the program.
//! It is not done at compile time: the attribute sees one function at a
//! time, and a proc macro has no sound place to remember the scopes of the
//! others (its process may be reused or not, run in parallel or skipped by
//! incremental builds). An item named after the scope would collide in one
//! namespace only: items in different modules do not, and `#[macro_export]`
//! macros (which do, at the crate root) defined inside a function or an
//! `impl` are linted against by the compiler (`non_local_definitions`). And a
//! default scope (`module_path!()`) is only known after expansion.
//!
//! # Doctests
//!
//! Edition 2024 compiles a crate's doctests into one program, so the
//! handlers of all its doc examples are registered together: examples that
//! reuse one scope name are two handlers of one scope, and their deliveries
//! are refused. Give each example its own scope (or mark the doctest
//! `standalone_crate`).
//!
//! # Linking
//!
//! The registrations are collected before `main` by life-before-main
//! constructors, from the object files linked into the program. A handler in
//! a library crate is registered when the binary links it, which it does
//! when it calls (or otherwise uses) something of that crate's code that
//! contains the handler; a library whose handlers are only reached through
//! dynamic dispatch, or never, may be left out by the linker. A program
//! whose [`handlers`] miss one should reference the library (e.g. call one
//! function of it at start-up).
//!
//! # Scopes without the attribute
//!
//! A program that claims through [`run_idempotent`](crate::run_idempotent)
//! with scopes it builds at run time registers them with
//! [`register_scope`], so the pruner does not report them as unknown (see
//! [`Prune::warn_unregistered`](crate::Prune::warn_unregistered)).
//!
//! [`RetentionPolicy`]: crate::RetentionPolicy

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Mutex, OnceLock};

use crate::attempts::MaxAttempts;
use crate::error::InboxError;
use crate::key::HandlerName;
use crate::retention::RetentionPolicy;

mod error_types;

pub use error_types::ErrorType;
#[doc(hidden)]
pub use error_types::{ErrorTypeOf, ErrorTypeProbe, ProbeHandlerError, ProbeNothing};

/// How a registered handler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Flavor {
    /// A plain `fn` on a Diesel connection.
    Sync,
    /// An `async fn` on a diesel-async connection.
    Async,
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Flavor::Sync => "sync",
            Flavor::Async => "async",
        })
    }
}

/// One `#[idempotent]` function, as the attribute registered it.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{idempotent, registry};
///
/// #[idempotent(id = msg, handler = "docs.registered.audit", store_result)]
/// fn audit(conn: &mut SqliteConnection, msg: &str) -> QueryResult<inbox_runtime::StoredOutcome<u32>> {
///     Ok(inbox_runtime::StoredOutcome::Processed(1))
/// }
///
/// let audit = registry::find("docs.registered.audit").next().expect("registered");
/// assert!(audit.store_result() && !audit.fingerprint() && !audit.shared_scope());
/// assert_eq!(audit.flavor(), registry::Flavor::Sync);
/// assert_eq!(audit.max_attempts(), None); // the runtime's default
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RegisteredHandler {
    scope: &'static str,
    module_path: &'static str,
    name: &'static str,
    file: &'static str,
    line: u32,
    column: u32,
    max_attempts: Option<MaxAttempts>,
    flags: u8,
    flavor: Flavor,
    error_type: ErrorTypeProbe,
}

const FINGERPRINT: u8 = 1;
const STORE_RESULT: u8 = 2;
const SHARED_SCOPE: u8 = 4;

impl RegisteredHandler {
    /// What `#[idempotent]` registers. Not an API: the generated code calls
    /// it (through `__private::registered`).
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub const fn __new(
        scope: &'static str,
        module_path: &'static str,
        name: &'static str,
        file: &'static str,
        line: u32,
        column: u32,
        max_attempts: Option<MaxAttempts>,
        (fingerprint, store_result, shared_scope, is_async): (bool, bool, bool, bool),
        error_type: ErrorTypeProbe,
    ) -> Self {
        let mut flags = 0;
        if fingerprint {
            flags |= FINGERPRINT;
        }
        if store_result {
            flags |= STORE_RESULT;
        }
        if shared_scope {
            flags |= SHARED_SCOPE;
        }
        RegisteredHandler {
            scope,
            module_path,
            name,
            file,
            line,
            column,
            max_attempts,
            flags,
            flavor: if is_async {
                Flavor::Async
            } else {
                Flavor::Sync
            },
            error_type,
        }
    }

    /// The deduplication scope: `handler = "…"`, or the default
    /// `module_path!()::name`.
    pub fn scope(&self) -> &'static str {
        self.scope
    }

    /// The module the function is in (`module_path!()`).
    pub fn module_path(&self) -> &'static str {
        self.module_path
    }

    /// The function's name (a method's name without its type, which the
    /// attribute does not see).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// `module_path::name`.
    pub fn function(&self) -> String {
        format!("{}::{}", self.module_path, self.name)
    }

    /// The source file of the attribute (`file!()`).
    pub fn file(&self) -> &'static str {
        self.file
    }

    /// The line of the attribute (`line!()`).
    pub fn line(&self) -> u32 {
        self.line
    }

    /// The column of the attribute (`column!()`).
    pub fn column(&self) -> u32 {
        self.column
    }

    /// `max_attempts = …`, if given (`None`: the runtime's
    /// [`default_max_attempts`](crate::default_max_attempts) at each
    /// delivery).
    pub fn max_attempts(&self) -> Option<MaxAttempts> {
        self.max_attempts
    }

    /// Whether `fingerprint = …` is given.
    pub fn fingerprint(&self) -> bool {
        self.flags & FINGERPRINT != 0
    }

    /// Whether `store_result` is given.
    pub fn store_result(&self) -> bool {
        self.flags & STORE_RESULT != 0
    }

    /// Whether `shared_scope` is given: the handler shares its scope with
    /// others on purpose.
    pub fn shared_scope(&self) -> bool {
        self.flags & SHARED_SCOPE != 0
    }

    /// Sync or async.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// What the handler's error type carries to
    /// [`ack_decision`](crate::ack_decision), found by converting an
    /// [`InboxError`] and a database error into it ([`check`] reports a
    /// type that hides them). `None` when the attribute could not name the
    /// return type outside the function: a return type that names a
    /// generic parameter, `Self` or a lifetime, or a method that takes
    /// `self` (whose impl block the attribute does not see). Nothing checks
    /// such a handler's error type: see [`HandlerError`](crate::HandlerError)
    /// for what it must do.
    ///
    /// ```
    /// for handler in inbox_runtime::registry::handlers() {
    ///     if let Some(error_type) = handler.error_type() {
    ///         println!("{}: {error_type}", handler.function());
    ///     }
    /// }
    /// ```
    pub fn error_type(&self) -> Option<ErrorType> {
        self.error_type.run()
    }

    /// `file:line:column`.
    fn location(&self) -> Location<'_> {
        Location(self)
    }
}

struct Location<'a>(&'a RegisteredHandler);

impl fmt::Display for Location<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.0.file, self.0.line, self.0.column)
    }
}

inventory::collect!(RegisteredHandler);

/// Every registered handler, sorted by scope (then file and line).
///
/// ```
/// for handler in inbox_runtime::registry::handlers() {
///     println!("{} {} {}:{}", handler.scope(), handler.function(), handler.file(), handler.line());
/// }
/// ```
pub fn handlers() -> Vec<&'static RegisteredHandler> {
    let mut all: Vec<&'static RegisteredHandler> =
        inventory::iter::<RegisteredHandler>.into_iter().collect();
    all.sort_by(|a, b| {
        (a.scope, a.file, a.line, a.column, a.name)
            .cmp(&(b.scope, b.file, b.line, b.column, b.name))
    });
    all
}

/// The registered handlers of `scope`.
///
/// ```
/// assert_eq!(inbox_runtime::registry::find("no.such.scope").count(), 0);
/// ```
pub fn find(scope: &str) -> impl Iterator<Item = &'static RegisteredHandler> + '_ {
    inventory::iter::<RegisteredHandler>
        .into_iter()
        .filter(move |handler| handler.scope == scope)
}

/// A scope declared by two or more handlers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharedScope {
    /// The scope.
    pub scope: &'static str,
    /// The handlers that declare it, sorted by file and line.
    pub handlers: Vec<&'static RegisteredHandler>,
}

impl SharedScope {
    /// Whether every handler of the scope says `shared_scope`: the sharing
    /// is meant, and [`check`] accepts it.
    ///
    /// ```
    /// let shared = inbox_runtime::registry::shared_scopes();
    /// assert!(shared.iter().all(|scope| scope.handlers.len() >= 2));
    /// ```
    pub fn is_declared(&self) -> bool {
        self.handlers.iter().all(|handler| handler.shared_scope())
    }
}

impl fmt::Display for SharedScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "scope `{}` is declared by {} handlers:",
            self.scope,
            self.handlers.len()
        )?;
        for handler in &self.handlers {
            write!(
                f,
                " {}::{} ({}{});",
                handler.module_path,
                handler.name,
                handler.location(),
                if handler.shared_scope() {
                    ", shared_scope"
                } else {
                    ""
                }
            )?;
        }
        Ok(())
    }
}

/// Every scope declared by two or more registered handlers, sorted by
/// scope, declared (`shared_scope`) or not.
///
/// ```
/// for shared in inbox_runtime::registry::shared_scopes() {
///     println!("{shared}");
/// }
/// ```
pub fn shared_scopes() -> Vec<SharedScope> {
    let all = handlers();
    let mut shared = Vec::new();
    for group in all.chunk_by(|a, b| a.scope == b.scope) {
        if group.len() > 1 {
            shared.push(SharedScope {
                scope: group[0].scope,
                handlers: group.to_vec(),
            });
        }
    }
    shared
}

/// The scopes declared by two or more handlers that do not all say
/// `shared_scope`, as one report ([`Problems::shared_scopes`]; the
/// `inbox.shared_scopes` event's text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedScopes(pub Vec<SharedScope>);

impl fmt::Display for SharedScopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} deduplication scope{} declared by more than one handler, so each of \
             these handlers skips the messages the others processed; give each handler \
             its own `handler = \"…\"`, or add `shared_scope` to all of them if the \
             sharing is meant",
            self.0.len(),
            if self.0.len() == 1 { " is" } else { "s are" }
        )?;
        for scope in &self.0 {
            write!(f, "\n  {scope}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SharedScopes {}

/// A handler whose error type hides the inbox's errors (see
/// [`RegisteredHandler::error_type`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HiddenErrors {
    /// The handler.
    pub handler: &'static RegisteredHandler,
    /// Its error type, and what it hides.
    pub error_type: ErrorType,
}

impl fmt::Display for HiddenErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "handler {} ({}): {}",
            self.handler.function(),
            self.handler.location(),
            self.error_type
        )
    }
}

/// Every handler whose error type hides the inbox's errors or database
/// errors from [`ack_decision`](crate::ack_decision), sorted by scope.
///
/// ```
/// assert!(inbox_runtime::registry::hidden_errors().is_empty());
/// ```
pub fn hidden_errors() -> Vec<HiddenErrors> {
    handlers()
        .into_iter()
        .filter_map(|handler| {
            let error_type = handler.error_type()?;
            (!error_type.is_transparent()).then_some(HiddenErrors {
                handler,
                error_type,
            })
        })
        .collect()
}

/// What [`check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problems {
    /// The scopes declared by two or more handlers that do not all say
    /// `shared_scope`: each of their handlers skips the messages the others
    /// processed, and their deliveries fail with
    /// [`InboxError::SharedScope`].
    pub shared_scopes: Vec<SharedScope>,
    /// The handlers whose error type hides the inbox's errors: their
    /// deliveries' answers ([`ack_decision`](crate::ack_decision)) read as
    /// the handler's own failures (a message without an id retried
    /// forever, a copy in flight redelivered at once).
    pub hidden_errors: Vec<HiddenErrors>,
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        if !self.shared_scopes.is_empty() {
            SharedScopes(self.shared_scopes.clone()).fmt(f)?;
            first = false;
        }
        if !self.hidden_errors.is_empty() {
            if !first {
                f.write_str("\n")?;
            }
            write!(
                f,
                "{} handler{} an error type that hides the inbox's errors, so \
                 `ack_decision` reads every answer as the handler's own failure",
                self.hidden_errors.len(),
                if self.hidden_errors.len() == 1 {
                    " has"
                } else {
                    "s have"
                }
            )?;
            for hidden in &self.hidden_errors {
                write!(f, "\n  {hidden}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

/// Checks the program's handlers: that no scope is declared by two
/// handlers, except by handlers that all say `#[idempotent(shared_scope)]`
/// (deliveries to the ones it reports fail with
/// [`InboxError::SharedScope`]), and that each handler's error type carries
/// the inbox's errors to [`ack_decision`](crate::ack_decision)
/// ([`hidden_errors`]). Call it at start-up, before consuming.
///
/// ```
/// if let Err(problems) = inbox_runtime::registry::check() {
///     eprintln!("{problems}");
///     std::process::exit(1);
/// }
/// ```
pub fn check() -> Result<(), Problems> {
    let problems = Problems {
        shared_scopes: undeclared_shared_scopes(),
        hidden_errors: hidden_errors(),
    };
    if problems.shared_scopes.is_empty() && problems.hidden_errors.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// The shared scopes [`check`] reports.
fn undeclared_shared_scopes() -> Vec<SharedScope> {
    shared_scopes()
        .into_iter()
        .filter(|shared| !shared.is_declared())
        .collect()
}

/// The scopes whose deliveries are refused, sorted, computed (and reported)
/// once per process.
static REFUSED: OnceLock<Box<[&'static str]>> = OnceLock::new();

fn refused_scopes() -> &'static [&'static str] {
    REFUSED.get_or_init(|| {
        let shared = SharedScopes(undeclared_shared_scopes());
        if !shared.0.is_empty() {
            crate::observe::shared_scopes(shared.0.len(), &shared);
        }
        shared.0.iter().map(|scope| scope.scope).collect()
    })
}

/// The error of a delivery to a handler of `scope`, if another handler
/// declares it too (without `shared_scope` on both): see [`check`].
#[inline]
pub(crate) fn refusal(scope: &'static str) -> Option<InboxError> {
    let refused = refused_scopes();
    if refused.is_empty() || refused.binary_search(&scope).is_err() {
        return None;
    }
    Some(InboxError::SharedScope {
        handler: scope.to_owned(),
        handlers: find(scope)
            .map(|handler| format!("{} ({})", handler.function(), handler.location()))
            .collect(),
    })
}

/// Scopes registered at run time ([`register_scope`]).
static DYNAMIC: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Registers a scope the program claims without the attribute (through
/// [`run_idempotent`](crate::run_idempotent) with a [`HandlerName`] made at
/// run time), so the pruner does not report its rows as unregistered.
///
/// ```
/// use inbox_runtime::{HandlerName, registry};
/// registry::register_scope(&HandlerName::new("tenant-7.import")?);
/// assert!(registry::is_registered("tenant-7.import"));
/// # Ok::<(), inbox_runtime::InboxError>(())
/// ```
pub fn register_scope(scope: &HandlerName) {
    DYNAMIC
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(scope.as_str().to_owned());
}

/// Whether `scope` is declared by a registered handler or was given to
/// [`register_scope`].
///
/// ```
/// assert!(!inbox_runtime::registry::is_registered("no.such.scope"));
/// ```
pub fn is_registered(scope: &str) -> bool {
    find(scope).next().is_some()
        || DYNAMIC
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .contains(scope)
}

/// The registered scopes, handlers' and [`register_scope`]'s, sorted;
/// empty when the program registered none (no `#[idempotent]` linked in).
pub(crate) fn known_scopes() -> BTreeSet<String> {
    let mut known = DYNAMIC
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    known.extend(
        inventory::iter::<RegisteredHandler>
            .into_iter()
            .map(|handler| handler.scope.to_owned()),
    );
    known
}

/// The registered handlers with the retention `policy` gives each: a table
/// to print at start-up ([`Display`](fmt::Display)), one line per handler.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use std::time::Duration;
/// use diesel::prelude::*;
/// use inbox_runtime::{HandlerName, RetentionPolicy, idempotent, registry};
///
/// #[idempotent(id = msg, handler = "docs.describe.ledger", max_attempts = unbounded)]
/// fn ledger(conn: &mut SqliteConnection, msg: &str) -> QueryResult<()> {
///     Ok(())
/// }
///
/// let policy = RetentionPolicy::parse("7d", "1d")?
///     .with_handler(HandlerName::new("docs.describe.ledger")?, Duration::from_secs(30 * 86_400));
/// let table = registry::describe(&policy).to_string();
/// println!("{table}");
/// let line = table.lines().find(|line| line.starts_with("docs.describe.ledger")).unwrap();
/// assert!(line.contains("keep 30d (own window)"));
/// assert!(line.contains("max_attempts unbounded"));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn describe(policy: &RetentionPolicy) -> Described<'_> {
    Described {
        policy,
        handlers: handlers(),
    }
}

/// The table of [`describe`].
#[derive(Debug)]
pub struct Described<'p> {
    policy: &'p RetentionPolicy,
    handlers: Vec<&'static RegisteredHandler>,
}

impl fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let default_attempts = crate::default_max_attempts();
        for handler in &self.handlers {
            let keep = match HandlerName::new(handler.scope) {
                Ok(name) => {
                    let own = self
                        .policy
                        .handler_windows()
                        .iter()
                        .any(|(window, _)| *window == name);
                    format!(
                        "keep {}{}",
                        crate::duration::format_duration(self.policy.keep_for(&name)),
                        if own { " (own window)" } else { "" }
                    )
                }
                Err(_) => "keep ?".to_owned(),
            };
            let attempts = |limit: MaxAttempts| match limit.limit_value() {
                Some(limit) => limit.to_string(),
                None => "unbounded".to_owned(),
            };
            let attempts = match handler.max_attempts {
                Some(limit) => attempts(limit),
                None => format!("{} (default)", attempts(default_attempts)),
            };
            write!(
                f,
                "{}  {}  {}  {}  max_attempts {}  {}",
                handler.scope,
                handler.function(),
                handler.location(),
                keep,
                attempts,
                handler.flavor,
            )?;
            for (set, flag) in [
                (handler.fingerprint(), "fingerprint"),
                (handler.store_result(), "store_result"),
                (handler.shared_scope(), "shared_scope"),
            ] {
                if set {
                    write!(f, "  {flag}")?;
                }
            }
            writeln!(f)?;
        }
        Ok(())
    }
}
