//! Ctrl-C (and SIGTERM, SIGHUP): the running cargo is told to stop, and the
//! test command goes on to stop its servers instead of dying with them up.

use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// The process id of the running child (cargo), 0 when none.
static CHILD: AtomicU32 = AtomicU32::new(0);

/// Installs the handler: it records the interruption and passes SIGINT on
/// to the running child (which a Ctrl-C at the terminal reaches anyway).
pub fn install() -> Result<(), String> {
    ctrlc::set_handler(|| {
        INTERRUPTED.store(true, Ordering::SeqCst);
        let pid = CHILD.load(Ordering::SeqCst);
        if pid != 0 {
            let _ = Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status();
        }
    })
    .map_err(|e| format!("install the Ctrl-C handler: {e}"))
}

/// Whether a Ctrl-C (or SIGTERM, SIGHUP) arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Runs `command` to its end, as the child an interruption is passed on to.
pub fn run_child(command: &mut Command) -> Result<ExitStatus, String> {
    let mut child = command.spawn().map_err(|e| format!("{command:?}: {e}"))?;
    CHILD.store(child.id(), Ordering::SeqCst);
    let status = child.wait().map_err(|e| format!("{command:?}: {e}"));
    CHILD.store(0, Ordering::SeqCst);
    status
}
