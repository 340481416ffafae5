//! What the daemon hands the supervisor: an [`ExtensionSpec`] per package (what to run, how to
//! confine it, how long to wait, how to restart it) and a [`CallbackHandlers`] factory that
//! serves each extension's callbacks.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use conduit_protocol::Capabilities;
use conduit_rpc::Handler;

use crate::backoff::RestartPolicy;
use crate::limits;
use crate::process::{ChildCommand, Confinement};

/// Everything needed to run one extension.
#[derive(Clone)]
pub struct ExtensionSpec {
    pub name: String,
    pub version: String,
    pub command: ChildCommand,
    pub log_path: PathBuf,
    pub start_timeout: Duration,
    pub stop_grace: Duration,
    pub policy: RestartPolicy,
    /// Checked before every start (the daemon verifies the installed files); an error keeps the
    /// extension `refused` until it is restarted.
    pub preflight: Option<Arc<dyn Fn() -> Result<(), String> + Send + Sync>>,
    /// What the package declares (its manifest), shown until its first handshake says.
    pub declared: Option<Capabilities>,
    /// Where the extension's processes are recorded (pid and start time of the child and of
    /// every descendant seen), so that the next daemon can kill what is left after a crash of
    /// this one ([`crate::tree::sweep_ledgers`]). Removed once a stop has killed them all.
    pub ledger: Option<PathBuf>,
    /// Limits, sandbox and cgroup of every run ([`crate::process::spawn_confined`]); the supervisor
    /// enforces the tree-wide limits (see [`crate::usage`]).
    pub confine: Confinement,
    /// Lines for people about the limits (asks of the package not granted), shown in status.
    pub limit_notes: Vec<String>,
    /// Where each limit in force came from (default, package, operator), shown in status.
    pub limit_sources: BTreeMap<limits::LimitKey, limits::LimitSource>,
    pub host_version: String,
    /// Where the bulk pipe of each run goes (`docs/protocol.md` §8.1). Set, every run gets a
    /// pipe whose write end is its descriptor 3, `initialize` offers it, and this is handed the
    /// read end with the run's session; `None`, no pipe and no offer.
    pub bulk: Option<BulkSink>,
    /// A development install (`conduit ext dev`): every call is journaled
    /// ([`crate::journal`]), and a run that fails is not restarted but held `stopped` with its
    /// cause until the next restart (the author's next change), so a broken edit shows its
    /// error once instead of crash-looping.
    pub development: bool,
}

/// Takes the read end of a run's bulk pipe, with the peer of the run's session (which ends when
/// the run does). Called on the supervisor's task: it must not block.
pub type BulkSink = Arc<dyn Fn(&conduit_rpc::Peer, std::os::fd::OwnedFd) + Send + Sync>;

impl std::fmt::Debug for ExtensionSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtensionSpec")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("command", &self.command)
            .finish_non_exhaustive()
    }
}

impl ExtensionSpec {
    /// A spec with the default timeouts and policy.
    pub fn new(
        name: impl Into<String>,
        version: impl Into<String>,
        command: ChildCommand,
        log_path: PathBuf,
    ) -> Self {
        ExtensionSpec {
            name: name.into(),
            version: version.into(),
            command,
            log_path,
            start_timeout: Duration::from_secs(10),
            stop_grace: conduit_protocol::SHUTDOWN_GRACE,
            policy: RestartPolicy::default(),
            preflight: None,
            declared: None,
            ledger: None,
            confine: Confinement::none(),
            limit_notes: Vec::new(),
            limit_sources: BTreeMap::new(),
            host_version: env!("CARGO_PKG_VERSION").into(),
            bulk: None,
            development: false,
        }
    }
}

/// Builds the handler that serves one extension's callbacks (given its name).
pub type CallbackHandlers = Arc<dyn Fn(&str) -> Arc<dyn Handler> + Send + Sync>;

/// A factory for extensions that may not call back: every callback gets `method_not_found`.
pub fn no_callbacks() -> CallbackHandlers {
    Arc::new(|_| Arc::new(conduit_rpc::NoRequests) as Arc<dyn Handler>)
}
