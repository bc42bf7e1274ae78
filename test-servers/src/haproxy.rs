//! A throwaway HAProxy routing TCP connections to one server, with the
//! others as backups.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use crate::mariadb::spawn_server;
use crate::process::{
    accepts_connections, free_ports, kill_and_remove, log_tail, on_path, os_user_ids, private_dir,
    require_installed, run, running_as_root, wait_ready, with_port_retries, write_private,
};

/// Where Debian puts HAProxy (not on a normal user's `PATH`).
const HAPROXY: &str = "/usr/sbin/haproxy";
/// How long HAProxy may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How often each server is checked, in milliseconds; two failed checks in
/// a row take a server out, three good ones bring it back.
const CHECK_INTERVAL_MS: u32 = 200;

/// HAProxy of its own, in TCP mode, listening on a free port of 127.0.0.1:
/// every connection goes to the first of `servers` while its health check
/// (a TCP connect every 200 ms) passes, else to the first backup that
/// passes, the way a single-writer Galera deployment routes its writes.
///
/// - When the server a connection goes to is taken out, its sessions are
///   closed at once (`on-marked-down shutdown-sessions`): clients see the
///   connection drop instead of waiting on a dead peer.
/// - When the first server comes back, the sessions still on a backup are
///   closed (`on-marked-up shutdown-backup-sessions`), so that writes do
///   not go to two servers at once for longer than a client takes to
///   reconnect.
///
/// Run as root, HAProxy runs as the `haproxy` OS user. Killed and removed on
/// drop.
///
/// ```no_run
/// use inbox_test_servers::{GaleraCluster, HaProxy};
///
/// let cluster = GaleraCluster::start()?;
/// let proxy = HaProxy::start(&[cluster.port(0), cluster.port(1), cluster.port(2)])?;
/// println!("writes through 127.0.0.1:{}", proxy.port());
/// # Ok::<(), String>(())
/// ```
pub struct HaProxy {
    dir: PathBuf,
    port: u16,
    process: Option<Child>,
}

impl HaProxy {
    /// `Err` naming what is missing to run HAProxy.
    ///
    /// ```
    /// if let Err(missing) = inbox_test_servers::HaProxy::installed() {
    ///     println!("{missing}");
    /// }
    /// ```
    pub fn installed() -> Result<(), String> {
        let missing = if on_path("haproxy") || Path::new(HAPROXY).exists() {
            vec![]
        } else {
            vec!["haproxy"]
        };
        require_installed(missing, &[], "haproxy")
    }

    /// Starts HAProxy in front of the servers on 127.0.0.1 at `servers`
    /// (the first the active one, the rest its backups, in order); returns
    /// once it accepts connections. A port taken over between
    /// [`free_ports`] and the start: tries twice more.
    ///
    /// ```no_run
    /// let proxy = inbox_test_servers::HaProxy::start(&[3306, 3307])?;
    /// # Ok::<(), String>(())
    /// ```
    pub fn start(servers: &[u16]) -> Result<Self, String> {
        Self::installed()?;
        if servers.is_empty() {
            return Err("HaProxy::start needs at least one server".to_owned());
        }
        with_port_retries(|| Self::try_start(servers))
    }

    /// The port HAProxy listens on, on 127.0.0.1.
    ///
    /// ```no_run
    /// let proxy = inbox_test_servers::HaProxy::start(&[3306])?;
    /// assert_ne!(proxy.port(), 3306);
    /// # Ok::<(), String>(())
    /// ```
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What HAProxy said of its servers so far: one line per server taken
    /// out or brought back (`Server writes/s0 is DOWN…`, `…is UP…`).
    ///
    /// ```no_run
    /// let proxy = inbox_test_servers::HaProxy::start(&[3306, 3307])?;
    /// for line in proxy.server_events() {
    ///     println!("{line}");
    /// }
    /// # Ok::<(), String>(())
    /// ```
    pub fn server_events(&self) -> Vec<String> {
        std::fs::read_to_string(self.output())
            .unwrap_or_default()
            .lines()
            .filter(|line| line.contains("Server writes/"))
            .map(str::to_owned)
            .collect()
    }

    fn output(&self) -> PathBuf {
        self.dir.join("haproxy.out")
    }

    fn try_start(servers: &[u16]) -> Result<Self, String> {
        let as_haproxy = running_as_root();
        let dir = private_dir("inbox_haproxy", as_haproxy.then_some("haproxy"))?;
        let mut proxy = HaProxy {
            dir,
            port: free_ports(1)?[0],
            process: None,
        };
        let config = proxy.dir.join("haproxy.cfg");
        write_private(&config, &configuration(proxy.port, servers))?;
        let binary = if on_path("haproxy") {
            PathBuf::from("haproxy")
        } else {
            PathBuf::from(HAPROXY)
        };
        let mut command = Command::new(binary);
        // `-db`: in the foreground, its messages on stderr.
        command
            .arg("-db")
            .arg("-f")
            .arg(&config)
            .current_dir(&proxy.dir);
        if as_haproxy {
            run(Command::new("chown").arg("haproxy:haproxy").arg(&config))?;
            let (uid, gid) = os_user_ids("haproxy")?;
            command.uid(uid).gid(gid);
        }
        let output = proxy.output();
        proxy.process = Some(spawn_server(&mut command, &output)?);
        let port = proxy.port;
        wait_ready(
            &format!("HAProxy on port {port}"),
            &mut proxy.process,
            START_TIMEOUT,
            || accepts_connections(port),
            || log_tail(&output, 15),
        )?;
        Ok(proxy)
    }
}

/// The configuration: one TCP listener, the first server active and the
/// others backups, each checked by a TCP connect.
fn configuration(port: u16, servers: &[u16]) -> String {
    let mut text = format!(
        "global\n\
         \tmaxconn 500\n\
         defaults\n\
         \tmode tcp\n\
         \ttimeout connect 2s\n\
         \ttimeout client 1h\n\
         \ttimeout server 1h\n\
         listen writes\n\
         \tbind 127.0.0.1:{port}\n\
         \tdefault-server inter {CHECK_INTERVAL_MS} fall 2 rise 3 on-marked-down shutdown-sessions\n"
    );
    for (index, server) in servers.iter().enumerate() {
        let role = if index == 0 {
            "on-marked-up shutdown-backup-sessions"
        } else {
            "backup"
        };
        text.push_str(&format!(
            "\tserver s{index} 127.0.0.1:{server} check {role}\n"
        ));
    }
    text
}

impl Drop for HaProxy {
    fn drop(&mut self) {
        kill_and_remove(&mut self.process, &self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::configuration;

    #[test]
    fn the_first_server_takes_the_connections_and_the_others_are_backups() {
        let text = configuration(5000, &[3306, 3307, 3308]);
        assert!(text.contains("bind 127.0.0.1:5000"));
        assert!(
            text.contains("server s0 127.0.0.1:3306 check on-marked-up shutdown-backup-sessions\n")
        );
        assert!(text.contains("server s1 127.0.0.1:3307 check backup\n"));
        assert!(text.contains("server s2 127.0.0.1:3308 check backup\n"));
    }
}
