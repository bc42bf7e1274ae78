//! The suite's servers and brokers: throwaway ones, or those the
//! environment names.

use std::time::Instant;

use inbox_test_servers::{MariaDbServer, NatsServer, PgBouncer, PgServer, PoolMode, RabbitMqNode};

use crate::backend::Backend;

/// Where the suite finds PostgreSQL (`postgres://…/test`).
const POSTGRES_URL: &str = "INBOX_TEST_POSTGRES_URL";
/// PgBouncer (transaction pooling) in front of the suite's PostgreSQL, for
/// the suites' pass through it (see [`crate::phases`]).
pub const PGBOUNCER_URL: &str = "INBOX_TEST_PGBOUNCER_URL";
/// Server connections per database behind the suite's PgBouncer: more than
/// any test holds in open transactions at once.
const PGBOUNCER_POOL_SIZE: u32 = 20;
/// Where the suite finds MariaDB/MySQL (`mysql://…/test`).
const MYSQL_URL: &str = "INBOX_TEST_MYSQL_URL";
/// Where the suite finds RabbitMQ (`amqp://…`).
const AMQP_URL: &str = "INBOX_TEST_AMQP_URL";
/// Where the suite finds NATS with JetStream (`nats://…`).
const NATS_URL: &str = "INBOX_TEST_NATS_URL";
/// The PostgreSQL binaries for the suite's own throwaway servers.
const PG_BIN: &str = "INBOX_TEST_PG_BIN";
/// The database the suite's URLs name.
const DATABASE: &str = "test";

/// The servers of one run, stopped and removed on drop, and the environment
/// that points the suite at them (held by the guardian, see [`crate::guard`]).
pub struct Servers {
    // Held for their drop (the pooler before its server).
    _pgbouncer: Option<PgBouncer>,
    _postgres: Option<PgServer>,
    _mariadb: Option<MariaDbServer>,
    _rabbitmq: Option<RabbitMqNode>,
    _nats: Option<NatsServer>,
    environment: Vec<(&'static str, String)>,
}

impl Servers {
    /// Starts a throwaway server for each backend of `backends` that needs
    /// one, unless its URL variable is set, and creates database `test`;
    /// for the whole suite ([`Backend::whole_suite`]), also a RabbitMQ node
    /// and a NATS server with JetStream, unless their URL variables are set.
    pub fn start(backends: &[Backend]) -> Result<Self, String> {
        let mut servers = Servers {
            _pgbouncer: None,
            _postgres: None,
            _mariadb: None,
            _rabbitmq: None,
            _nats: None,
            environment: Vec::new(),
        };
        if backends.contains(&Backend::Postgres) {
            if std::env::var_os(PG_BIN).is_none() {
                let bin = PgServer::bin_dir()?;
                servers
                    .environment
                    .push((PG_BIN, bin.display().to_string()));
            }
            let postgres =
                servers.given_or_started(("PostgreSQL", "PostgreSQL"), POSTGRES_URL, || {
                    let server = PgServer::start_protected()?;
                    server.create_database(DATABASE)?;
                    let url = server.url_of(DATABASE);
                    Ok((server, url))
                })?;
            // In front of the throwaway server only. With a server given by
            // URL, a PgBouncer in front of it can be given too (by
            // `INBOX_TEST_PGBOUNCER_URL`, which the suite inherits).
            servers._pgbouncer = match &postgres {
                Some(server) => {
                    servers.given_or_started(("PgBouncer", "PgBouncer"), PGBOUNCER_URL, || {
                        let bouncer =
                            PgBouncer::start(server, PoolMode::Transaction, PGBOUNCER_POOL_SIZE)?;
                        let url = bouncer.url_of(DATABASE);
                        Ok((bouncer, url))
                    })?
                }
                None => None,
            };
            servers._postgres = postgres;
        }
        if backends.contains(&Backend::Mysql) {
            servers._mariadb =
                servers.given_or_started(("MariaDB/MySQL", "MariaDB"), MYSQL_URL, || {
                    let server = MariaDbServer::start()?;
                    server.create_database(DATABASE)?;
                    let url = server.url_of(DATABASE);
                    Ok((server, url))
                })?;
        }
        if Backend::whole_suite(backends) {
            servers._rabbitmq =
                servers.given_or_started(("RabbitMQ", "RabbitMQ"), AMQP_URL, || {
                    let node = RabbitMqNode::start()?;
                    let url = node.url();
                    Ok((node, url))
                })?;
            servers._nats =
                servers.given_or_started(("NATS", "NATS with JetStream"), NATS_URL, || {
                    let server = NatsServer::start()?;
                    let url = server.url();
                    Ok((server, url))
                })?;
        }
        Ok(servers)
    }

    /// The server at the URL in variable `variable` when it is set (`None`),
    /// otherwise the throwaway one `start` starts, its URL set for the suite.
    /// `names`: what the server is called in the log, given and throwaway.
    fn given_or_started<S>(
        &mut self,
        (given_name, throwaway_name): (&str, &str),
        variable: &'static str,
        start: impl FnOnce() -> Result<(S, String), String>,
    ) -> Result<Option<S>, String> {
        if let Some(url) = given(variable) {
            eprintln!("xtask: {given_name} at {} ({variable})", redacted(&url));
            return Ok(None);
        }
        let started = Instant::now();
        let (server, url) = start()?;
        eprintln!(
            "xtask: throwaway {throwaway_name} at {} ready in {:.1} s",
            redacted(&url),
            started.elapsed().as_secs_f64()
        );
        self.environment.push((variable, url));
        Ok(Some(server))
    }

    /// The variables to set for the suite (the URLs of the servers and
    /// brokers started here, and `INBOX_TEST_PG_BIN`).
    pub fn environment(&self) -> &[(&'static str, String)] {
        &self.environment
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        if self._postgres.is_some()
            || self._pgbouncer.is_some()
            || self._mariadb.is_some()
            || self._rabbitmq.is_some()
            || self._nats.is_some()
        {
            eprintln!("xtask: stopping the throwaway servers");
        }
    }
}

/// The value of `name` when set and not empty.
fn given(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|url| !url.is_empty())
}

/// `url` with its password, if any, replaced by `***`, for printing.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((credentials, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match credentials.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            redacted("mysql://inbox:s3cret@127.0.0.1:4000/test"),
            "mysql://inbox:***@127.0.0.1:4000/test"
        );
        assert_eq!(
            redacted("postgres://postgres@127.0.0.1:5432/test"),
            "postgres://postgres@127.0.0.1:5432/test"
        );
    }
}
