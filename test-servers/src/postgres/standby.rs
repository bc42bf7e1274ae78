//! A streaming standby of a throwaway server, and what a failover does:
//! the promotion, a standby that stops receiving, and the failed primary
//! rejoining as a standby.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::PgServer;
use crate::process::{free_ports, log_tail, private_dir};

/// How long a standby may take to start streaming, or to stop.
const STREAMING_WAIT: Duration = Duration::from_secs(30);

/// The standby's `application_name`, which `synchronous_standby_names` names.
const STANDBY_NAME: &str = "inbox_standby";

/// How a primary's COMMIT waits for its standby.
///
/// ```
/// use inbox_test_servers::Replication;
///
/// assert_ne!(Replication::Synchronous, Replication::Asynchronous);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names` names the standby (and
    /// `synchronous_commit` stays `on`): a COMMIT returns once the standby
    /// has flushed the transaction's WAL, so a promoted standby has every
    /// transaction a client saw committed.
    Synchronous,
    /// A COMMIT returns once the primary has it; the standby follows as fast
    /// as it receives, and a promotion loses what it had not received yet.
    Asynchronous,
}

impl Replication {
    /// What `pg_stat_replication.sync_state` says of such a standby.
    fn sync_state(self) -> &'static str {
        match self {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        }
    }
}

impl PgServer {
    /// Makes a hot standby of this server on a port of its own
    /// (`pg_basebackup` with the WAL streamed, then streaming replication as
    /// `application_name = inbox_standby`), and returns once the primary
    /// sees it streaming, as a synchronous standby for
    /// [`Replication::Synchronous`] (the primary's
    /// `synchronous_standby_names` is set to it, by `ALTER SYSTEM`). The
    /// standby answers reads, refuses writes with SQLSTATE 25006
    /// `read_only_sql_transaction` until [`PgServer::promote`], and has the
    /// primary's users and password. Stopped and removed on drop, as every
    /// server.
    ///
    /// ```no_run
    /// use inbox_test_servers::{PgServer, Replication};
    ///
    /// let primary = PgServer::start()?;
    /// primary.psql("CREATE TABLE t (id int)")?;
    /// let standby = primary.start_standby(Replication::Synchronous)?;
    /// primary.psql("INSERT INTO t VALUES (1)")?; // returns once the standby has it
    /// primary.stop_immediate();
    /// standby.promote();
    /// assert_eq!(standby.psql("SELECT count(*) FROM t")?, "1");
    /// # Ok::<(), String>(())
    /// ```
    pub fn start_standby(&self, replication: Replication) -> Result<PgServer, String> {
        let standby = PgServer {
            bin: self.bin.clone(),
            dir: private_dir("inbox_pg_standby", self.as_postgres.then_some("postgres"))?,
            port: free_ports(1)?[0],
            as_postgres: self.as_postgres,
            password: self.password.clone(),
        };
        let mut backup = standby.command("pg_basebackup");
        backup
            .arg("-D")
            .arg(standby.data_dir())
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-X", "stream", "-c", "fast", "--no-sync"]);
        standby.with_password(&mut backup);
        standby.run(&mut backup)?;
        standby.append_conf(&format!(
            "primary_conninfo = '{}'\nhot_standby = on\n",
            self.standby_conninfo()
        ))?;
        standby.write_private(&standby.standby_signal(), "")?;
        standby.pg_ctl(&["start"])?;
        if replication == Replication::Synchronous {
            self.psql(&format!(
                "ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'"
            ))?;
            self.psql("SELECT pg_reload_conf()")?;
        }
        self.wait_for_standby(|state| state == replication.sync_state())?;
        Ok(standby)
    }

    /// Promotes this standby (`pg_ctl promote`, waiting): it leaves
    /// recovery and takes writes, on a new timeline. Call it after the
    /// primary is gone, as a failover does.
    ///
    /// # Panics
    /// When `pg_ctl promote` fails (not a standby, or not promoted in 60 s).
    ///
    /// ```no_run
    /// use inbox_test_servers::{PgServer, Replication};
    ///
    /// let primary = PgServer::start()?;
    /// let standby = primary.start_standby(Replication::Asynchronous)?;
    /// primary.stop_immediate();
    /// standby.promote();
    /// assert_eq!(standby.psql("SELECT pg_is_in_recovery()")?, "f");
    /// # Ok::<(), String>(())
    /// ```
    pub fn promote(&self) {
        self.pg_ctl(&["promote"]).expect("promote the standby");
    }

    /// Stops this standby's streaming (its `primary_conninfo` emptied and the
    /// configuration reloaded) and returns once its WAL receiver is gone:
    /// from then on it receives nothing of what the primary commits, as an
    /// asynchronous standby that has fallen behind. What it received stays;
    /// it keeps answering reads and can be promoted.
    ///
    /// # Panics
    /// When the standby cannot be reached or its WAL receiver is still
    /// there after 30 s.
    ///
    /// ```no_run
    /// use inbox_test_servers::{PgServer, Replication};
    ///
    /// let primary = PgServer::start()?;
    /// primary.psql("CREATE TABLE t (id int)")?;
    /// let standby = primary.start_standby(Replication::Asynchronous)?;
    /// standby.stop_streaming();
    /// primary.psql("INSERT INTO t VALUES (1)")?; // never reaches the standby
    /// primary.stop_immediate();
    /// standby.promote();
    /// assert_eq!(standby.psql("SELECT count(*) FROM t")?, "0");
    /// # Ok::<(), String>(())
    /// ```
    pub fn stop_streaming(&self) {
        self.append_conf("primary_conninfo = ''\n")
            .expect("empty primary_conninfo");
        self.pg_ctl(&["reload"])
            .expect("reload the standby's configuration");
        let started = Instant::now();
        while self
            .psql("SELECT count(*) FROM pg_stat_wal_receiver")
            .expect("ask the standby for its WAL receiver")
            != "0"
        {
            assert!(
                started.elapsed() < STREAMING_WAIT,
                "the standby's WAL receiver still runs after {STREAMING_WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Turns this stopped, failed-over primary into a standby of `primary`
    /// (the standby promoted in its place), as an operator demotes it:
    /// `pg_rewind` discards what it committed after the two diverged and
    /// copies the rest from `primary`, then it starts on its own port
    /// streaming from `primary` (asynchronously), and this returns once
    /// `primary` sees it streaming. It then refuses writes with SQLSTATE
    /// 25006, as every standby.
    ///
    /// ```no_run
    /// use inbox_test_servers::{PgServer, Replication};
    ///
    /// let primary = PgServer::start()?;
    /// let standby = primary.start_standby(Replication::Synchronous)?;
    /// primary.stop_immediate();
    /// standby.promote();
    /// primary.rejoin_as_standby_of(&standby)?;
    /// assert_eq!(primary.psql("SELECT pg_is_in_recovery()")?, "t");
    /// # Ok::<(), String>(())
    /// ```
    pub fn rejoin_as_standby_of(&self, primary: &PgServer) -> Result<(), String> {
        // A promoted server's control file names its new timeline only after
        // a checkpoint; before one, pg_rewind sees one timeline and rewinds
        // nothing.
        primary.psql("CHECKPOINT")?;
        let mut rewind = self.command("pg_rewind");
        rewind
            .arg("-D")
            .arg(self.data_dir())
            .arg(format!(
                "--source-server={} dbname=postgres",
                primary.standby_conninfo()
            ))
            .args(["--write-recovery-conf", "--no-sync"]);
        self.run(&mut rewind)?;
        // The configuration came from `primary`: this server's own address again.
        self.append_conf("")?;
        self.pg_ctl(&["start"])?;
        primary
            .wait_for_standby(|state| state == "async")
            .map_err(|error| {
                format!(
                    "{error}; its log:{}",
                    log_tail(&self.dir.join("server.log"), 20)
                )
            })
    }

    /// Waits until this primary's `pg_stat_replication` shows the standby
    /// streaming with a `sync_state` that `accepts`.
    fn wait_for_standby(&self, accepts: impl Fn(&str) -> bool) -> Result<(), String> {
        let started = Instant::now();
        loop {
            let state = self.psql(&format!(
                "SELECT sync_state FROM pg_stat_replication \
                 WHERE application_name = '{STANDBY_NAME}' AND state = 'streaming'"
            ))?;
            if accepts(&state) {
                return Ok(());
            }
            if started.elapsed() > STREAMING_WAIT {
                return Err(format!(
                    "the standby is not streaming as wanted after {STREAMING_WAIT:?} \
                     (sync_state: {state:?})"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// How a standby of this server connects to it (libpq keywords): as
    /// `postgres`, with the password if any, named [`STANDBY_NAME`].
    fn standby_conninfo(&self) -> String {
        let password = match &self.password {
            Some(password) => format!(" password={password}"),
            None => String::new(),
        };
        format!(
            "host=127.0.0.1 port={} user=postgres application_name={STANDBY_NAME}{password}",
            self.port
        )
    }

    fn standby_signal(&self) -> PathBuf {
        self.data_dir().join("standby.signal")
    }
}
