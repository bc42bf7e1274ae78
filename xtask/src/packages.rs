//! The system packages the chosen backends need, installed with `apt-get`
//! when they are missing.

use std::process::Command;

use inbox_test_servers::{
    GaleraCluster, HaProxy, MariaDbServer, NatsServer, PgBouncer, PgFormation, PgServer,
    RabbitMqNode,
};

use crate::backend::Backend;

/// Something the tests need from the system, and the Debian packages that
/// bring it.
struct Requirement {
    what: &'static str,
    needed_by: Need,
    packages: Packages,
    present: fn() -> bool,
}

/// The Debian packages of a [`Requirement`].
enum Packages {
    /// The same on every release.
    Fixed(&'static [&'static str]),
    /// Named after something on the machine (the PostgreSQL version).
    Named(fn() -> Vec<String>),
}

impl Packages {
    fn names(&self) -> Vec<String> {
        match self {
            Packages::Fixed(names) => names.iter().map(|name| (*name).to_owned()).collect(),
            Packages::Named(names) => names(),
        }
    }
}

/// Which runs need a [`Requirement`].
enum Need {
    /// Any run that tests one of these backends.
    AnyOf(&'static [Backend]),
    /// The whole suite only (its brokers, see [`Backend::whole_suite`]).
    WholeSuite,
}

impl Need {
    fn of(&self, backends: &[Backend]) -> bool {
        match self {
            Need::AnyOf(needing) => needing.iter().any(|b| backends.contains(b)),
            Need::WholeSuite => Backend::whole_suite(backends),
        }
    }
}

const REQUIREMENTS: &[Requirement] = &[
    Requirement {
        what: "pkg-config (how Diesel's client libraries are found)",
        needed_by: Need::AnyOf(&[Backend::Postgres, Backend::Mysql]),
        packages: Packages::Fixed(&["pkg-config"]),
        present: || program("pkg-config", &["--version"]),
    },
    Requirement {
        what: "libpq, PostgreSQL's client library",
        needed_by: Need::AnyOf(&[Backend::Postgres]),
        packages: Packages::Fixed(&["libpq-dev"]),
        present: || program("pkg-config", &["--exists", "libpq"]),
    },
    Requirement {
        what: "the PostgreSQL server binaries (initdb, pg_ctl, psql)",
        needed_by: Need::AnyOf(&[Backend::Postgres]),
        packages: Packages::Fixed(&["postgresql"]),
        present: || PgServer::bin_dir().is_ok_and(|bin| bin.join("psql").exists()),
    },
    Requirement {
        what: "PgBouncer, for the tests behind a connection pooler",
        needed_by: Need::AnyOf(&[Backend::Postgres]),
        packages: Packages::Fixed(&["pgbouncer"]),
        present: || PgBouncer::installed().is_ok(),
    },
    Requirement {
        what: "pg_auto_failover, for the tests under an HA manager",
        needed_by: Need::AnyOf(&[Backend::Postgres]),
        packages: Packages::Named(PgFormation::packages),
        present: || PgFormation::installed().is_ok(),
    },
    Requirement {
        what: "the MariaDB client library (libmysqlclient)",
        needed_by: Need::AnyOf(&[Backend::Mysql]),
        packages: Packages::Fixed(&["libmariadb-dev", "libmariadb-dev-compat"]),
        present: || {
            program("pkg-config", &["--exists", "mysqlclient"])
                || program("pkg-config", &["--exists", "libmariadb"])
        },
    },
    Requirement {
        what: "the MariaDB server binaries (mariadbd, mariadb-install-db, mariadb)",
        needed_by: Need::AnyOf(&[Backend::Mysql]),
        packages: Packages::Fixed(&["mariadb-server"]),
        present: || MariaDbServer::installed().is_ok(),
    },
    Requirement {
        what: "Galera and rsync, for the 3-node cluster tests",
        needed_by: Need::AnyOf(&[Backend::Mysql]),
        packages: Packages::Fixed(&["mariadb-server", "galera-4", "rsync"]),
        present: || GaleraCluster::installed().is_ok(),
    },
    Requirement {
        what: "HAProxy, for the Galera tests through a proxy",
        needed_by: Need::AnyOf(&[Backend::Mysql]),
        packages: Packages::Fixed(&["haproxy"]),
        present: || HaProxy::installed().is_ok(),
    },
    Requirement {
        what: "RabbitMQ, for the broker and outbox suites",
        needed_by: Need::WholeSuite,
        packages: Packages::Fixed(&["rabbitmq-server"]),
        present: || RabbitMqNode::installed().is_ok(),
    },
    Requirement {
        what: "nats-server, for the broker and outbox suites",
        needed_by: Need::WholeSuite,
        packages: Packages::Fixed(&["nats-server"]),
        present: || NatsServer::binary().is_ok(),
    },
];

/// Makes sure everything `backends` need is installed: installs what is
/// missing with `apt-get` (as root, or with `sudo -n`), or fails naming the
/// command to run.
pub fn ensure(backends: &[Backend]) -> Result<(), String> {
    let absent = missing(backends);
    if absent.is_empty() {
        return Ok(());
    }
    let mut packages: Vec<String> = Vec::new();
    for requirement in &absent {
        eprintln!("xtask: missing {}", requirement.what);
        for package in requirement.packages.names() {
            if !packages.contains(&package) {
                packages.push(package);
            }
        }
    }
    let install = format!("apt-get install -y {}", packages.join(" "));
    let Some(sudo) = privilege() else {
        return Err(format!(
            "cannot install them (neither root nor passwordless sudo); run:\n    \
             sudo apt-get update && sudo {install}\n(or point INBOX_TEST_POSTGRES_URL, \
             INBOX_TEST_MYSQL_URL, INBOX_TEST_AMQP_URL and INBOX_TEST_NATS_URL at servers of \
             yours; the client libraries are still needed)"
        ));
    };
    if !program("apt-get", &["--version"]) {
        return Err(format!(
            "no apt-get here: install the equivalent of Debian's `{}`",
            packages.join(" ")
        ));
    }
    eprintln!("xtask: installing {}", packages.join(" "));
    apt(sudo, &["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq"];
    args.extend(packages.iter().map(String::as_str));
    apt(sudo, &args)?;
    let still: Vec<&str> = missing(backends).iter().map(|r| r.what).collect();
    if still.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "still missing after `{install}`: {}",
            still.join("; ")
        ))
    }
}

/// The requirements of `backends` that are not met.
fn missing(backends: &[Backend]) -> Vec<&'static Requirement> {
    REQUIREMENTS
        .iter()
        .filter(|r| r.needed_by.of(backends))
        .filter(|r| !(r.present)())
        .collect()
}

/// How to run `apt-get` with the right to install: directly (`Some(false)`,
/// as root), with `sudo -n` (`Some(true)`), or not at all.
fn privilege() -> Option<bool> {
    if inbox_test_servers::running_as_root() {
        Some(false)
    } else if program("sudo", &["-n", "true"]) {
        Some(true)
    } else {
        None
    }
}

fn apt(sudo: bool, args: &[&str]) -> Result<(), String> {
    let mut command = if sudo {
        let mut command = Command::new("sudo");
        command.args(["-n", "env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]);
        command
    } else {
        let mut command = Command::new("apt-get");
        command.env("DEBIAN_FRONTEND", "noninteractive");
        command
    };
    command.args(args);
    let status = command.status().map_err(|e| format!("{command:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{command:?}: {status}"))
    }
}

/// Whether `program args` runs and succeeds (its output discarded).
fn program(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}
