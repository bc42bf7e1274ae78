//! Glue for the code `#[idempotent]` generates. Not a public API: use the
//! documented functions this module forwards to.

use diesel::connection::LoadConnection;

use crate::attempts::MaxAttempts;
use crate::backend::InboxBackend;
use crate::error::{HandlerError, InboxError};
use crate::fingerprint::Fingerprinted;
use crate::key::{ClaimKey, HandlerName};
use crate::message_id::MessageId;
use crate::observe;
#[cfg(not(feature = "async"))]
use crate::observe::BodyScope;
use crate::options::Options;
use crate::outcome::OnDuplicate;
use crate::stored::StoredResult;

/// Builds the claim key from the handler's name and its id expression.
///
/// The name is not checked again here, on every delivery: the expansion
/// checked it when the handler was compiled (a `handler = "…"` literal in
/// the attribute, the default `module_path!()::name` through
/// [`checked_handler`] in a `const` block).
///
/// A handler whose scope another handler declares too (see
/// [`crate::registry::check`]) gets [`InboxError::SharedScope`] instead.
#[inline]
pub fn claim_key<M: MessageId + ?Sized>(
    handler: &'static str,
    id: &M,
) -> Result<ClaimKey, InboxError> {
    let key = ClaimKey::new(HandlerName::from_checked(handler), id)?;
    match crate::registry::refusal(handler) {
        None => Ok(key),
        Some(error) => {
            observe::shared_scope(&key, &error);
            Err(error)
        }
    }
}

/// The registry's collection of handlers, for the registration
/// `#[idempotent]` emits in the handler's body:
/// `inventory::submit! { registered(..) }`.
pub use inventory;

/// What `#[idempotent]` registers for one handler (see
/// [`crate::registry`]): evaluated at compile time, in a `static`.
#[allow(clippy::too_many_arguments)]
pub const fn registered(
    scope: &'static str,
    module_path: &'static str,
    name: &'static str,
    file: &'static str,
    line: u32,
    column: u32,
    max_attempts: Option<MaxAttempts>,
    flags: (bool, bool, bool, bool),
    error_type: crate::registry::ErrorTypeProbe,
) -> crate::registry::RegisteredHandler {
    crate::registry::RegisteredHandler::__new(
        scope,
        module_path,
        name,
        file,
        line,
        column,
        max_attempts,
        flags,
        error_type,
    )
}

/// The registration's probe of the handler's error type (see
/// [`crate::registry::RegisteredHandler::error_type`]): the attribute emits
/// `ErrorTypeProbe::new(|| { use ..; (&ErrorTypeOf::<RET>::new()).probe_error_type() })`.
pub use crate::registry::{ErrorTypeOf, ErrorTypeProbe, ProbeHandlerError, ProbeNothing};

/// [`claim_key`] with the fingerprint of `payload`
/// (`#[idempotent(fingerprint = …)]`): the payload's type is checked here,
/// against [`Fingerprinted`].
pub fn fingerprinted_key<M, P>(
    handler: &'static str,
    id: &M,
    payload: &P,
) -> Result<ClaimKey, InboxError>
where
    M: MessageId + ?Sized,
    P: Fingerprinted + ?Sized,
{
    let key = claim_key(handler, id)?;
    match payload.fingerprint() {
        Ok(fingerprint) => Ok(key.with_fingerprint(fingerprint)),
        Err(error) => {
            observe::refused(&key, &error);
            Err(error)
        }
    }
}

/// The default handler name (`module_path!()::name`), checked as
/// [`HandlerName::new`] would: evaluated in a `const` block by the
/// expansion, so a name the inbox cannot store (longer than
/// [`MAX_HANDLER_BYTES`](crate::MAX_HANDLER_BYTES) bytes) fails the build.
pub const fn checked_handler(name: &'static str) -> &'static str {
    if !crate::key::is_valid_handler_name(name) {
        panic!(
            "the handler's default name (`module_path!()::name`) is longer than the 255 bytes \
             the inbox stores: name the deduplication scope with `handler = \"…\"`"
        );
    }
    name
}

/// A handler's return type: a `Result`, taken apart into its `Ok` and `Err`
/// types so `run_sync` can bound each.
///
/// The expansion names the handler's return type as the `T` of [`run_sync`]
/// (`run_sync::<_, RET, _>`), so a wrong return type fails `run_sync`'s
/// bounds at the return type the user wrote: a type that is not a `Result`
/// with the message below, a `Result` whose `Ok` or `Err` type does not fit
/// with the message of `OnDuplicate` or `HandlerError`.
#[diagnostic::on_unimplemented(
    message = "an idempotent handler must return `Result<R, E>`, not `{Self}`",
    label = "the body runs in a transaction that commits on `Ok` and rolls back on `Err`",
    note = "return `Result<(), E>` or `Result<inbox_runtime::Outcome<T>, E>`, where `E` implements `From<diesel::result::Error>` and `From<inbox_runtime::InboxError>`"
)]
pub trait HandlerResult {
    /// The `Ok` type.
    type Ok;
    /// The `Err` type.
    type Err;
    /// `self` as the `Result` it is.
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
    /// The `Result` as `Self`.
    fn from_result(result: Result<Self::Ok, Self::Err>) -> Self;
}

impl<R, E> HandlerResult for Result<R, E> {
    type Ok = R;
    type Err = E;

    fn into_result(self) -> Self {
        self
    }

    fn from_result(result: Self) -> Self {
        result
    }
}

/// Runs the handler body through [`crate::run_idempotent`], or returns the
/// key's validation error without touching the database.
pub fn run_sync<C, T, F>(
    conn: &mut C,
    key: Result<ClaimKey, InboxError>,
    options: Options,
    body: F,
) -> T
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    T: HandlerResult,
    T::Ok: OnDuplicate,
    T::Err: HandlerError,
    F: FnOnce(&mut C) -> T,
{
    run_with::<Plain, C, T, F>(conn, key, options, body)
}

/// [`run_sync`] for `store_result`, through
/// [`crate::run_idempotent_storing`].
pub fn run_sync_storing<C, T, F>(
    conn: &mut C,
    key: Result<ClaimKey, InboxError>,
    options: Options,
    body: F,
) -> T
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    T: HandlerResult,
    T::Ok: StoredResult,
    T::Err: HandlerError,
    F: FnOnce(&mut C) -> T,
{
    run_with::<Storing, C, T, F>(conn, key, options, body)
}

fn run_with<P, C, T, F>(
    conn: &mut C,
    key: Result<ClaimKey, InboxError>,
    options: Options,
    body: F,
) -> T
where
    P: Reply<T::Ok>,
    C: LoadConnection,
    C::Backend: InboxBackend,
    T: HandlerResult,
    T::Err: HandlerError,
    F: FnOnce(&mut C) -> T,
{
    T::from_result(match key {
        Ok(key) => {
            crate::delivery::blocking::run::<P, C, T::Ok, T::Err, _>(conn, key, options, |conn| {
                body(conn).into_result()
            })
        }
        Err(error) => {
            observe::invalid_key(&error);
            Err(error.into())
        }
    })
}

/// The first step of an async handler: the claimed transaction in which the
/// body runs, or the handler's return value without running it (a duplicate,
/// an invalid id, a database failure). `route` is how the connection begins
/// its claim ([`ConnRoute`]).
#[cfg(feature = "async")]
pub async fn begin_async<C, T, R>(
    route: R,
    conn: &mut C,
    key: Result<ClaimKey, InboxError>,
    options: Options,
) -> Result<crate::ClaimedTransaction<'_, C>, T>
where
    C: diesel_async::AsyncConnection,
    C::Backend: InboxBackend,
    T: HandlerResult,
    T::Ok: OnDuplicate,
    T::Err: HandlerError,
    R: BeginClaim<C>,
{
    begin_async_with::<Plain, C, T, R>(route, conn, key, options).await
}

/// [`begin_async`] for `store_result`: a duplicate returns the stored
/// result.
#[cfg(feature = "async")]
pub async fn begin_async_storing<C, T, R>(
    route: R,
    conn: &mut C,
    key: Result<ClaimKey, InboxError>,
    options: Options,
) -> Result<crate::ClaimedTransaction<'_, C>, T>
where
    C: diesel_async::AsyncConnection,
    C::Backend: InboxBackend,
    T: HandlerResult,
    T::Ok: StoredResult,
    T::Err: HandlerError,
    R: BeginClaim<C>,
{
    begin_async_with::<Storing, C, T, R>(route, conn, key, options).await
}

/// [`begin_async`] and [`begin_async_storing`], by how `P` answers a
/// duplicate.
#[cfg(feature = "async")]
async fn begin_async_with<P, C, T, R>(
    route: R,
    conn: &mut C,
    key: Result<ClaimKey, InboxError>,
    options: Options,
) -> Result<crate::ClaimedTransaction<'_, C>, T>
where
    P: Reply<T::Ok>,
    C: diesel_async::AsyncConnection,
    C::Backend: InboxBackend,
    T: HandlerResult,
    T::Err: HandlerError,
    R: BeginClaim<C>,
{
    let key = key.map_err(|error| {
        observe::invalid_key(&error);
        T::from_result(Err(error.into()))
    })?;
    route
        .begin::<P, T::Ok>(conn, key, options)
        .await
        .map_err(|answer| T::from_result(answer.map_err(crate::error::into_handler_error)))
}

/// What beginning an async handler's claim comes to: the claimed
/// transaction, or the answer without the body (a duplicate's, or the
/// inbox's error).
#[cfg(feature = "async")]
pub type Begun<'c, C, R> = Result<crate::ClaimedTransaction<'c, C>, Result<R, InboxError>>;

/// The type of an async handler's connection, for the expansion to pick how
/// it begins its claim, by autoref (no specialization on stable Rust):
/// `(&ConnRoute::of(&conn)).inbox_route()` with [`RoutePipelined`] and
/// [`RouteSequential`] in scope is [`Pipelined`] for an `AsyncPgConnection`
/// (the type itself, where the handler names it) and [`Sequential`] for any
/// other type, a generic one included.
pub struct ConnRoute<C>(core::marker::PhantomData<fn(C)>);

impl<C> ConnRoute<C> {
    /// The route of the connection `conn` lends (`&mut C`), which must be a
    /// diesel-async connection (a wrong type is reported here, at the
    /// handler's connection parameter).
    #[cfg(feature = "async")]
    pub fn of(conn: &&mut C) -> Self
    where
        C: AsyncHandlerConnection,
    {
        let _ = conn;
        ConnRoute(core::marker::PhantomData)
    }

    /// The route of the connection `conn` lends (`&mut C`); without the
    /// `async` feature, `begin_async` reports the missing feature.
    #[cfg(not(feature = "async"))]
    pub fn of(conn: &&mut C) -> Self {
        let _ = conn;
        ConnRoute(core::marker::PhantomData)
    }
}

/// The connection of an `async fn` handler: any diesel-async connection.
#[cfg(feature = "async")]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a diesel-async connection, which an `async fn` handler runs on",
    label = "not a diesel-async connection",
    note = "take `&mut AsyncPgConnection` or `&mut AsyncMysqlConnection` (or a deadpool `Object` or bb8 `PooledConnection` of one); a blocking connection goes with a handler that is not `async`"
)]
pub trait AsyncHandlerConnection {}

#[cfg(feature = "async")]
impl<C: diesel_async::AsyncConnection> AsyncHandlerConnection for C {}

/// The route of an `AsyncPgConnection`: its `BEGIN` pipelined with the
/// claim (`delivery::pipelined`).
#[derive(Debug, Clone, Copy)]
pub struct Pipelined;

/// The route of any other connection: `BEGIN`, then the claim.
#[derive(Debug, Clone, Copy)]
pub struct Sequential;

/// Picks [`Pipelined`] (found first, on `ConnRoute<AsyncPgConnection>`
/// itself).
pub trait RoutePipelined {
    /// [`Pipelined`].
    fn inbox_route(&self) -> Pipelined {
        Pipelined
    }
}

#[cfg(all(feature = "async", feature = "postgres"))]
impl<C: Pipelining> RoutePipelined for ConnRoute<C> {}

/// How a handler answers a duplicate and what it stores: `P` of
/// [`BeginClaim::begin`].
pub use crate::stored::{Plain, Reply, Storing};

/// What a connection needs for [`Pipelined`].
#[cfg(all(feature = "async", feature = "postgres"))]
pub use crate::delivery::pipelined::Pipelining;

/// Picks [`Sequential`] (found after an autoref, for every type).
pub trait RouteSequential {
    /// [`Sequential`].
    fn inbox_route(&self) -> Sequential {
        Sequential
    }
}

impl<C> RouteSequential for &ConnRoute<C> {}

/// How a route begins a handler's level on `C` and claims in it (see
/// `delivery::asynchronous::claim_in_new_level`), a duplicate answered as
/// `P` says.
#[cfg(feature = "async")]
pub trait BeginClaim<C>
where
    C: diesel_async::AsyncConnection,
    C::Backend: InboxBackend,
{
    /// Begins and claims.
    fn begin<P: Reply<R>, R>(
        self,
        conn: &mut C,
        key: ClaimKey,
        options: Options,
    ) -> impl core::future::Future<Output = Begun<'_, C, R>> + Send;
}

#[cfg(feature = "async")]
impl<C> BeginClaim<C> for Sequential
where
    C: diesel_async::AsyncConnection,
    C::Backend: InboxBackend,
{
    async fn begin<P: Reply<R>, R>(
        self,
        conn: &mut C,
        key: ClaimKey,
        options: Options,
    ) -> Begun<'_, C, R> {
        use crate::delivery::asynchronous::claim_in_new_level;
        begun(claim_in_new_level::<P, C, R>(conn, key, options).await)
    }
}

#[cfg(all(feature = "async", feature = "postgres"))]
impl<C: Pipelining> BeginClaim<C> for Pipelined {
    async fn begin<P: Reply<R>, R>(
        self,
        conn: &mut C,
        key: ClaimKey,
        options: Options,
    ) -> Begun<'_, C, R> {
        use crate::delivery::pipelined::claim_in_new_level;
        begun(claim_in_new_level::<P, R, C>(conn, key, options).await)
    }
}

/// The delivery core's answer as [`Begun`].
#[cfg(feature = "async")]
fn begun<C: diesel_async::AsyncConnection, R>(
    begun: Result<crate::delivery::single::Begun<R, crate::ClaimedTransaction<'_, C>>, InboxError>,
) -> Begun<'_, C, R> {
    use crate::delivery::single::Begun as Core;
    match begun {
        Ok(Core::Claimed(claimed)) => Ok(claimed),
        Ok(Core::Answered(answer)) => Err(Ok(answer)),
        Err(error) => Err(Err(error)),
    }
}

/// Pins the body's future to the handler's return type, so `?` and `return`
/// in the body convert to it.
pub fn typed<T, F: core::future::Future<Output = T>>(body: F) -> F {
    body
}

/// What the body runs in: the delivery's span (feature `tracing`), and
/// what collects the statements it leaves for the commit (an outgoing
/// message). Taken before the body borrows the transaction's connection.
#[cfg(feature = "async")]
pub fn observed<C>(claimed: &crate::ClaimedTransaction<'_, C>) -> BodyStart
where
    C: diesel_async::AsyncConnection,
    C::Backend: InboxBackend,
{
    claimed.body_start()
}

/// Runs the body's future as `start` says, catching a panic so the
/// transaction can be rolled back before it resumes.
#[cfg(feature = "async")]
pub async fn catch_unwind<F: core::future::Future>(
    start: BodyStart,
    body: F,
) -> BodyRan<F::Output> {
    crate::delivery::single::run_body(start, body).await
}

#[cfg(feature = "async")]
pub use crate::delivery::single::{BodyRan, BodyStart};

/// The last step of an async handler: commits or rolls back by the body's
/// result, and resumes a panic after rolling back.
#[cfg(feature = "async")]
pub async fn finish_async<C, T>(claimed: crate::ClaimedTransaction<'_, C>, ran: BodyRan<T>) -> T
where
    C: diesel_async::AsyncConnection,
    C::Backend: InboxBackend,
    T: HandlerResult,
    T::Err: HandlerError,
{
    T::from_result(
        claimed
            .finish_or_resume(ran.map(HandlerResult::into_result))
            .await,
    )
}

/// [`finish_async`] for `store_result`: the body's result is stored with
/// the claim before the commit (a result that cannot be stored fails the
/// delivery and rolls it back, without counting a failed attempt).
#[cfg(feature = "async")]
pub async fn finish_async_storing<C, T>(
    claimed: crate::ClaimedTransaction<'_, C>,
    ran: BodyRan<T>,
) -> T
where
    C: diesel_async::AsyncConnection,
    C::Backend: InboxBackend,
    T: HandlerResult,
    T::Ok: StoredResult,
    T::Err: HandlerError,
{
    T::from_result(
        claimed
            .finish_replying::<crate::stored::Storing, _, _>(ran.map(HandlerResult::into_result))
            .await,
    )
}

/// Stands in for `begin_async` when the `async` feature is off, so an
/// `async fn` handler fails to compile with one sentence that names the
/// missing feature (the other steps below type-check and add no error).
#[cfg(not(feature = "async"))]
pub fn begin_async<C, T, R>(
    _route: R,
    conn: &mut C,
    _key: Result<ClaimKey, InboxError>,
    _options: Options,
) -> core::future::Pending<Result<AsyncUnavailable<'_, C>, T>>
where
    C: AsyncFeatureEnabled,
{
    let _ = conn;
    core::future::pending()
}

/// Stands in for `begin_async_storing` without the `async` feature.
#[cfg(not(feature = "async"))]
pub fn begin_async_storing<C, T, R>(
    route: R,
    conn: &mut C,
    key: Result<ClaimKey, InboxError>,
    options: Options,
) -> core::future::Pending<Result<AsyncUnavailable<'_, C>, T>>
where
    C: AsyncFeatureEnabled,
{
    begin_async(route, conn, key, options)
}

/// Stands in for `finish_async_storing` without the `async` feature.
#[cfg(not(feature = "async"))]
pub fn finish_async_storing<X, T>(
    transaction: X,
    result: Result<T, Box<dyn core::any::Any + Send>>,
) -> core::future::Pending<T> {
    finish_async(transaction, result)
}

/// What `begin_async` would return without the `async` feature.
#[cfg(not(feature = "async"))]
pub struct AsyncUnavailable<'c, C>(&'c mut C);

#[cfg(not(feature = "async"))]
impl<C> AsyncUnavailable<'_, C> {
    /// The connection.
    pub fn conn(&mut self) -> &mut C {
        self.0
    }
}

/// Stands in for `observed` without the `async` feature.
#[cfg(not(feature = "async"))]
pub fn observed<X>(_transaction: &X) -> BodyScope {
    BodyScope::none()
}

/// Stands in for `catch_unwind` without the `async` feature.
#[cfg(not(feature = "async"))]
pub fn catch_unwind<F: core::future::Future>(
    _scope: BodyScope,
    _body: F,
) -> core::future::Pending<Result<F::Output, Box<dyn core::any::Any + Send>>> {
    core::future::pending()
}

/// Stands in for `finish_async` without the `async` feature.
#[cfg(not(feature = "async"))]
pub fn finish_async<X, T>(
    _transaction: X,
    _result: Result<T, Box<dyn core::any::Any + Send>>,
) -> core::future::Pending<T> {
    core::future::pending()
}

/// Implemented by nothing: see [`begin_async`].
#[cfg(not(feature = "async"))]
#[diagnostic::on_unimplemented(
    message = "async handlers need the `async` feature of `inbox-runtime`",
    label = "`{Self}` would be an async (diesel-async) connection",
    note = "enable it in Cargo.toml: `inbox-runtime = {{ version = \"0.1\", features = [\"async\", \"postgres\"] }}`"
)]
pub trait AsyncFeatureEnabled {}
