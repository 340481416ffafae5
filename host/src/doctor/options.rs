//! What `conduit doctor` checks and how long each check may take: [`Options`]. A leaf the
//! checks and the entry point share.

use std::path::{Path, PathBuf};
use std::time::Duration;

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
    pub(super) fn service_config(&self) -> ServiceConfig {
        ServiceConfig {
            manager: self.manager,
            scope: self.scope,
            program: self.program.clone().unwrap_or_default(),
            state_dir: self.state_dir.path.clone(),
            path_env: None,
        }
    }
}
