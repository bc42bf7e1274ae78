//! A throwaway 3-node MariaDB Galera cluster on loopback.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::mariadb::{client, mariadbd, spawn_server};
use crate::process::{free_ports, log_tail, private_dir, require_installed, run, running_as_root};

/// The number of nodes of a [`GaleraCluster`].
///
/// ```
/// assert_eq!(inbox_test_servers::galera::NODES, 3);
/// ```
pub const NODES: usize = 3;

/// The database every node serves.
///
/// ```
/// assert_eq!(inbox_test_servers::galera::DATABASE, "inbox_galera");
/// ```
pub const DATABASE: &str = "inbox_galera";

const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";
/// How long a node may take to start (a joiner includes its state transfer).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A 3-node MariaDB Galera cluster of its own, on 127.0.0.1: never a shared
/// server. Each node has its own data directory in a fresh temporary
/// directory (mode 0700; `mariadb-install-db` for the first node; the others
/// receive it by `rsync` state transfer), its own SQL, group-communication,
/// IST and SST ports (free ports the OS picks),
/// `wsrep_provider=/usr/lib/galera/libgalera_smm.so`, `binlog_format=ROW`,
/// `innodb_autoinc_lock_mode=2`; the first node bootstraps the cluster
/// (`--wsrep-new-cluster`). Root over TCP with an empty password (the
/// cluster lives as long as the test that starts it); database
/// [`DATABASE`] on every node.
///
/// Small and quick: a 32 MB buffer pool, an 8 MB redo log, a 16 MB
/// gcache, no performance schema, `innodb_flush_log_at_trx_commit=0`
/// (only the server processes die here, never the machine), and short
/// group-communication timeouts so that a killed node leaves the view in
/// about 3 s instead of the default 5–15 s. Run as root, the servers run
/// as the `mysql` OS user (the rsync daemon of a state transfer cannot
/// write as root's `nobody`).
///
/// [`GaleraCluster::start`] returns once `wsrep_cluster_size = 3` and every
/// node says `wsrep_ready = ON`; every node is killed and the directory
/// removed on drop. Needs Debian's `mariadb-server`, `galera-4` and `rsync`.
/// Status queries go through the `mariadb` client.
///
/// ```no_run
/// use inbox_test_servers::GaleraCluster;
///
/// let cluster = GaleraCluster::start()?;
/// cluster.kill(2); // SIGKILL: the other two carry on
/// cluster.restart(2); // rejoins (state transfer), back to 3 nodes
/// assert_eq!(cluster.status(0, "wsrep_cluster_size").as_deref(), Some("3"));
/// println!("{}", cluster.url(1));
/// # Ok::<(), String>(())
/// ```
pub struct GaleraCluster {
    dir: PathBuf,
    nodes: Vec<Node>,
    as_mysql: bool,
}

struct Node {
    sql: u16,
    gcomm: u16,
    ist: u16,
    sst: u16,
    process: Mutex<Option<Child>>,
}

impl GaleraCluster {
    /// Creates and starts the cluster, with database [`DATABASE`] on every
    /// node; fails when the binaries are missing or a node does not start
    /// or join.
    ///
    /// ```no_run
    /// let cluster = inbox_test_servers::GaleraCluster::start()?;
    /// assert_eq!(cluster.status(2, "wsrep_ready").as_deref(), Some("ON"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn start() -> Result<Self, String> {
        Self::installed()?;
        // As the single servers do: the ports are free when picked, and
        // another process can bind one before a node does ("Address already
        // in use"); a new try picks new ones.
        let mut last_error = String::new();
        for _ in 0..3 {
            match Self::try_start() {
                Ok(cluster) => return Ok(cluster),
                Err(error) => last_error = error,
            }
        }
        Err(last_error)
    }

    /// One try of [`start`](Self::start): new ports, a new directory.
    fn try_start() -> Result<Self, String> {
        let as_mysql = running_as_root();
        // Dropped (killed and removed) on every early return below.
        let mut cluster = GaleraCluster {
            dir: private_dir("inbox_galera", as_mysql.then_some("mysql"))?,
            nodes: Vec::new(),
            as_mysql,
        };
        let ports = free_ports(4 * NODES)?;
        for node in ports.chunks(4) {
            let &[sql, gcomm, ist, sst] = node else {
                unreachable!("four ports a node")
            };
            cluster.nodes.push(Node {
                sql,
                gcomm,
                ist,
                sst,
                process: Mutex::new(None),
            });
        }
        for node in 0..NODES {
            let data = cluster.data_dir(node);
            std::fs::create_dir(&data).map_err(|e| format!("create {}: {e}", data.display()))?;
        }
        if as_mysql {
            run(Command::new("chown")
                .args(["-R", "mysql:mysql"])
                .arg(&cluster.dir))?;
        }
        let mut install = Command::new("mariadb-install-db");
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", cluster.data_dir(0).display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .args(["--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M"]);
        if as_mysql {
            install.arg("--user=mysql");
        }
        run(&mut install)?;

        cluster.spawn(0, true)?;
        cluster.wait_ready(0, 1)?;
        cluster.sql(0, &format!("CREATE DATABASE {DATABASE}"))?;
        for node in 1..NODES {
            cluster.spawn(node, false)?;
        }
        for node in 1..NODES {
            cluster.wait_ready(node, NODES)?;
        }
        Ok(cluster)
    }

    /// `Err` naming what is missing to run a node: a MariaDB server
    /// ([`MariaDbServer::installed`](crate::MariaDbServer::installed)), the
    /// Galera provider, `rsync` and its state-transfer script.
    ///
    /// ```
    /// if let Err(missing) = inbox_test_servers::GaleraCluster::installed() {
    ///     println!("{missing}");
    /// }
    /// ```
    pub fn installed() -> Result<(), String> {
        let mut missing: Vec<&str> = Vec::new();
        let server = crate::MariaDbServer::installed();
        if server.is_err() {
            missing.push("the MariaDB server");
        }
        if !Path::new(PROVIDER).exists() {
            missing.push(PROVIDER);
        }
        require_installed(
            missing,
            &["rsync", "wsrep_sst_rsync"],
            "mariadb-server galera-4 rsync",
        )
    }

    /// The URL of [`DATABASE`] on `node` (0, 1 or 2), as root.
    ///
    /// ```no_run
    /// let cluster = inbox_test_servers::GaleraCluster::start()?;
    /// assert!(cluster.url(0).starts_with("mysql://root@127.0.0.1:"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn url(&self, node: usize) -> String {
        format!("mysql://root@127.0.0.1:{}/{DATABASE}", self.nodes[node].sql)
    }

    /// `node`'s SQL port on 127.0.0.1.
    ///
    /// ```no_run
    /// let cluster = inbox_test_servers::GaleraCluster::start()?;
    /// assert_ne!(cluster.port(0), cluster.port(1));
    /// # Ok::<(), String>(())
    /// ```
    pub fn port(&self, node: usize) -> u16 {
        self.nodes[node].sql
    }

    /// A global status variable of `node` (`wsrep_cluster_size`,
    /// `wsrep_local_cert_failures`, …), or `None` when the node cannot
    /// be reached (or `name` is not a variable name).
    ///
    /// ```no_run
    /// let cluster = inbox_test_servers::GaleraCluster::start()?;
    /// assert_eq!(cluster.status(0, "wsrep_cluster_size").as_deref(), Some("3"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn status(&self, node: usize, name: &str) -> Option<String> {
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        self.sql(
            node,
            &format!(
                "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
                 WHERE VARIABLE_NAME = UPPER('{name}')"
            ),
        )
        .ok()
        .filter(|value| !value.is_empty())
    }

    /// Kills `node` with SIGKILL (no shutdown, no goodbye to the group)
    /// and waits for the process to end.
    ///
    /// # Panics
    /// When the node is not running.
    ///
    /// ```no_run
    /// let cluster = inbox_test_servers::GaleraCluster::start()?;
    /// cluster.kill(2);
    /// assert_eq!(cluster.status(2, "wsrep_ready"), None);
    /// # Ok::<(), String>(())
    /// ```
    pub fn kill(&self, node: usize) {
        let mut process = self.nodes[node].process.lock().expect("node lock");
        let mut child = process.take().expect("the node is running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts `node` again after [`kill`](Self::kill): it rejoins the
    /// cluster (state transfer from a survivor). Returns once it is
    /// ready and the cluster has 3 nodes again.
    ///
    /// # Panics
    /// When the node does not rejoin within 2 minutes.
    ///
    /// ```no_run
    /// let cluster = inbox_test_servers::GaleraCluster::start()?;
    /// cluster.kill(1);
    /// cluster.restart(1);
    /// # Ok::<(), String>(())
    /// ```
    pub fn restart(&self, node: usize) {
        self.spawn(node, false).expect("restart the node");
        self.wait_ready(node, NODES).expect("the node rejoins");
    }

    /// Runs `sql` on `node` with the `mariadb` client, as root.
    fn sql(&self, node: usize, sql: &str) -> Result<String, String> {
        client(self.nodes[node].sql, "root", "", sql)
    }

    fn data_dir(&self, node: usize) -> PathBuf {
        self.dir.join(format!("node{node}"))
    }

    fn spawn(&self, node: usize, new_cluster: bool) -> Result<(), String> {
        let n = &self.nodes[node];
        let peers: Vec<String> = self
            .nodes
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.gcomm))
            .collect();
        let file = |name: &str| self.dir.join(format!("node{node}.{name}"));
        let mut provider_options = format!(
            "gmcast.listen_addr=tcp://127.0.0.1:{};ist.recv_addr=127.0.0.1:{};",
            n.gcomm, n.ist
        );
        provider_options.push_str(
            "gcache.size=16M;gcache.page_size=16M;\
             evs.keepalive_period=PT0.5S;evs.inactive_check_period=PT0.5S;\
             evs.suspect_timeout=PT2S;evs.inactive_timeout=PT3S;evs.install_timeout=PT3S",
        );
        let mut command = Command::new(mariadbd());
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.data_dir(node).display()))
            .arg(format!("--socket={}", file("sock").display()))
            .arg(format!("--pid-file={}", file("pid").display()))
            .arg(format!("--log-error={}", file("err").display()))
            .arg(format!("--port={}", n.sql))
            .args(["--bind-address=127.0.0.1", "--skip-name-resolve"])
            .args(["--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M"])
            .args([
                "--innodb-log-buffer-size=1M",
                "--innodb-flush-log-at-trx-commit=0",
            ])
            .args(["--performance-schema=OFF", "--key-buffer-size=1M"])
            .args(["--aria-pagecache-buffer-size=1M", "--max-connections=100"])
            .args(["--binlog-format=ROW", "--innodb-autoinc-lock-mode=2"])
            .args(["--default-storage-engine=InnoDB", "--wsrep-on=ON"])
            .arg(format!("--wsrep-provider={PROVIDER}"))
            .arg(format!(
                "--wsrep-cluster-address=gcomm://{}",
                peers.join(",")
            ))
            .arg("--wsrep-cluster-name=inbox_test")
            .arg(format!("--wsrep-node-name=node{node}"))
            .arg(format!("--wsrep-node-address=127.0.0.1:{}", n.gcomm))
            .arg(format!("--wsrep-provider-options={provider_options}"))
            .arg(format!("--wsrep-sst-receive-address=127.0.0.1:{}", n.sst))
            .args(["--wsrep-sst-method=rsync", "--wsrep-slave-threads=2"]);
        if self.as_mysql {
            command.arg("--user=mysql");
        }
        if new_cluster {
            command.arg("--wsrep-new-cluster");
        }
        let child = spawn_server(&mut command, &file("out"))?;
        *self.nodes[node].process.lock().expect("node lock") = Some(child);
        Ok(())
    }

    /// Waits until `node` says `wsrep_ready = ON` and sees a cluster of
    /// at least `size` nodes, or fails with the tail of its error log.
    fn wait_ready(&self, node: usize, size: usize) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let ready = self.status(node, "wsrep_ready").as_deref() == Some("ON");
            let members = self
                .status(node, "wsrep_cluster_size")
                .and_then(|s| s.parse::<usize>().ok())
                .unwrap_or(0);
            if ready && members >= size {
                return Ok(());
            }
            let exited = {
                let mut process = self.nodes[node].process.lock().expect("node lock");
                process
                    .as_mut()
                    .and_then(|child| child.try_wait().ok().flatten())
            };
            if exited.is_some() || Instant::now() > deadline {
                return Err(format!(
                    "node {node} (port {}) not ready ({}):{}",
                    self.nodes[node].sql,
                    exited.map_or("timed out".to_owned(), |s| format!("exited: {s}")),
                    log_tail(&self.dir.join(format!("node{node}.err")), 25)
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for GaleraCluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            if let Some(mut child) = node.process.lock().ok().and_then(|mut p| p.take()) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
