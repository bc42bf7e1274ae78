//! Throwaway database servers and brokers for the inbox test suite, on this machine
//! only: each one lives in a fresh temporary directory (mode 0700), listens
//! on 127.0.0.1 on a port the OS picks, and is stopped and removed on drop.
//!
//! - [`PgServer`]: a PostgreSQL server from the installed binaries
//!   (`initdb`, `pg_ctl`, `psql`), and streaming standbys of one
//!   (`pg_basebackup`), synchronous or asynchronous ([`Replication`]);
//! - [`MariaDbServer`]: a MariaDB server (`mariadb-install-db`, `mariadbd`)
//!   with a user of its own and a random password;
//! - [`GaleraCluster`]: a 3-node MariaDB Galera cluster;
//! - [`HaProxy`]: HAProxy routing to one server, the others as backups (in
//!   front of a Galera cluster);
//! - [`PgBouncer`]: PgBouncer in front of a [`PgServer`], in transaction or
//!   session pooling ([`PoolMode`]);
//! - [`PgFormation`]: a pg_auto_failover formation (a monitor and a
//!   primary/secondary pair that fails over by itself);
//! - [`NatsServer`]: a NATS server with JetStream (`nats-server -js`);
//! - [`RabbitMqNode`]: a RabbitMQ node with its own name, cookie, ports
//!   and port mapper.
//!
//! Standard library only, so that `cargo xtask` builds before any client
//! library is installed: SQL goes through the servers' own client binaries
//! (`psql`, `mariadb`). Run as root, the servers run as their system users
//! (`postgres`, `mysql`, `rabbitmq`), as their binaries require.
//!
//! ```no_run
//! use inbox_test_servers::{MariaDbServer, PgServer};
//!
//! let postgres = PgServer::start_protected()?; // scram-sha-256, random password
//! postgres.create_database("test")?;
//! let mariadb = MariaDbServer::start()?;
//! mariadb.create_database("test")?;
//! println!("{}\n{}", postgres.url_of("test"), mariadb.url_of("test"));
//! // Both are stopped and their directories removed here, on drop.
//! # Ok::<(), String>(())
//! ```

pub mod galera;
mod haproxy;
mod mariadb;
mod nats;
mod pg_auto_failover;
mod pgbouncer;
mod postgres;
mod process;
mod rabbitmq;
mod secret;

pub use galera::GaleraCluster;
pub use haproxy::HaProxy;
pub use mariadb::MariaDbServer;
pub use nats::NatsServer;
pub use pg_auto_failover::PgFormation;
pub use pgbouncer::{PgBouncer, PoolMode};
pub use postgres::{PgServer, Replication};
pub use process::{free_ports, kill_quietly, parent_and_group, running_as_root, unique_name};
pub use rabbitmq::RabbitMqNode;
