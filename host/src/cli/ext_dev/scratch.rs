//! The scratch daemon of `conduit ext dev --standalone`: `conduit daemon run` on a fresh state
//! directory in the temporary folder (`conduit-dev-XXXXXX`), started for the session, stopped
//! and deleted at its end.
//!
//! The daemon runs in a process group of its own, so a Ctrl-C at the terminal reaches the
//! session alone, which then removes the package and stops the daemon in order; it gets a
//! parent-death signal, so a session killed outright (SIGKILL) does not leave it running. It
//! does not inherit the service manager's variables (`NOTIFY_SOCKET`, `INVOCATION_ID`): it is
//! not the service, and must not talk to its manager.
//!
//! Invariant: every wait is bounded (the start by [`START_TIMEOUT`], the stop by
//! [`STOP_TIMEOUT`], then SIGKILL); the daemon's own log is `daemon.log` in the scratch folder
//! and its last lines are shown when it fails.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use conduit_host::client::Client;
use conduit_host::state_dir::StateDir;

/// How long the scratch daemon may take to answer on its socket.
pub(super) const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long it may take to stop after SIGTERM (it stops its extensions gracefully first)
/// before it is killed.
pub(super) const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A running scratch daemon and its folder.
#[derive(Debug)]
pub(super) struct Scratch {
    dir: Option<tempfile::TempDir>,
    child: tokio::process::Child,
    pub(super) state: StateDir,
    pub(super) client: Client,
}

impl Scratch {
    /// Make the folder, start the daemon, wait until it answers.
    pub(super) async fn start() -> anyhow::Result<Scratch> {
        let dir = tempfile::Builder::new()
            .prefix("conduit-dev-")
            .tempdir()
            .map_err(|e| anyhow::anyhow!("cannot make a scratch state directory: {e}"))?;
        let log_path = dir.path().join("daemon.log");
        let log = std::fs::File::create(&log_path)?;
        let exe = std::env::current_exe()?;
        let mut cmd = tokio::process::Command::new(exe);
        cmd.arg("daemon")
            .arg("run")
            .arg("--state-dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("INVOCATION_ID")
            .env_remove("CONDUIT_STATE_DIR")
            .process_group(0)
            // A session interrupted while the daemon starts drops this: the daemon (with no
            // extension yet) goes with it, before its folder is deleted.
            .kill_on_drop(true);
        // SAFETY: only async-signal-safe calls between fork and exec (prctl, getppid).
        unsafe {
            let parent = std::process::id();
            cmd.pre_exec(move || {
                #[cfg(target_os = "linux")]
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                    .map_err(std::io::Error::from)?;
                // The session died between fork and the line above.
                if nix::unistd::getppid().as_raw() as u32 != parent {
                    return Err(std::io::Error::other("the session ended"));
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start the scratch daemon: {e}"))?;
        let socket = conduit_host::daemon::socket_path(&StateDir::read_only(dir.path())?);
        let until = tokio::time::Instant::now() + START_TIMEOUT;
        let client = loop {
            if let Some(c) = Client::connect(&socket).await {
                break c;
            }
            if let Some(status) = child.try_wait()? {
                anyhow::bail!(
                    "the scratch daemon exited ({status}) before it answered; its log:\n{}",
                    tail(&log_path)
                );
            }
            if tokio::time::Instant::now() > until {
                let _ = child.start_kill();
                let _ = child.wait().await;
                anyhow::bail!(
                    "the scratch daemon did not answer within {START_TIMEOUT:?}; its log:\n{}",
                    tail(&log_path)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let state = StateDir::open(dir.path())?;
        Ok(Scratch {
            dir: Some(dir),
            child,
            state,
            client,
        })
    }

    /// Whether the daemon has exited (and how), with its log's last lines.
    pub(super) fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!(
                "the scratch daemon exited ({status}); its log:\n{}",
                tail(&self.state.path().join("daemon.log"))
            )),
            _ => None,
        }
    }

    /// Stop the daemon (SIGTERM, then SIGKILL after [`STOP_TIMEOUT`]) and delete the folder.
    /// Whether the folder is gone.
    pub(super) async fn stop(mut self) -> bool {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if tokio::time::timeout(STOP_TIMEOUT, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
        match self.dir.take() {
            Some(d) => {
                let path = d.path().to_owned();
                let _ = d.close();
                !path.exists()
            }
            None => true,
        }
    }
}

/// The last lines of a log, for an error.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
