//! A throwaway RabbitMQ node.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use crate::mariadb::spawn_server;
use crate::process::{
    accepts_connections, free_ports, log_tail, os_user_ids, private_dir, run, running_as_root,
    wait_ready, with_port_retries, write_private,
};
use crate::secret::random_password;

/// The node's start script, run directly (Debian's `/usr/sbin/rabbitmq-server`
/// is a wrapper that switches to the `rabbitmq` user and to its data).
const SERVER_SCRIPT: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";
/// The Erlang port mapper, one of the node's own on a port of its own.
const EPMD: &str = "epmd";
/// The OS user the node runs as when the test command runs as root.
const OS_USER: &str = "rabbitmq";
/// The user the suite connects as (the node's default user, created at its
/// first boot with a random password).
const USER: &str = "inbox";
/// How long the node may take to open its AMQP port (the last step of its boot).
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// A RabbitMQ node of its own: its name (`inbox_<unique>@localhost`), its
/// Erlang cookie, its database and logs in a fresh temporary directory
/// (mode 0700), its AMQP and distribution ports picked free on 127.0.0.1,
/// and an Erlang port mapper of its own, so that it neither sees nor
/// disturbs the machine's node. No plugin is enabled (no management port).
/// The suite connects as user `inbox` with a random password. Run as root,
/// the node runs as the `rabbitmq` OS user. Killed with everything it
/// started, and its directory removed, on drop.
///
/// ```no_run
/// use inbox_test_servers::RabbitMqNode;
///
/// let node = RabbitMqNode::start()?;
/// println!("{}", node.url()); // amqp://inbox:<password>@127.0.0.1:<port>/%2f
/// # Ok::<(), String>(())
/// ```
pub struct RabbitMqNode {
    dir: PathBuf,
    amqp_port: u16,
    epmd_port: u16,
    password: String,
    process: Option<Child>,
}

impl RabbitMqNode {
    /// Starts a node and returns once it accepts AMQP connections. A port
    /// taken over between [`free_ports`] and the start: tries twice more.
    ///
    /// ```no_run
    /// let node = inbox_test_servers::RabbitMqNode::start()?;
    /// assert!(node.url().starts_with("amqp://inbox:"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn start() -> Result<Self, String> {
        Self::installed()?;
        with_port_retries(|| Self::try_start(""))
    }

    /// [`start`](Self::start), with a memory high watermark of 1 MB: the
    /// node is in a memory alarm from its boot on, and blocks every
    /// connection that publishes (`connection.blocked`) for as long as it
    /// runs. Consuming, declaring and the rest still work.
    ///
    /// ```no_run
    /// let node = inbox_test_servers::RabbitMqNode::start_in_memory_alarm()?;
    /// # let _ = node;
    /// # Ok::<(), String>(())
    /// ```
    pub fn start_in_memory_alarm() -> Result<Self, String> {
        Self::installed()?;
        with_port_retries(|| Self::try_start("vm_memory_high_watermark.absolute = 1MB\n"))
    }

    /// `Err` naming what is missing to run a node (RabbitMQ's start script,
    /// Erlang's `epmd`).
    ///
    /// ```
    /// if let Err(missing) = inbox_test_servers::RabbitMqNode::installed() {
    ///     println!("{missing}");
    /// }
    /// ```
    pub fn installed() -> Result<(), String> {
        let missing = if Path::new(SERVER_SCRIPT).is_file() {
            vec![]
        } else {
            vec![SERVER_SCRIPT]
        };
        crate::process::require_installed(missing, &[EPMD], "rabbitmq-server")
    }

    /// `amqp://inbox:<password>@127.0.0.1:<port>/%2f` (the default virtual host).
    ///
    /// ```no_run
    /// let node = inbox_test_servers::RabbitMqNode::start()?;
    /// assert!(node.url().ends_with("/%2f"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn url(&self) -> String {
        format!(
            "amqp://{USER}:{}@127.0.0.1:{}/%2f",
            self.password, self.amqp_port
        )
    }

    /// Starts a node whose `rabbitmq.conf` also holds `extra_config`.
    fn try_start(extra_config: &str) -> Result<Self, String> {
        let as_rabbitmq = running_as_root();
        let dir = private_dir("inbox_rabbitmq", as_rabbitmq.then_some(OS_USER))?;
        let ports = free_ports(3)?;
        let mut node = RabbitMqNode {
            dir,
            amqp_port: ports[0],
            epmd_port: ports[2],
            password: random_password()?,
            process: None,
        };
        let config = node.dir.join("rabbitmq.conf");
        write_private(
            &config,
            &format!(
                "default_user = {USER}\ndefault_pass = {}\n{extra_config}",
                node.password
            ),
        )?;
        let plugins = node.dir.join("enabled_plugins");
        write_private(&plugins, "[].\n")?;
        // Read instead of /etc/rabbitmq/rabbitmq-env.conf (the machine's node name and port).
        let env_file = node.dir.join("rabbitmq-env.conf");
        write_private(&env_file, "")?;
        if as_rabbitmq {
            run(Command::new("chown")
                .arg(format!("{OS_USER}:{OS_USER}"))
                .args([&config, &plugins, &env_file]))?;
        }

        let mut command = Command::new(SERVER_SCRIPT);
        command
            .current_dir(&node.dir)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            // The Erlang cookie goes to $HOME/.erlang.cookie.
            .env("HOME", &node.dir)
            .env("RABBITMQ_NODENAME", format!("{}@localhost", node.name()))
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", ports[0].to_string())
            .env("RABBITMQ_DIST_PORT", ports[1].to_string())
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-kernel inet_dist_use_interface {127,0,0,1}",
            )
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("ERL_EPMD_PORT", node.epmd_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", node.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", node.dir.join("log"))
            .env("RABBITMQ_CONFIG_FILE", &config)
            .env(
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                node.dir.join("advanced.config"),
            )
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", &plugins)
            .env("RABBITMQ_CONF_ENV_FILE", &env_file);
        if as_rabbitmq {
            let (uid, gid) = os_user_ids(OS_USER)?;
            command.uid(uid).gid(gid);
        }
        node.process = Some(spawn_server(&mut command, &node.dir.join("node.out"))?);
        node.wait_ready()?;
        Ok(node)
    }

    /// The node's name, before `@localhost`: the directory's unique part.
    fn name(&self) -> String {
        self.dir
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| "inbox_rabbitmq".to_owned())
    }

    /// Waits until the AMQP port accepts connections (RabbitMQ opens it last
    /// in its boot), or fails with the tail of the node's output when it
    /// exits or takes too long.
    fn wait_ready(&mut self) -> Result<(), String> {
        let (port, output) = (self.amqp_port, self.dir.join("node.out"));
        wait_ready(
            &format!("RabbitMQ on port {port}"),
            &mut self.process,
            START_TIMEOUT,
            || accepts_connections(port),
            || log_tail(&output, 25),
        )
    }
}

impl Drop for RabbitMqNode {
    /// Kills the node's process group (the start script's `erl` and its
    /// helpers), then its port mapper, which daemonized itself, then
    /// removes the directory.
    fn drop(&mut self) {
        if let Some(mut child) = self.process.take() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
        // Refused while a node is registered: the killed node's registration
        // ends with its connection, so try for a moment.
        for _ in 0..20 {
            let stopped = Command::new(EPMD)
                .args(["-port", &self.epmd_port.to_string(), "-kill"])
                .env("ERL_EPMD_ADDRESS", "127.0.0.1")
                .output()
                .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "Killed");
            if stopped || !accepts_connections(self.epmd_port) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
