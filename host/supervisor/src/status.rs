//! What an operator sees of an extension: its [`State`], its [`Status`] (a snapshot copied out
//! on request), the [`Resources`] in force, and the record of each end of a child
//! ([`ExitRecord`], with its [`ExitCause`] and the calls in flight then).
//!
//! Plain data and the few rules that fill it in; no I/O, no locks (the handle in `extension.rs`
//! keeps the status behind one).

use std::collections::BTreeMap;

use conduit_protocol::Capabilities;
use serde::Serialize;

use crate::lifecycle::StartMode;
use crate::limits::{self, Limits};
use crate::process::ExitInfo;
use crate::sandbox::SandboxStatus;
use crate::stats::MethodStats;
use crate::usage::Usage;

/// How many exits an extension's status keeps, newest first.
pub const RECENT_EXITS: usize = 5;

/// What an operator sees of an extension's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    Starting,
    Ready,
    BackingOff,
    CrashLooping,
    Incompatible,
    /// The installed files changed after install (or another preflight check failed).
    Refused,
    Stopping,
    Stopped,
    Disabled,
    /// Not running, and started when something needs it: an on-demand extension not started
    /// yet, or a run stopped after `idle_stop_after` without calls.
    Idle,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Ready => "ready",
            State::BackingOff => "backing-off",
            State::CrashLooping => "crash-looping",
            State::Incompatible => "incompatible",
            State::Refused => "refused",
            State::Stopping => "stopping",
            State::Stopped => "stopped",
            State::Disabled => "disabled",
            State::Idle => "idle",
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// What `Extension::run_brief` reads: the current run's state, pid, restarts, whether its
/// handshake was accepted, and whether it is a first run (see [`Status::first_run`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunBrief {
    pub state: State,
    pub pid: Option<u32>,
    pub restarts: u32,
    pub handshaken: bool,
    pub first_run: bool,
}

/// A snapshot of one extension.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Status {
    pub name: String,
    pub version: String,
    pub state: State,
    pub pid: Option<u32>,
    pub restarts: u32,
    pub last_exit: Option<ExitInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the next start is due (unix ms), while backing off.
    pub next_start_at_ms: Option<i64>,
    /// The delay the restart policy chose for this backoff (jitter included), while backing off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_ms: Option<u64>,
    pub ready_since_ms: Option<i64>,
    /// Of the current run, once ready: milliseconds from spawning the process to its accepted
    /// handshake (the cold start), and of those the handshake alone (`initialize` sent to its
    /// answer). `null` while starting or not running.
    #[serde(default)]
    pub spawn_to_ready_ms: Option<u64>,
    #[serde(default)]
    pub handshake_ms: Option<u64>,
    pub protocol_version: Option<u32>,
    /// Shared: a status is copied often (every pass of the host loop asks), its capabilities
    /// are set once per accepted handshake.
    pub capabilities: Option<std::sync::Arc<Capabilities>>,
    pub stderr_tail: Vec<String>,
    pub calls: BTreeMap<String, MethodStats>,
    /// The live descendants of the current child (pids), as last seen, whatever process group
    /// or session they moved to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub descendants: Vec<u32>,
    /// The last [`RECENT_EXITS`] ends of a child, newest first, with their causes and the calls
    /// in flight at that moment. Kept across restarts, upgrades and disable.
    #[serde(default)]
    pub recent_exits: Vec<ExitRecord>,
    /// The limits and sandbox in force and the current use; absent for a child with none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// When it is started: `always` or `on-demand`.
    #[serde(default)]
    pub start: StartMode,
    /// After how long without a call a ready run is stopped (ms); absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_stop_after_ms: Option<u64>,
    /// Since when it has been `idle` (unix ms): never started, or stopped for idleness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_since_ms: Option<i64>,
    /// Why the current (or last) run was started: `started with the daemon`, `started by event
    /// 1234 of kind note.posted`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_reason: Option<String>,
    /// Starts asked for by a need (an event, a timer, a call, …) since the daemon started it.
    #[serde(default)]
    pub demand_starts: u64,
    /// Runs stopped after `idle_stop_after` without calls (not crashes, not restarts).
    #[serde(default)]
    pub idle_stops: u64,
    /// Whether the current run is the first since the extension was started (by the daemon,
    /// an install, an enable or a need) with no failure since: the host loop waits for such a
    /// run instead of giving fallbacks.
    #[serde(skip)]
    pub first_run: bool,
}

/// The limits and sandbox of an extension, how they are enforced, and what it uses now.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct Resources {
    pub limits: Limits,
    /// Where each limit came from: `default`, `package` (its ask) or `operator`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sources: BTreeMap<limits::LimitKey, limits::LimitSource>,
    /// How the limits are enforced: `cgroup v2 (...)` or `rlimits + supervisor (...)` (one of
    /// a few fixed texts: borrowed, so a status copied every pass copies no text of it).
    pub mechanism: std::borrow::Cow<'static, str>,
    pub sandbox: SandboxStatus,
    /// Of the current run, while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// How many runs the host stopped for exceeding a limit (kept across restarts).
    #[serde(default)]
    pub limit_stops: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Why a child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExitCause {
    /// It exited on its own (any code).
    Exited,
    /// A signal the host did not send killed it.
    Signalled,
    /// It closed its stdout while still running; the host then stopped it.
    ClosedStdout,
    /// The host stopped it (see `reason`).
    StoppedByHost,
    /// The host stopped it for exceeding a limit (`reason` names it and the use).
    OverLimit,
}

/// A call that was in flight when a child ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct InFlightCall {
    pub method: String,
    /// How long it had been waiting for its answer.
    pub age_ms: u64,
}

/// One end of a child, for `ext status`.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct ExitRecord {
    pub at_ms: i64,
    pub pid: u32,
    pub cause: ExitCause,
    /// Why the host stopped it, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The exit code or signal, when the child's status was collected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitInfo>,
    /// One line for people: `exit code 3`, `closed its stdout while running; stopped by the
    /// host (killed by SIGKILL)`, `stopped by the host after an operator's stop (exit code 0)`.
    pub summary: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_flight: Vec<InFlightCall>,
}

impl ExitRecord {
    pub(crate) fn new(
        pid: u32,
        cause: ExitCause,
        reason: Option<String>,
        exit: Option<ExitInfo>,
        in_flight: Vec<InFlightCall>,
    ) -> Self {
        let how = exit.map_or("its status was not collected".to_owned(), |e| e.to_string());
        let summary = match cause {
            ExitCause::Exited | ExitCause::Signalled => how,
            ExitCause::ClosedStdout => {
                format!("closed its stdout while running; stopped by the host ({how})")
            }
            ExitCause::StoppedByHost => format!(
                "stopped by the host after {} ({how})",
                reason.as_deref().unwrap_or("a request")
            ),
            ExitCause::OverLimit => format!(
                "stopped: {} ({how})",
                reason.as_deref().unwrap_or("over a limit")
            ),
        };
        ExitRecord {
            at_ms: exit.map_or_else(now_ms, |e| e.at_ms),
            pid,
            cause,
            reason,
            exit,
            summary,
            in_flight,
        }
    }
}

impl Status {
    /// The status of an extension that has not run yet.
    pub fn new(
        name: &str,
        version: &str,
        state: State,
        capabilities: Option<Capabilities>,
    ) -> Self {
        Status {
            name: name.to_owned(),
            version: version.to_owned(),
            state,
            pid: None,
            restarts: 0,
            last_exit: None,
            last_error: None,
            next_start_at_ms: None,
            backoff_ms: None,
            ready_since_ms: None,
            spawn_to_ready_ms: None,
            handshake_ms: None,
            protocol_version: None,
            capabilities: capabilities.map(std::sync::Arc::new),
            stderr_tail: Vec::new(),
            calls: BTreeMap::new(),
            descendants: Vec::new(),
            recent_exits: Vec::new(),
            resources: None,
            start: StartMode::Always,
            idle_stop_after_ms: None,
            idle_since_ms: None,
            start_reason: None,
            demand_starts: 0,
            idle_stops: 0,
            first_run: true,
        }
    }

    /// Take over what an earlier status of the same package knew of its past (its exits and
    /// last error), for a package that is not running or starts anew (enable, upgrade).
    pub fn carry_history(&mut self, earlier: &Status) {
        if self.recent_exits.is_empty() {
            self.recent_exits = earlier.recent_exits.clone();
        }
        if self.last_exit.is_none() {
            self.last_exit = earlier.last_exit;
        }
        if self.last_error.is_none() {
            self.last_error = earlier.last_error.clone();
        }
        if let (Some(now), Some(then)) = (&mut self.resources, &earlier.resources) {
            now.limit_stops = now.limit_stops.max(then.limit_stops);
        }
        self.demand_starts = self.demand_starts.max(earlier.demand_starts);
        self.idle_stops = self.idle_stops.max(earlier.idle_stops);
    }

    pub(crate) fn record_exit(&mut self, rec: ExitRecord) {
        if let Some(e) = rec.exit {
            self.last_exit = Some(e);
        }
        self.recent_exits.insert(0, rec);
        self.recent_exits.truncate(RECENT_EXITS);
    }
}

/// The current time in Unix milliseconds, as statuses and the store record it.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
