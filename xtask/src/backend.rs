//! The database backends the suite runs against.

use std::fmt;

/// One backend: a cargo feature of `inbox-runtime` and of the test suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A server: a throwaway one, or `INBOX_TEST_POSTGRES_URL`.
    Postgres,
    /// A server: a throwaway MariaDB, or `INBOX_TEST_MYSQL_URL`.
    Mysql,
    /// Embedded (bundled): no server, no system library.
    Sqlite,
}

impl Backend {
    /// Every backend, which is what `cargo xtask test` runs without `--backend`.
    pub const ALL: [Backend; 3] = [Backend::Postgres, Backend::Mysql, Backend::Sqlite];

    /// Whether `backends` are every backend: the whole suite
    /// (`--workspace --all-features`), whose chaos and outbox suites also
    /// need RabbitMQ and NATS.
    pub fn whole_suite(backends: &[Backend]) -> bool {
        Backend::ALL
            .iter()
            .all(|backend| backends.contains(backend))
    }

    /// The backend named `name` on the command line.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "postgres" | "postgresql" | "pg" => Ok(Backend::Postgres),
            "mysql" | "mariadb" => Ok(Backend::Mysql),
            "sqlite" => Ok(Backend::Sqlite),
            other => Err(format!(
                "unknown backend `{other}` (postgres, mysql or sqlite)"
            )),
        }
    }

    /// Its cargo feature, in `inbox-runtime` and in the test suite alike.
    pub fn feature(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
            Backend::Sqlite => "sqlite",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.feature())
    }
}
