//! A release `conduit daemon run` for a benchmark: started on a state directory, connected to
//! through its socket, and stopped (SIGTERM, then SIGKILL after 30 s) when dropped, so that an
//! error leaves nothing running.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use conduit_host::client::Client;

/// The binaries `names` beside this executable (build them in the same profile first); an
/// error naming the one missing and `how` to build it.
pub fn siblings<const N: usize>(
    names: [&str; N],
    how: &str,
) -> anyhow::Result<[std::path::PathBuf; N]> {
    let exe = std::env::current_exe().context("this executable's path")?;
    let bin = exe.parent().context("this executable's folder")?;
    let paths = names.map(|n| bin.join(n));
    for p in &paths {
        anyhow::ensure!(
            p.is_file(),
            "{} is missing: build it first (`{how}`)",
            p.display()
        );
    }
    Ok(paths)
}

/// A running daemon; stopped when dropped.
#[derive(Debug)]
pub struct Daemon {
    child: Child,
    pub client: Client,
}

impl Daemon {
    /// Start `conduit daemon run` on `state` (log level `warn`, no telemetry export) and wait
    /// at most `within` for its socket to answer.
    pub async fn start(conduit: &Path, state: &Path, within: Duration) -> anyhow::Result<Daemon> {
        let socket = state.join("run").join("conduit.sock");
        let _ = std::fs::remove_file(&socket);
        let deadline = Instant::now() + within;
        let mut child = Command::new(conduit)
            .args(["daemon", "run"])
            .env("CONDUIT_STATE_DIR", state)
            .env("CONDUIT_LOG", "warn")
            .env("OTEL_SDK_DISABLED", "true")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", conduit.display()))?;
        let client = loop {
            if let Some(c) = Client::connect(&socket).await {
                break c;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the daemon's socket never appeared within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        Ok(Daemon { child, client })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stop it as `systemctl stop` would (SIGTERM) and time it to its exit: every extension
    /// stopped and the store closed. SIGKILL after 60 s, reported as an error.
    pub fn stop(mut self) -> anyhow::Result<Duration> {
        let t = Instant::now();
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).context("SIGTERM")?;
        while t.elapsed() < Duration::from_secs(60) {
            if self.child.try_wait()?.is_some() {
                return Ok(t.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        bail!("the daemon did not exit within 60 s of SIGTERM")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Already reaped (`stop`): its pid may belong to another process by now.
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
