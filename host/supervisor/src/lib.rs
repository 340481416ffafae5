//! The supervisor: runs each enabled extension as a child process and keeps it running.
//!
//! One actor task per extension owns its child, its session and its stderr capture, and walks
//! a small state machine:
//!
//! ```text
//!            preflight fails                     handshake refused (version)
//!   ┌──────── refused          starting ───────────────────────► incompatible
//!   │                         │   ▲  │ ready within the start timeout
//!   │                         │   │  ▼
//!   │           spawn/handshake fails  ready ── exit, EOF ──► backing-off / crash-looping
//!   │                         └──────────────────────────────────────┘ (after the delay)
//!   └─ restart ─► starting     stop, shutdown ─► stopping ─► stopped
//! ```
//!
//! Everything an operator sees ([`Status`]) is kept in one place and copied out on request;
//! no lock is held across an await. Calls to an extension go through [`Extension::call_raw`],
//! which fails at once when the extension is not ready and records per-method latency.
//!
//! Where things are: `supervisor.rs` holds the registry ([`Supervisor`]), `extension.rs` the
//! handle on one extension and its calls ([`Extension`]), `status.rs` what an operator sees
//! ([`Status`], [`ExitRecord`]), `actor.rs` the run loop and `run.rs` how one run ends; this file
//! keeps what the daemon hands in ([`ExtensionSpec`], [`CallbackHandlers`]).
//!
//! Not here: where packages live on disk, HTTP, the database. The daemon gives the supervisor
//! an [`ExtensionSpec`] per package and a [`CallbackHandlers`] factory for the callbacks.

mod actor;
pub mod backoff;
pub mod cgroup;
mod enforce;
mod extension;
pub mod limits;
pub mod log;
pub mod process;
mod run;
pub mod sandbox;
mod stats;
mod status;
mod supervisor;
pub mod tree;
pub mod usage;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use conduit_protocol::Capabilities;
use conduit_rpc::Handler;

use crate::backoff::RestartPolicy;
pub use crate::extension::{ExtCallError, Extension};
use crate::process::{ChildCommand, Confinement};
pub use crate::stats::{LatencyHistogram, MethodStats, Traffic};
pub use crate::status::{
    ExitCause, ExitRecord, InFlightCall, RECENT_EXITS, Resources, State, Status, now_ms,
};
pub use crate::supervisor::Supervisor;

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
    /// this one ([`tree::sweep_ledgers`]). Removed once a stop has killed them all.
    pub ledger: Option<PathBuf>,
    /// Limits, sandbox and cgroup of every run ([`process::spawn_confined`]); the supervisor
    /// enforces the tree-wide limits (see [`usage`]).
    pub confine: Confinement,
    /// Lines for people about the limits (asks of the package not granted), shown in status.
    pub limit_notes: Vec<String>,
    /// Where each limit in force came from (default, package, operator), shown in status.
    pub limit_sources: BTreeMap<limits::LimitKey, limits::LimitSource>,
    pub host_version: String,
}

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
        }
    }
}

/// Builds the handler that serves one extension's callbacks (given its name).
pub type CallbackHandlers = Arc<dyn Fn(&str) -> Arc<dyn Handler> + Send + Sync>;

/// A factory for extensions that may not call back: every callback gets `method_not_found`.
pub fn no_callbacks() -> CallbackHandlers {
    Arc::new(|_| Arc::new(conduit_rpc::NoRequests) as Arc<dyn Handler>)
}
