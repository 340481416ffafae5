//! `conduit doctor`: every installation check, each one line with ok, warn or fail, what was
//! found and the exact command that fixes it. The CLI prints the [`Report`]; the web view's
//! doctor page renders the same one.
//!
//! ```text
//!   run(&Options) ─┬─ state-dir      files.rs     ownership and modes of the state directory
//!                  ├─ daemon         live.rs      running and answering GET /v1/health
//!                  ├─ store          files.rs     quick_check on a read-only connection, bounded
//!                  ├─ disk, wal      files.rs     free space; the size of conduit.db-wal
//!                  ├─ service        service.rs   the unit runs this binary on this state dir
//!                  ├─ sandbox        confine.rs   the kernel's Landlock ABI
//!                  ├─ cgroups        confine.rs   the daemon's cgroup delegated (read, never made)
//!                  ├─ packages       files.rs     installed files as recorded
//!                  ├─ processes      processes.rs stale pid ledgers, escaped processes
//!                  └─ extensions     live.rs      crash-looping, refused, unresponsive, over limits…
//! ```
//!
//! Invariant: read-only. Nothing here creates, writes, renames, chmods, locks for writing or
//! signals anything: not the state directory (a missing one is reported, never created), not
//! the store (opened read-only), not a package's kept stats, not a cgroup, not a process. Every
//! wait is bounded: the store check by [`Options::store_timeout`], the daemon's answers by
//! [`Options::daemon_timeout`]. What the daemon knows comes through its management API, as
//! for any other client.
//!
//! Entry point: [`run`]. The report's JSON shape is fixed in `report.rs`.

mod confine;
mod files;
mod live;
mod processes;
mod report;
mod service;
mod text;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use report::{Check, Report, Status};

use crate::service::{Manager, Scope, ServiceConfig};
use crate::state_dir::{self, ResolvedStateDir, StateDirError};

/// How long `quick_check` may run by default.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the daemon has to answer each request by default.
pub const DAEMON_TIMEOUT: Duration = Duration::from_secs(5);

/// What to check and how long each check may take.
#[derive(Clone, Debug)]
pub struct Options {
    /// The state directory to check, and the rule that chose it.
    pub state_dir: ResolvedStateDir,
    /// The binary a service unit should run: this one, as `conduit service install` would
    /// write it. `None` when it cannot be found.
    pub program: Option<PathBuf>,
    /// Which service manager, and the user's or the machine's.
    pub manager: Manager,
    pub scope: Scope,
    /// Where the service file is (`None`: no home to look in).
    pub service_file: Option<PathBuf>,
    /// How long the store's `quick_check` may run before it is interrupted.
    pub store_timeout: Duration,
    /// How long the daemon has to answer each request.
    pub daemon_timeout: Duration,
}

impl Options {
    /// The options for this process: the state directory from `flag`, else
    /// `$CONDUIT_STATE_DIR`, else the platform's default (as every command resolves it); this
    /// binary; the user's service manager (the machine's for root); the default timeouts.
    pub fn from_env(flag: Option<&Path>) -> Result<Options, StateDirError> {
        let state_dir = state_dir::resolve_from_env(flag)?;
        let program = std::env::current_exe().and_then(|p| p.canonicalize()).ok();
        let manager = Manager::native();
        let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
        let xdg = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|x| !x.is_empty())
            .map(PathBuf::from);
        let path_of = |scope| {
            ServiceConfig {
                manager,
                scope,
                program: PathBuf::new(),
                state_dir: PathBuf::new(),
                path_env: None,
            }
            .install_path(
                Path::new(home.as_deref().unwrap_or("/".as_ref())),
                xdg.as_deref(),
            )
        };
        // The user's own service, as `conduit service install` writes it by default; for root
        // without one, the machine's (`--system`) when that is installed.
        let user = home.is_some().then(|| path_of(Scope::User));
        let system = path_of(Scope::System);
        let (scope, service_file) = match user {
            Some(u) if u.exists() => (Scope::User, Some(u)),
            _ if nix::unistd::Uid::effective().is_root() && system.exists() => {
                (Scope::System, Some(system))
            }
            u => (Scope::User, u),
        };
        Ok(Options {
            state_dir,
            program,
            manager,
            scope,
            service_file,
            store_timeout: STORE_TIMEOUT,
            daemon_timeout: DAEMON_TIMEOUT,
        })
    }

    /// What `conduit service install` would write for this state directory (only its
    /// commands are used: how to start, restart and read the log of the service).
    fn service_config(&self) -> ServiceConfig {
        ServiceConfig {
            manager: self.manager,
            scope: self.scope,
            program: self.program.clone().unwrap_or_default(),
            state_dir: self.state_dir.path.clone(),
            path_env: None,
        }
    }
}

/// Run every check and report. Never fails: a check that cannot look says so on its line.
///
/// Async because the daemon is asked through its API; the file checks run on a blocking
/// thread (`spawn_blocking`), so this may be awaited on any runtime, a current-thread one
/// included.
pub async fn run(opts: &Options) -> Report {
    let mut checks = Vec::new();
    let o = opts.clone();
    let dir = blocking(move || files::state_dir(&o)).await;
    let (state, check) = match dir {
        Ok(v) => v,
        Err(e) => (None, Check::fail("state-dir", e, "conduit doctor -v")),
    };
    checks.push(check);
    let service = {
        let o = opts.clone();
        blocking(move || service::read(&o)).await.ok().flatten()
    };
    let live = live::daemon(opts, state.as_ref(), service.as_ref()).await;
    checks.push(live.check.clone());
    let o = opts.clone();
    let (s, svc, l) = (state.clone(), service.clone(), live.answer.clone());
    let local = blocking(move || {
        let mut c = Vec::new();
        if let Some(state) = &s {
            c.extend(files::store(&o, state));
            c.extend(files::disk(state));
            c.extend(files::wal(state));
        }
        c.push(service::check(&o, svc.as_ref()));
        c.push(confine::sandbox());
        c.push(confine::cgroups(l.as_deref(), svc.as_ref()));
        if let Some(state) = &s {
            c.extend(files::packages(state));
            c.push(processes::check(state, l.as_deref()));
        }
        c
    })
    .await;
    match local {
        Ok(c) => checks.extend(c),
        Err(e) => checks.push(Check::fail("doctor", e, "conduit doctor -v")),
    }
    if let Some(answer) = &live.answer {
        checks.extend(live::extensions(answer));
    }
    Report::new(checks)
}

/// Run `f` on a blocking thread; a panic in it becomes a line of the report.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("a check panicked: {e}"))
}
