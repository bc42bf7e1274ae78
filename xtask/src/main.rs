//! The workspace's own commands, run as `cargo xtask <command>` (an alias in
//! `.cargo/config.toml`).
//!
//! `cargo xtask test [--backend postgres|mysql|sqlite]… [-- <cargo test args>]`
//! sets the test suite up and runs it:
//!
//! 1. checks for the client libraries and server binaries the chosen
//!    backends need, and installs the missing ones with `apt-get` when it can
//!    (as root, or with `sudo -n`), else fails with the command to run;
//! 2. unless `INBOX_TEST_POSTGRES_URL` / `INBOX_TEST_MYSQL_URL` point it at
//!    existing servers, starts throwaway PostgreSQL and MariaDB servers
//!    (a temporary directory, a free port on 127.0.0.1, a random password)
//!    and creates database `test` on each; for the whole suite, unless
//!    `INBOX_TEST_AMQP_URL` / `INBOX_TEST_NATS_URL` point it at existing
//!    brokers, also a RabbitMQ node (its own name, cookie, ports and port
//!    mapper) and a NATS server with JetStream (a temporary store);
//! 3. runs the suite with `INBOX_REQUIRE_DATABASES=1` and
//!    `INBOX_TEST_REQUIRE_BROKERS=1` (a server or broker that cannot be
//!    reached fails its tests): every backend is
//!    `cargo test --workspace --all-features`, in phases that keep both CPUs
//!    busy (see [`phases`]), one backend the quick loop of `inbox-runtime`
//!    and the suite with that backend's feature alone;
//! 4. stops and removes the servers and brokers, and the suite's `TMPDIR`
//!    with whatever a test left running from it, also when the tests fail or
//!    on Ctrl-C (they live in a guardian process, see [`guard`]), and exits
//!    with cargo's code.
//!
//! `cargo xtask deps [--backend …]` does step 1 alone (`.ci/run` calls it
//! before its lints, which build every backend).

mod backend;
mod cli;
mod guard;
mod packages;
mod phases;
mod scratch;
mod servers;
mod suite;

use std::process::ExitCode;
use std::time::Instant;

use cli::Command;

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(error) => {
            eprintln!("xtask: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<ExitCode, String> {
    let command = cli::parse(std::env::args().skip(1))?;
    match command {
        Command::Help => {
            println!("{}", cli::USAGE);
            Ok(ExitCode::SUCCESS)
        }
        Command::Deps { backends } => {
            packages::ensure(&backends)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve { backends } => {
            guard::serve(&backends)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Test {
            backends,
            cargo_args,
        } => {
            let started = Instant::now();
            packages::ensure(&backends)?;
            // The servers are stopped and removed when the guard is dropped,
            // whatever the suite's outcome (and when this process dies).
            let servers = guard::Guard::spawn(&backends)?;
            let code = suite::run(&backends, &cargo_args, servers.environment())?;
            drop(servers);
            eprintln!(
                "xtask: done in {:.1} s (exit code {code})",
                started.elapsed().as_secs_f64()
            );
            Ok(ExitCode::from(code))
        }
    }
}
