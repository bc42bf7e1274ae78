//! A throwaway pg_auto_failover formation: a monitor and a primary/secondary
//! pair that the HA manager fails over by itself.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::mariadb::spawn_server;
use crate::postgres::PgServer;
use crate::process::{
    free_ports, kill_quietly, log_tail, on_path, os_user_ids, parent_and_group, private_dir,
    require_installed, run, running_as_root, wait_ready, with_port_retries,
};

/// How long the monitor and each node may take to reach their state.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// The monitor's health checks, shortened for a test on loopback (the
/// defaults take about a minute to fail over: a 20 s unhealthy timeout and
/// a 30 s wait for the old primary to demote itself). Each is a
/// `pgautofailover.*` setting of the monitor, in milliseconds.
const MONITOR_SETTINGS: &[(&str, u32)] = &[
    ("health_check_period", 1000),
    ("health_check_timeout", 1000),
    ("health_check_max_retries", 1),
    ("health_check_retry_delay", 200),
    ("node_considered_unhealthy_timeout", 2000),
    ("primary_demote_timeout", 3000),
];

/// One `pg_autoctl` keeper (the monitor's or a node's) and the PostgreSQL
/// server it runs.
struct Keeper {
    name: &'static str,
    port: u16,
    pgdata: PathBuf,
    process: Option<Child>,
}

/// A pg_auto_failover formation of its own: a monitor and two PostgreSQL
/// nodes (`pg_autoctl create monitor` / `create postgres … --run`), each a
/// keeper process with its server in a fresh temporary directory (mode
/// 0700), on free ports of 127.0.0.1 only, trust authentication, no TLS.
/// The formation replicates synchronously (`synchronous_standby_names =
/// 'ANY 1 (…)'`, pg_auto_failover's default for a pair) and promotes the
/// secondary by itself when the primary's node dies, within a few seconds
/// (the monitor's health checks are shortened, see `MONITOR_SETTINGS`).
/// Run as root, the keepers run as the `postgres` OS user. Every keeper and
/// server is killed and the directory removed on drop.
///
/// ```no_run
/// use inbox_test_servers::PgFormation;
///
/// let formation = PgFormation::start()?;
/// println!("{}", formation.uri()); // postgres://postgres@127.0.0.1:<p1>,127.0.0.1:<p2>/postgres?target_session_attrs=read-write…
/// let primary = formation.primary()?;
/// formation.kill_node(primary); // the host dies: keeper, postmaster and backends
/// let promoted = formation.wait_for_primary_other_than(primary)?;
/// # Ok::<(), String>(())
/// ```
pub struct PgFormation {
    dir: PathBuf,
    pg_bin: PathBuf,
    as_postgres: bool,
    monitor: Keeper,
    nodes: Vec<Keeper>,
}

impl PgFormation {
    /// `Err` naming what is missing to run a formation.
    ///
    /// ```
    /// if let Err(missing) = inbox_test_servers::PgFormation::installed() {
    ///     println!("{missing}");
    /// }
    /// ```
    pub fn installed() -> Result<(), String> {
        let mut missing = vec![];
        if !on_path("pg_autoctl") {
            missing.push("pg_autoctl");
        }
        if !Self::extension_installed() {
            missing.push("the pgautofailover extension");
        }
        require_installed(missing, &[], &Self::packages().join(" "))
    }

    /// The Debian packages that bring `pg_autoctl` and the extension for
    /// the server binaries [`PgServer::bin_dir`] picks.
    ///
    /// ```no_run
    /// let packages = inbox_test_servers::PgFormation::packages();
    /// assert_eq!(packages[0], "pg-auto-failover-cli");
    /// ```
    pub fn packages() -> Vec<String> {
        let installed = PgServer::bin_dir()
            .ok()
            .and_then(|bin| Self::pg_config(&bin, "--version"))
            .and_then(|out| {
                let number = out.split_whitespace().nth(1)?;
                Some(number.split('.').next()?.to_owned())
            });
        // Not installed yet: the version Debian's `postgresql` would bring.
        let version = installed
            .or_else(Self::packaged_version)
            .unwrap_or_else(|| "<version>".to_owned());
        vec![
            "pg-auto-failover-cli".to_owned(),
            format!("postgresql-{version}-auto-failover"),
        ]
    }

    /// The major version Debian's `postgresql` package depends on.
    fn packaged_version() -> Option<String> {
        let depends = run(Command::new("apt-cache").args(["depends", "postgresql"])).ok()?;
        depends.lines().find_map(|line| {
            let version = line.trim().strip_prefix("Depends: postgresql-")?;
            version
                .chars()
                .all(|c| c.is_ascii_digit())
                .then(|| version.to_owned())
        })
    }

    /// Whether the server binaries' share directory holds the extension.
    fn extension_installed() -> bool {
        PgServer::bin_dir()
            .ok()
            .and_then(|bin| Self::pg_config(&bin, "--sharedir"))
            .is_some_and(|share| {
                Path::new(share.trim())
                    .join("extension/pgautofailover.control")
                    .exists()
            })
    }

    /// What `pg_config <flag>` of the binaries in `bin` prints.
    fn pg_config(bin: &Path, flag: &str) -> Option<String> {
        run(Command::new(bin.join("pg_config")).arg(flag)).ok()
    }

    /// Starts the monitor, then the first node (which becomes the primary),
    /// then the second (its synchronous secondary); returns once the monitor
    /// reports them `primary` and `secondary`.
    ///
    /// ```no_run
    /// let formation = inbox_test_servers::PgFormation::start()?;
    /// # Ok::<(), String>(())
    /// ```
    pub fn start() -> Result<Self, String> {
        Self::installed()?;
        let pg_bin = PgServer::bin_dir()?;
        with_port_retries(|| Self::try_start(&pg_bin))
    }

    fn try_start(pg_bin: &Path) -> Result<Self, String> {
        let as_postgres = running_as_root();
        let dir = private_dir("inbox_formation", as_postgres.then_some("postgres"))?;
        let ports = free_ports(3)?;
        let keeper = |name, port| Keeper {
            name,
            port,
            pgdata: dir.join(name),
            process: None,
        };
        let mut formation = PgFormation {
            monitor: keeper("monitor", ports[0]),
            nodes: vec![keeper("node1", ports[1]), keeper("node2", ports[2])],
            dir,
            pg_bin: pg_bin.to_owned(),
            as_postgres,
        };
        for sub in ["config", "data", "run"] {
            std::fs::create_dir(formation.dir.join(sub)).map_err(|e| e.to_string())?;
        }
        if as_postgres {
            run(Command::new("chown")
                .arg("-R")
                .arg("postgres:postgres")
                .arg(&formation.dir))?;
        }
        formation.start_monitor()?;
        for index in 0..formation.nodes.len() {
            formation.start_node(index)?;
        }
        formation.wait_for_states(&["primary", "secondary"])?;
        Ok(formation)
    }

    fn start_monitor(&mut self) -> Result<(), String> {
        let mut command = self.pg_autoctl();
        command
            .args(["create", "monitor", "--pgdata"])
            .arg(&self.monitor.pgdata)
            .args(["--pgport", &self.monitor.port.to_string()])
            .args(["--hostname", "127.0.0.1", "--listen", "127.0.0.1"])
            .args(["--auth", "trust", "--no-ssl", "--run"]);
        let log = self.dir.join("monitor.log");
        let mut process = Some(spawn_server(&mut command, &log)?);
        let ready = wait_ready(
            "the pg_auto_failover monitor",
            &mut process,
            START_TIMEOUT,
            || {
                self.monitor_sql("SELECT count(*) FROM pgautofailover.formation")
                    .is_ok()
            },
            || log_tail(&log, 20),
        );
        // Kept before anything can fail, so that drop kills it.
        self.monitor.process = process;
        ready?;
        for (name, value) in MONITOR_SETTINGS {
            self.monitor_sql(&format!("ALTER SYSTEM SET pgautofailover.{name} = {value}"))?;
        }
        self.monitor_sql("SELECT pg_reload_conf()").map(drop)
    }

    fn start_node(&mut self, index: usize) -> Result<(), String> {
        let monitor = format!(
            "postgres://autoctl_node@127.0.0.1:{}/pg_auto_failover?sslmode=disable",
            self.monitor.port
        );
        let node = &self.nodes[index];
        let mut command = self.pg_autoctl();
        command
            .args(["create", "postgres", "--pgdata"])
            .arg(&node.pgdata)
            .args(["--pgport", &node.port.to_string(), "--name", node.name])
            .args(["--hostname", "127.0.0.1", "--listen", "127.0.0.1"])
            .args([
                "--auth",
                "trust",
                "--no-ssl",
                "--monitor",
                &monitor,
                "--run",
            ]);
        let log = self.log_of(index);
        let process = spawn_server(&mut command, &log)?;
        self.nodes[index].process = Some(process);
        let wanted: &[&str] = if index == 0 {
            &["single"]
        } else {
            &["primary", "secondary"]
        };
        self.wait_for_states(wanted)
            .map_err(|error| format!("{error}{}", log_tail(&log, 20)))
    }

    /// The formation's URI as `pg_autoctl show uri` prints it (every node,
    /// `target_session_attrs=read-write`), for the OS user `postgres`.
    ///
    /// # Panics
    /// When `pg_autoctl show uri` fails.
    ///
    /// ```no_run
    /// let formation = inbox_test_servers::PgFormation::start()?;
    /// assert!(formation.uri().contains("target_session_attrs=read-write"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn uri(&self) -> String {
        let mut command = self.pg_autoctl();
        command
            .args(["show", "uri", "--formation", "default", "--pgdata"])
            .arg(&self.monitor.pgdata);
        let uri = run(&mut command).expect("pg_autoctl show uri");
        let uri = uri.trim();
        match uri.strip_prefix("postgres://") {
            Some(rest) => format!("postgres://postgres@{rest}"),
            None => panic!("pg_autoctl show uri printed {uri:?}"),
        }
    }

    /// The URL of node `index` alone (database `postgres`, as `postgres`).
    ///
    /// ```no_run
    /// let formation = inbox_test_servers::PgFormation::start()?;
    /// assert!(formation.node_url(0).ends_with("/postgres"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn node_url(&self, index: usize) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.nodes[index].port
        )
    }

    /// Which node the monitor reports as `primary` (or `wait_primary`).
    ///
    /// ```no_run
    /// let formation = inbox_test_servers::PgFormation::start()?;
    /// assert_eq!(formation.primary()?, 0);
    /// # Ok::<(), String>(())
    /// ```
    pub fn primary(&self) -> Result<usize, String> {
        self.states()?
            .iter()
            .position(|(reported, _)| is_primary(reported))
            .ok_or_else(|| format!("no primary: {}", self.show_state()))
    }

    /// The monitor's view: each node's port, reported and assigned state,
    /// one line each.
    ///
    /// ```no_run
    /// let formation = inbox_test_servers::PgFormation::start()?;
    /// println!("{}", formation.show_state());
    /// # Ok::<(), String>(())
    /// ```
    pub fn show_state(&self) -> String {
        self.monitor_sql(
            "SELECT string_agg(nodename || ' :' || nodeport || ' ' || reportedstate \
             || ' (assigned ' || goalstate || ')', E'\\n' ORDER BY nodeid) FROM pgautofailover.node",
        )
        .unwrap_or_else(|error| format!("the monitor did not answer: {error}"))
    }

    /// Kills node `index` as a host crash would: SIGKILL to its keeper,
    /// its postmaster and every backend at once. Nothing restarts it; the
    /// monitor then fails over to the other node.
    ///
    /// ```no_run
    /// let formation = inbox_test_servers::PgFormation::start()?;
    /// formation.kill_node(formation.primary()?);
    /// # Ok::<(), String>(())
    /// ```
    pub fn kill_node(&self, index: usize) {
        kill_keeper(&self.nodes[index]);
    }

    /// Waits until the monitor reports a node other than `old` as
    /// `primary` or `wait_primary` (a primary whose standby is gone, which
    /// pg_auto_failover lets commit without waiting for one) and that node
    /// accepts writes; returns its index.
    ///
    /// ```no_run
    /// let formation = inbox_test_servers::PgFormation::start()?;
    /// let old = formation.primary()?;
    /// formation.kill_node(old);
    /// let new = formation.wait_for_primary_other_than(old)?;
    /// assert_ne!(new, old);
    /// # Ok::<(), String>(())
    /// ```
    pub fn wait_for_primary_other_than(&self, old: usize) -> Result<usize, String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(states) = self.states() {
                let promoted = states
                    .iter()
                    .enumerate()
                    .find(|(index, (reported, _))| *index != old && is_primary(reported));
                if let Some((index, _)) = promoted {
                    let writable = self
                        .psql(
                            self.nodes[index].port,
                            "postgres",
                            "SELECT NOT pg_is_in_recovery() AND \
                             NOT current_setting('default_transaction_read_only')::bool",
                        )
                        .is_ok_and(|out| out == "t");
                    if writable {
                        return Ok(index);
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no node took over from node {} within {START_TIMEOUT:?}:\n{}",
                    old + 1,
                    self.show_state()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Each node's reported and assigned state, by node index.
    fn states(&self) -> Result<Vec<(String, String)>, String> {
        let out = self.monitor_sql(
            "SELECT nodeport, reportedstate, goalstate FROM pgautofailover.node ORDER BY nodeid",
        )?;
        let by_port: Vec<(u16, String, String)> = out
            .lines()
            .filter_map(|line| {
                let mut fields = line.split('|');
                let port = fields.next()?.parse().ok()?;
                Some((port, fields.next()?.to_owned(), fields.next()?.to_owned()))
            })
            .collect();
        Ok(self
            .nodes
            .iter()
            .map(|node| {
                by_port
                    .iter()
                    .find(|(port, _, _)| *port == node.port)
                    .map(|(_, reported, goal)| (reported.clone(), goal.clone()))
                    .unwrap_or_default()
            })
            .collect())
    }

    /// Waits until the registered nodes report `wanted`, in node order, and
    /// are assigned the same states.
    fn wait_for_states(&self, wanted: &[&str]) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let settled = self.states().is_ok_and(|states| {
                wanted
                    .iter()
                    .zip(&states)
                    .all(|(wanted, (reported, goal))| reported == wanted && goal == wanted)
            });
            if settled {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the formation did not reach {wanted:?} within {START_TIMEOUT:?}:\n{}",
                    self.show_state()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn monitor_sql(&self, sql: &str) -> Result<String, String> {
        self.psql(self.monitor.port, "pg_auto_failover", sql)
    }

    fn psql(&self, port: u16, database: &str, sql: &str) -> Result<String, String> {
        let mut command = Command::new(self.pg_bin.join("psql"));
        command
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-U", "postgres", "-d", database, "-c", sql])
            .env("PGCONNECT_TIMEOUT", "5")
            .env_remove("PGPASSWORD");
        run(&mut command).map(|out| out.trim().to_owned())
    }

    /// `pg_autoctl`, as the `postgres` OS user when run as root, with the
    /// server binaries first on `PATH` and its configuration and state
    /// files inside the formation's directory.
    fn pg_autoctl(&self) -> Command {
        let mut command = Command::new("pg_autoctl");
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![self.pg_bin.clone()];
        paths.extend(std::env::split_paths(&path));
        command
            .env("PATH", std::env::join_paths(paths).unwrap_or(path))
            .env("XDG_CONFIG_HOME", self.dir.join("config"))
            .env("XDG_DATA_HOME", self.dir.join("data"))
            .env("XDG_RUNTIME_DIR", self.dir.join("run"))
            .env("HOME", &self.dir)
            .current_dir(&self.dir);
        if self.as_postgres
            && let Ok((uid, gid)) = os_user_ids("postgres")
        {
            command.uid(uid).gid(gid);
        }
        command
    }

    fn log_of(&self, index: usize) -> PathBuf {
        self.dir.join(format!("{}.log", self.nodes[index].name))
    }
}

/// Whether a node in `state` takes writes: `primary`, or `wait_primary`
/// (a primary without a standby to wait for).
fn is_primary(state: &str) -> bool {
    matches!(state, "primary" | "wait_primary")
}

/// Kills a keeper's process group (the keeper, its services and the
/// postmaster) and the postmaster's children (each backend leads a session
/// of its own), all with SIGKILL, the children first.
fn kill_keeper(keeper: &Keeper) {
    let Some(group) = keeper.process.as_ref().map(Child::id) else {
        return;
    };
    let postmaster = std::fs::read_to_string(keeper.pgdata.join("postmaster.pid"))
        .ok()
        .and_then(|pid| pid.lines().next()?.trim().parse::<u32>().ok());
    let mut targets: Vec<String> = postmaster
        .map(children_of)
        .unwrap_or_default()
        .iter()
        .map(u32::to_string)
        .collect();
    targets.push(format!("-{group}"));
    // A backend may have exited meanwhile.
    kill_quietly(&targets);
}

/// The processes whose parent is `parent` (from `/proc`).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let (ppid, _) = parent_and_group(pid)?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

impl Drop for PgFormation {
    fn drop(&mut self) {
        for keeper in self.nodes.iter().chain([&self.monitor]) {
            kill_keeper(keeper);
        }
        for keeper in self.nodes.iter_mut().chain([&mut self.monitor]) {
            if let Some(mut process) = keeper.process.take() {
                let _ = process.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
