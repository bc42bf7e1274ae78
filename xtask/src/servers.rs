//! The suite's servers: throwaway ones, or those the environment names.

use std::time::Instant;

use inbox_test_servers::{MariaDbServer, PgServer};

use crate::backend::Backend;

/// Where the suite finds PostgreSQL (`postgres://…/test`).
const POSTGRES_URL: &str = "INBOX_TEST_POSTGRES_URL";
/// Where the suite finds MariaDB/MySQL (`mysql://…/test`).
const MYSQL_URL: &str = "INBOX_TEST_MYSQL_URL";
/// The PostgreSQL binaries for the suite's own throwaway servers.
const PG_BIN: &str = "INBOX_TEST_PG_BIN";
/// The database the suite's URLs name.
const DATABASE: &str = "test";

/// The servers of one run, stopped and removed on drop, and the environment
/// that points the suite at them (held by the guardian, see [`crate::guard`]).
pub struct Servers {
    // Held for their drop.
    _postgres: Option<PgServer>,
    _mariadb: Option<MariaDbServer>,
    environment: Vec<(&'static str, String)>,
}

impl Servers {
    /// Starts a throwaway server for each backend of `backends` that needs
    /// one, unless its URL variable is set, and creates database `test`.
    pub fn start(backends: &[Backend]) -> Result<Self, String> {
        let mut servers = Servers {
            _postgres: None,
            _mariadb: None,
            environment: Vec::new(),
        };
        if backends.contains(&Backend::Postgres) {
            if std::env::var_os(PG_BIN).is_none() {
                let bin = PgServer::bin_dir()?;
                servers
                    .environment
                    .push((PG_BIN, bin.display().to_string()));
            }
            if let Some(url) = given(POSTGRES_URL) {
                eprintln!("xtask: PostgreSQL at {} ({POSTGRES_URL})", redacted(&url));
            } else {
                let started = Instant::now();
                let server = PgServer::start_protected()?;
                server.create_database(DATABASE)?;
                let url = server.url_of(DATABASE);
                eprintln!(
                    "xtask: throwaway PostgreSQL at {} ready in {:.1} s",
                    redacted(&url),
                    started.elapsed().as_secs_f64()
                );
                servers.environment.push((POSTGRES_URL, url));
                servers._postgres = Some(server);
            }
        }
        if backends.contains(&Backend::Mysql) {
            if let Some(url) = given(MYSQL_URL) {
                eprintln!("xtask: MariaDB/MySQL at {} ({MYSQL_URL})", redacted(&url));
            } else {
                let started = Instant::now();
                let server = MariaDbServer::start()?;
                server.create_database(DATABASE)?;
                let url = server.url_of(DATABASE);
                eprintln!(
                    "xtask: throwaway MariaDB at {} ready in {:.1} s",
                    redacted(&url),
                    started.elapsed().as_secs_f64()
                );
                servers.environment.push((MYSQL_URL, url));
                servers._mariadb = Some(server);
            }
        }
        Ok(servers)
    }

    /// The variables to set for the suite (the URLs of the servers started
    /// here, and `INBOX_TEST_PG_BIN`).
    pub fn environment(&self) -> &[(&'static str, String)] {
        &self.environment
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        if self._postgres.is_some() || self._mariadb.is_some() {
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
