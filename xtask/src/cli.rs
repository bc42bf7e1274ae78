//! The command line of `cargo xtask`.

use crate::backend::Backend;

/// What `cargo xtask help` prints.
pub const USAGE: &str = "\
usage: cargo xtask test [--backend postgres|mysql|sqlite]... [-- <cargo test args>]
       cargo xtask deps [--backend postgres|mysql|sqlite]...

test   installs what the chosen backends need (apt-get, as root or with sudo -n),
       starts throwaway PostgreSQL and MariaDB servers (unless INBOX_TEST_POSTGRES_URL
       or INBOX_TEST_MYSQL_URL name servers to use) and, for the whole suite, a
       RabbitMQ node and a NATS server with JetStream (unless INBOX_TEST_AMQP_URL or
       INBOX_TEST_NATS_URL name brokers to use), runs the tests with
       INBOX_REQUIRE_DATABASES=1 and INBOX_TEST_REQUIRE_BROKERS=1, then stops and
       removes the servers and brokers, also on failure or Ctrl-C.
       No --backend: every backend, `cargo test --workspace --all-features`.
       --backend X: the quick loop, inbox-runtime and the suite with feature X alone.
deps   only installs (or names) the system packages the chosen backends need.";

/// A parsed command line.
#[derive(Debug, PartialEq)]
pub enum Command {
    /// `cargo xtask test`.
    Test {
        /// The backends to test; every backend when none was named.
        backends: Vec<Backend>,
        /// What follows `--`, passed on to `cargo test`.
        cargo_args: Vec<String>,
    },
    /// `cargo xtask deps`.
    Deps {
        /// The backends whose packages to install.
        backends: Vec<Backend>,
    },
    /// `xtask __serve`: the guardian of the servers (see [`crate::guard`]).
    Serve {
        /// The backends whose servers to start.
        backends: Vec<Backend>,
    },
    /// `cargo xtask help`, or no command.
    Help,
}

/// Parses the arguments after `cargo xtask`.
pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Command, String> {
    let command = match args.next().as_deref() {
        None | Some("help" | "--help" | "-h") => return Ok(Command::Help),
        Some(command @ ("test" | "deps" | crate::guard::SERVE)) => command.to_owned(),
        Some(other) => return Err(format!("unknown command `{other}`\n{USAGE}")),
    };
    let mut backends = Vec::new();
    let mut cargo_args = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--" if command == "test" => cargo_args.extend(args.by_ref()),
            "--backend" => {
                let name = args.next().ok_or("--backend needs a name")?;
                add(&mut backends, Backend::parse(&name)?);
            }
            other => match other.strip_prefix("--backend=") {
                Some(name) => add(&mut backends, Backend::parse(name)?),
                None => return Err(format!("unexpected `{other}`\n{USAGE}")),
            },
        }
    }
    if backends.is_empty() {
        backends = Backend::ALL.to_vec();
    }
    Ok(match command.as_str() {
        "test" => Command::Test {
            backends,
            cargo_args,
        },
        "deps" => Command::Deps { backends },
        _ => Command::Serve { backends },
    })
}

/// Adds `backend` unless already named.
fn add(backends: &mut Vec<Backend>, backend: Backend) {
    if !backends.contains(&backend) {
        backends.push(backend);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<Command, String> {
        parse(line.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn every_backend_by_default() {
        assert_eq!(
            parse_str("test"),
            Ok(Command::Test {
                backends: Backend::ALL.to_vec(),
                cargo_args: vec![],
            })
        );
    }

    #[test]
    fn one_backend_and_cargo_arguments() {
        assert_eq!(
            parse_str("test --backend mysql -- --test e2e -- --nocapture"),
            Ok(Command::Test {
                backends: vec![Backend::Mysql],
                cargo_args: ["--test", "e2e", "--", "--nocapture"]
                    .map(str::to_owned)
                    .to_vec(),
            })
        );
    }

    #[test]
    fn unknown_backend_is_an_error() {
        assert!(parse_str("test --backend oracle").is_err());
        assert!(parse_str("deps -- --nocapture").is_err());
    }
}
