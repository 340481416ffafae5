//! What an operator sees of an extension: its [`State`], its [`Status`] (a snapshot copied out
//! on request), the [`Resources`] in force, and the record of each end of a child
//! ([`ExitRecord`], with its [`ExitCause`] and the calls in flight then).
//!
//! Plain data and the few rules that fill it in; no I/O, no locks (the handle in `extension.rs`
//! keeps the status behind one).

use std::collections::BTreeMap;

use conduit_protocol::Capabilities;
use serde::Serialize;

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
}

impl State {
    /// Every state, in the order of [`State`]'s variants: the metrics export one series each,
    /// and the docs' test asks that `ext status --help` names each. A test fails to compile
    /// while a new variant is missing here.
    pub const ALL: [State; 9] = [
        State::Starting,
        State::Ready,
        State::BackingOff,
        State::CrashLooping,
        State::Incompatible,
        State::Refused,
        State::Stopping,
        State::Stopped,
        State::Disabled,
    ];

    /// The state named `s` (`crash-looping`), if it is one.
    pub fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|st| st.as_str() == s)
    }

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
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
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
    /// Since when (Unix ms) its runs have been failing: the first failure of the current
    /// streak (a crash, a failed start, a stop for a limit, a refusal). Kept across its
    /// restarts; cleared once a run stays ready for the restart policy's stable period, or an
    /// operator restarts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since_ms: Option<i64>,
    /// While its runs keep failing, what the restart policy last made of it (`backing-off`
    /// or `crash-looping`), kept through the next start so a retry in progress still reads as
    /// the streak it is in; cleared with `failing_since_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_as: Option<State>,
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

/// Who asked for a run to end, when the host ended it on request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Requester {
    /// An operator: `conduit ext restart` (or the API's restart), or a change of the package
    /// (disable, remove, upgrade, new settings) that stops the run.
    Operator,
    /// The host on its own: it restarts an extension that stopped answering (unresponsive).
    Host,
    /// The daemon stopping.
    Shutdown,
}

impl Requester {
    pub fn as_str(self) -> &'static str {
        match self {
            Requester::Operator => "operator",
            Requester::Host => "host",
            Requester::Shutdown => "shutdown",
        }
    }
}

/// A request to end a run: who asks, whether a new run follows at once, and why. The one
/// place the words of a requested end are chosen, so an operator's restart never reads like
/// the host's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopRequest {
    pub by: Requester,
    pub restart: bool,
    pub why: String,
}

impl StopRequest {
    /// `conduit ext restart NAME` or `POST /v1/extensions/NAME/restart`.
    pub fn operator_restart() -> Self {
        StopRequest {
            by: Requester::Operator,
            restart: true,
            why: "an operator's restart request".into(),
        }
    }

    /// The host restarts an extension that answered none of its last calls; `details` says
    /// which and how they failed.
    pub fn unresponsive(details: &str) -> Self {
        StopRequest {
            by: Requester::Host,
            restart: true,
            why: format!("unresponsive ({details})"),
        }
    }

    /// An operator's change that stops the run for good: the extension was disabled, removed
    /// or replaced (an upgrade or new settings start a new one).
    pub fn operator_stop() -> Self {
        StopRequest {
            by: Requester::Operator,
            restart: false,
            why: "an operator's stop (disabled, removed, upgraded or reconfigured)".into(),
        }
    }

    /// The daemon is stopping.
    pub fn shutdown() -> Self {
        StopRequest {
            by: Requester::Shutdown,
            restart: false,
            why: "the daemon stopping".into(),
        }
    }

    /// The line `recent exits` shows, `how` being how the child exited.
    fn summary(&self, how: &str) -> String {
        match (self.by, self.restart) {
            (Requester::Operator, true) => format!("restarted at an operator's request ({how})"),
            (Requester::Host, true) => format!("restarted by the host: {} ({how})", self.why),
            _ => format!("stopped by the host after {} ({how})", self.why),
        }
    }
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
    /// Who asked for the end, when the host ended it on request (`stopped-by-host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<Requester>,
    /// Whether a new run followed at once because of that request.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restart: bool,
    /// The exit code or signal, when the child's status was collected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitInfo>,
    /// One line for people: `exit code 3`, `closed its stdout while running; stopped by the
    /// host (killed by SIGKILL)`, `restarted at an operator's request (exit code 0)`,
    /// `restarted by the host: unresponsive (…) (exit code 0)`.
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
            requested_by: None,
            restart: false,
            exit,
            summary,
            in_flight,
        }
    }

    /// The end of a run the host made because `req` asked for it.
    pub(crate) fn requested(
        pid: u32,
        req: &StopRequest,
        exit: Option<ExitInfo>,
        in_flight: Vec<InFlightCall>,
    ) -> Self {
        let mut rec = ExitRecord::new(
            pid,
            ExitCause::StoppedByHost,
            Some(req.why.clone()),
            exit,
            in_flight,
        );
        let how = exit.map_or("its status was not collected".to_owned(), |e| e.to_string());
        rec.summary = req.summary(&how);
        rec.requested_by = Some(req.by);
        rec.restart = req.restart;
        rec
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
            failing_since_ms: None,
            failing_as: None,
            spawn_to_ready_ms: None,
            handshake_ms: None,
            protocol_version: None,
            capabilities: capabilities.map(std::sync::Arc::new),
            stderr_tail: Vec::new(),
            calls: BTreeMap::new(),
            descendants: Vec::new(),
            recent_exits: Vec::new(),
            resources: None,
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
    }

    pub(crate) fn record_exit(&mut self, rec: ExitRecord) {
        if let Some(e) = rec.exit {
            self.last_exit = Some(e);
        }
        self.recent_exits.insert(0, rec);
        self.recent_exits.truncate(RECENT_EXITS);
    }
}

/// What an overview shows of one extension, read without copying its whole status (see
/// `Extension::glance`): a thousand of these are read for one overview.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct Glance {
    pub state: State,
    pub pid: Option<u32>,
    pub restarts: u32,
    pub ready_since_ms: Option<i64>,
    pub next_start_at_ms: Option<i64>,
    /// The newest of the recent exits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<ExitGlance>,
    /// Resident memory of the tree and its CPU share now, while it runs and is sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    /// The memory and CPU limits in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_limit: Option<f64>,
    /// Host calls awaiting the extension's answer now.
    pub in_flight: u32,
    pub calls: crate::stats::CallSummary,
}

/// The newest exit, as an overview shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ExitGlance {
    pub at_ms: i64,
    pub cause: ExitCause,
    pub summary: String,
    /// The exit code or signal, when the child's status was collected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitInfo>,
    /// How many calls were in flight then.
    pub in_flight: u32,
}

impl ExitGlance {
    /// A few words: the exit code or signal (`exit code 3`, `killed by SIGKILL`), else the
    /// cause (`closed-stdout`, `stopped-by-host`, `over-limit`).
    pub fn brief(&self) -> String {
        match (self.cause, self.exit) {
            (ExitCause::Exited | ExitCause::Signalled, Some(e)) => e.to_string(),
            (cause, Some(e)) => format!("{}, {e}", cause.as_str()),
            (cause, None) => cause.as_str().to_owned(),
        }
    }
}

impl ExitCause {
    /// The name on the wire (`closed-stdout`).
    pub fn as_str(self) -> &'static str {
        match self {
            ExitCause::Exited => "exited",
            ExitCause::Signalled => "signalled",
            ExitCause::ClosedStdout => "closed-stdout",
            ExitCause::StoppedByHost => "stopped-by-host",
            ExitCause::OverLimit => "over-limit",
        }
    }
}

impl Glance {
    /// What `status` holds, with no call figures yet.
    pub fn of(status: &Status) -> Glance {
        let res = status.resources.as_ref();
        let usage = res.and_then(|r| r.usage.as_ref());
        Glance {
            state: status.state,
            pid: status.pid,
            restarts: status.restarts,
            ready_since_ms: status.ready_since_ms,
            next_start_at_ms: status.next_start_at_ms,
            last_exit: status.recent_exits.first().map(|e| ExitGlance {
                at_ms: e.at_ms,
                cause: e.cause,
                summary: e.summary.clone(),
                exit: e.exit,
                in_flight: e.in_flight.len() as u32,
            }),
            rss_bytes: usage.map(|u| u.rss_bytes),
            cpu: usage.map(|u| u.cpu),
            memory_limit: res.map(|r| r.limits.memory),
            cpu_limit: res.map(|r| r.limits.cpu),
            in_flight: 0,
            calls: Default::default(),
        }
    }
}

/// The current time in Unix milliseconds, as statuses and the store record it.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::State;

    #[test]
    fn all_holds_every_state_once_in_order() {
        // Exhaustive: a new variant stops this compiling until it has its place in `ALL`.
        fn place(s: State) -> usize {
            match s {
                State::Starting => 0,
                State::Ready => 1,
                State::BackingOff => 2,
                State::CrashLooping => 3,
                State::Incompatible => 4,
                State::Refused => 5,
                State::Stopping => 6,
                State::Stopped => 7,
                State::Disabled => 8,
            }
        }
        for (i, s) in State::ALL.into_iter().enumerate() {
            assert_eq!(place(s), i, "{s} is out of place in State::ALL");
        }
    }
}
