//! A service of a test's own: a PostgreSQL schema of its own (the
//! harness's), the service on a free port of 127.0.0.1, and what the tests
//! read back from the database.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use inbox_examples::http::{Config, HANDLER, PaymentsService, Server};
use inbox_tests::{Postgres, ServerBackend, SqlRows, TestBackend, unique_name};

use crate::client::{self, Response};

/// A running service and its database. The server is stopped before the
/// schema is dropped (field order).
pub struct Service {
    server: Server,
    db: Postgres,
    /// The pool's `application_name`: its connections, in
    /// `pg_stat_activity`.
    tag: String,
}

impl Service {
    /// A service with the default settings.
    pub fn start() -> Option<Service> {
        Service::with(|_| {})
    }

    /// A service whose [`Config`] `configure` adjusts; `None` after the
    /// harness's `skipped:` line when PostgreSQL cannot be reached.
    pub fn with(configure: impl FnOnce(&mut Config)) -> Option<Service> {
        let db = Postgres::open()?;
        let tag = unique_name("http");
        let mut config = Config::new(db.tagged_url(&tag));
        configure(&mut config);
        let service = PaymentsService::new(&config).expect("the service");
        service.setup().expect("the payments table");
        let server = Server::spawn(service, loopback()).expect("the server");
        Some(Service { server, db, tag })
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `POST /payments` with `key` (none: no header) and `body`.
    pub fn post(&self, key: Option<&str>, body: &str) -> Response {
        match key {
            Some(key) => self.post_raw(&[("Idempotency-Key", key.as_bytes())], body),
            None => self.post_raw(&[], body),
        }
    }

    /// `POST /payments` with these headers.
    pub fn post_raw(&self, headers: &[(&str, &[u8])], body: &str) -> Response {
        client::post(self.addr(), "/payments", headers, body.as_bytes())
    }

    /// Payments created with `key`.
    pub fn payments(&self, key: &str) -> i64 {
        self.db.connect().bigint(&format!(
            "SELECT count(*) AS value FROM http_payments WHERE idempotency_key = {}",
            literal(key)
        ))
    }

    /// The amounts of the payments created with `key`.
    pub fn amounts(&self, key: &str) -> Vec<i64> {
        self.db.connect().bigints(&format!(
            "SELECT amount_cents AS value FROM http_payments WHERE idempotency_key = {} ORDER BY id",
            literal(key)
        ))
    }

    /// Every payment.
    pub fn all_payments(&self) -> i64 {
        self.db
            .connect()
            .bigint("SELECT count(*) AS value FROM http_payments")
    }

    /// The keys the inbox holds for the endpoint.
    pub fn claims(&self) -> i64 {
        self.db.connect().bigint(&format!(
            "SELECT count(*) AS value FROM inbox_messages WHERE handler = '{HANDLER}'"
        ))
    }

    /// Runs `sql` on the service's database (what an operator or another
    /// program does to its tables).
    pub fn execute(&self, sql: &str) {
        use diesel::connection::SimpleConnection;
        self.db
            .connect()
            .batch_execute(sql)
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }

    /// Ends the service's connections on the server's side
    /// (`pg_terminate_backend`), as a restart or a failover would.
    pub fn terminate_connections(&self) {
        let killed = self.db.connect().bigint(&format!(
            "SELECT count(pg_terminate_backend(pid, 5000)) AS value FROM pg_stat_activity \
             WHERE application_name = '{}'",
            self.tag
        ));
        assert!(killed > 0, "the service has connections");
    }

    /// Waits until `n` of the service's connections sit inside a
    /// transaction (a request in flight, holding its claim).
    pub fn wait_in_flight(&self, n: i64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let sql = format!(
            "SELECT count(*) AS value FROM pg_stat_activity \
             WHERE application_name = '{}' AND state = 'idle in transaction'",
            self.tag
        );
        let mut conn = self.db.connect();
        while conn.bigint(&sql) < n {
            assert!(Instant::now() < deadline, "no request in flight after 20 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Any free port of 127.0.0.1.
pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// `text` as an SQL string literal.
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A payment request body.
pub fn payment(account: &str, amount_cents: i64) -> String {
    format!(r#"{{"account":"{account}","amount_cents":{amount_cents},"currency":"EUR"}}"#)
}
