//! The service: its configuration, connection pool, router and server.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use diesel::connection::SimpleConnection;
use diesel::r2d2::{ConnectionManager, CustomizeConnection};
use diesel::PgConnection;
use inbox_runtime::StoredOutcome;

use super::key::idempotency_key;
use super::payments::{create_payment, CreatePayment, NewPayment, StoredResponse, SCHEMA_SQL};
use super::problem::Problem;
use super::BoxError;

/// A pool of blocking PostgreSQL connections.
pub type Pool = diesel::r2d2::Pool<ConnectionManager<PgConnection>>;

/// The header a replayed response carries.
pub const REPLAYED: &str = "idempotent-replayed";

/// The largest request body accepted (larger: 413).
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// How the service connects and how long it waits.
///
/// ```
/// use std::time::Duration;
/// use inbox_examples::http::Config;
/// let config = Config::new("postgres://postgres@127.0.0.1:5432/test");
/// assert_eq!(config.claim_wait, Duration::from_secs(2));
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    /// The PostgreSQL URL.
    pub database_url: String,
    /// The schema the service's tables live in (every connection sets
    /// `search_path` to it, and [`PaymentsService::setup`] creates it);
    /// `None`: the URL's own `search_path`. Lowercase letters, digits, `_`.
    pub schema: Option<String>,
    /// How long a retry waits for a request with the same key still in
    /// flight before it gets 409: the handler's claim wait
    /// (`#[idempotent(claim_wait = req.claim_wait)]`), past which the
    /// runtime answers `InboxError::InProgress`.
    pub claim_wait: Duration,
    /// The most connections the pool opens (each request in flight holds
    /// one, waiting retries included).
    pub pool_size: u32,
    /// How long a request waits for a connection before it gets 503.
    pub pool_timeout: Duration,
    /// How long the handler's body keeps its transaction open after the
    /// insert: zero in production; it stands for slower work inside the
    /// transaction (the tests use it to keep a request in flight).
    pub hold: Duration,
}

impl Config {
    /// The defaults for `database_url`: no schema of its own, a 2 s claim
    /// wait, 16 connections, a 5 s pool timeout, no hold.
    pub fn new(database_url: impl Into<String>) -> Self {
        Config {
            database_url: database_url.into(),
            schema: None,
            claim_wait: Duration::from_secs(2),
            pool_size: 16,
            pool_timeout: Duration::from_secs(5),
            hold: Duration::ZERO,
        }
    }

    fn session_sql(&self) -> Result<String, BoxError> {
        let mut sql = String::new();
        if let Some(schema) = &self.schema {
            let valid = !schema.is_empty()
                && schema
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !valid {
                return Err(
                    format!("schema {schema:?}: lowercase letters, digits and _ only").into(),
                );
            }
            sql.push_str(&format!("SET search_path TO {schema};"));
        }
        Ok(sql)
    }
}

/// Sets each new connection's session: its `search_path`.
#[derive(Debug)]
struct Session {
    sql: String,
}

impl CustomizeConnection<PgConnection, diesel::r2d2::Error> for Session {
    fn on_acquire(&self, conn: &mut PgConnection) -> Result<(), diesel::r2d2::Error> {
        if self.sql.is_empty() {
            return Ok(());
        }
        conn.batch_execute(&self.sql)
            .map_err(diesel::r2d2::Error::QueryError)
    }
}

/// The service: a pool and the handler's settings. Cheap to clone (the
/// router's state).
#[derive(Clone)]
pub struct PaymentsService {
    pool: Pool,
    schema: Option<String>,
    hold: Duration,
    claim_wait: Duration,
}

impl std::fmt::Debug for PaymentsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaymentsService")
            .field("schema", &self.schema)
            .field("hold", &self.hold)
            .finish_non_exhaustive()
    }
}

impl PaymentsService {
    /// The service for `config`. The pool connects lazily, so a service
    /// whose database is down starts, and answers 503 until it is back.
    pub fn new(config: &Config) -> Result<Self, BoxError> {
        let manager = ConnectionManager::<PgConnection>::new(&config.database_url);
        let pool = Pool::builder()
            .max_size(config.pool_size)
            .min_idle(Some(0))
            .connection_timeout(config.pool_timeout)
            .connection_customizer(Box::new(Session {
                sql: config.session_sql()?,
            }))
            .build_unchecked(manager);
        Ok(PaymentsService {
            pool,
            schema: config.schema.clone(),
            hold: config.hold,
            claim_wait: config.claim_wait,
        })
    }

    /// The pool (for checks of the database's state).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Creates the schema (if configured), the inbox's tables
    /// (`inbox_runtime::setup`) and the payments table; idempotent.
    /// Blocking.
    pub fn setup(&self) -> Result<(), BoxError> {
        let mut conn = self.pool.get()?;
        if let Some(schema) = &self.schema {
            conn.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))?;
        }
        inbox_runtime::setup(&mut *conn)?;
        conn.batch_execute(SCHEMA_SQL)?;
        Ok(())
    }

    /// The router: `POST /payments`.
    pub fn router(self) -> Router {
        Router::new()
            .route("/payments", post(create))
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
            .with_state(self)
    }

    /// Handles one request, blocking: what `POST /payments` runs on
    /// tokio's blocking pool.
    fn create_blocking(&self, request: &CreatePayment) -> Result<Response, Problem> {
        let mut conn = self
            .pool
            .get()
            .map_err(|error| Problem::unavailable(format!("no database connection: {error}")))?;
        match create_payment(&mut conn, request) {
            Ok(StoredOutcome::Processed(response)) => Ok(respond(&response, false)),
            Ok(StoredOutcome::Replayed(response)) => Ok(respond(&response, true)),
            Ok(StoredOutcome::Duplicate) => Err(Problem::no_stored_response(&request.key)),
            Err(error) => Err(Problem::of_error(&error)),
        }
    }
}

/// `POST /payments`: the key, then the body, are checked before anything
/// is claimed; then the idempotent handler runs on a pooled connection.
async fn create(
    State(service): State<PaymentsService>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = match idempotency_key(&headers) {
        Ok(key) => key,
        Err(error) => return Problem::of_key(&error).into_response(),
    };
    let payment = match NewPayment::parse(&body) {
        Ok(payment) => payment,
        Err(invalid) => return Problem::of_body(&invalid).into_response(),
    };
    let request = CreatePayment {
        key,
        body: body.to_vec(),
        payment,
        hold: service.hold,
        claim_wait: inbox_runtime::ClaimWait::Bounded(service.claim_wait),
    };
    let outcome = tokio::task::spawn_blocking(move || service.create_blocking(&request)).await;
    match outcome {
        Ok(Ok(response)) => response,
        Ok(Err(problem)) => problem.into_response(),
        Err(join_error) => {
            Problem::internal(format!("the handler did not finish: {join_error}")).into_response()
        }
    }
}

/// The stored response, as sent; a replay says so in `Idempotent-Replayed`.
fn respond(stored: &StoredResponse, replayed: bool) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, stored.body.clone()).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if replayed {
        headers.insert(REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// Serves `router` on `listener` until `shutdown` completes, then lets the
/// requests in flight finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// A service running on a tokio runtime of its own, on a thread of its own:
/// for tests, and for programs that are not async. Stopped (gracefully) on
/// drop.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    /// Binds `addr` (port 0: any free port) and serves `service` there.
    pub fn spawn(service: PaymentsService, addr: SocketAddr) -> std::io::Result<Server> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("http-{addr}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)?;
                    serve(listener, service.router(), async {
                        let _ = stopped.await;
                    })
                    .await
                })
            })?;
        Ok(Server {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
