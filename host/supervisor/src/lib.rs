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
//! Not here: where packages live on disk, HTTP, the database. The daemon gives the supervisor
//! an [`ExtensionSpec`] per package and a [`CallbackHandlers`] factory for the callbacks.

pub mod backoff;
pub mod cgroup;
mod enforce;
pub mod limits;
pub mod log;
pub mod process;
pub mod sandbox;
mod stats;
pub mod tree;
pub mod usage;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conduit_protocol::calls::Empty;
use conduit_protocol::handshake::{InitializeParams, InitializeResult};
use conduit_protocol::{Capabilities, ErrorCode, PROTOCOL_VERSIONS, methods};
use conduit_rpc::{
    BoxFuture, CallError, Handler, HandlerResult, Peer, Request, Session, SessionConfig,
    SessionCounters,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio::process::Child;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backoff::{Jitter, RestartPolicy, RestartTracker, RunFacts};
use crate::enforce::{Enforcer, mechanism, over_limit, signal_tree};
use crate::limits::Limits;
use crate::log::{LogFile, Tail};
use crate::process::{ChildCommand, Confinement, ExitInfo};
use crate::sandbox::SandboxStatus;
pub use crate::stats::{LatencyHistogram, MethodStats, Traffic};
use crate::tree::{Ledger, ProcId, TRACK_INTERVAL, TRACK_INTERVAL_QUIET};
use crate::usage::Usage;

/// How many exits an extension's status keeps, newest first.
pub const RECENT_EXITS: usize = 5;

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

struct SharedHandler(Arc<dyn Handler>);

impl Handler for SharedHandler {
    fn request(&self, req: Request) -> BoxFuture<HandlerResult> {
        self.0.request(req)
    }
    fn notification(&self, method: &str, params: Option<&RawValue>, peer: &Peer) {
        self.0.notification(method, params, peer)
    }
}

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
    /// Of the current run, once ready: milliseconds from spawning the process to its accepted
    /// handshake (the cold start), and of those the handshake alone (`initialize` sent to its
    /// answer). `null` while starting or not running.
    #[serde(default)]
    pub spawn_to_ready_ms: Option<u64>,
    #[serde(default)]
    pub handshake_ms: Option<u64>,
    pub protocol_version: Option<u32>,
    pub capabilities: Option<Capabilities>,
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
    /// How the limits are enforced: `cgroup v2 (...)` or `rlimits + supervisor (...)`.
    pub mechanism: String,
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
    fn new(
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
            capabilities,
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

    fn record_exit(&mut self, rec: ExitRecord) {
        if let Some(e) = rec.exit {
            self.last_exit = Some(e);
        }
        self.recent_exits.insert(0, rec);
        self.recent_exits.truncate(RECENT_EXITS);
    }
}

/// Params with the request's remaining time first (docs/protocol.md §11).
#[derive(Serialize)]
struct WithMeta<'a, P: ?Sized> {
    #[serde(rename = "_meta")]
    meta: Meta,
    #[serde(flatten)]
    params: &'a P,
}

#[derive(Serialize)]
struct Meta {
    remaining_ms: u64,
}

/// Why a call to an extension failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExtCallError {
    #[error("extension `{ext}` is not running (it is {state}); see `conduit ext status {ext}`")]
    NotRunning { ext: String, state: State },
    #[error("extension `{ext}`: {source}")]
    Call { ext: String, source: CallError },
}

impl ExtCallError {
    /// The error code it is reported as.
    pub fn code(&self) -> i32 {
        match self {
            ExtCallError::NotRunning { .. } => ErrorCode::ExtensionExited.number(),
            ExtCallError::Call { source, .. } => source.code(),
        }
    }

    pub fn is(&self, code: ErrorCode) -> bool {
        self.code() == code.number()
    }

    /// How to read the failure (docs/protocol.md §12; `conduit_protocol::classify`).
    pub fn class(&self) -> conduit_protocol::ErrorClass {
        match self {
            ExtCallError::NotRunning { .. } => conduit_protocol::ErrorClass::Retryable,
            ExtCallError::Call { source, .. } => source.class(),
        }
    }
}

enum Cmd {
    Restart,
    Stop,
}

struct Core {
    status: Status,
}

struct Inner {
    name: String,
    core: Mutex<Core>,
    /// Every process seen in the current child's tree (see [`tree`]).
    recorded: Mutex<BTreeSet<ProcId>>,
    /// Calls awaiting an answer: id → (method, since when).
    in_flight: Mutex<HashMap<u64, (Box<str>, Instant)>>,
    next_call: std::sync::atomic::AtomicU64,
    peer: watch::Sender<Option<Peer>>,
    stats: stats::Stats,
    /// Every session's bytes and refusals, across the extension's restarts.
    traffic: Arc<SessionCounters>,
    /// Host calls that failed with `overloaded` (not sent, or refused by the extension).
    overloaded_calls: std::sync::atomic::AtomicU64,
    tail: Mutex<Tail>,
    cmds: mpsc::UnboundedSender<Cmd>,
    /// Sends every state change, for waiters (tests, the CLI's "wait until ready").
    changes: watch::Sender<State>,
}

/// A handle on one supervised extension. Cheap to clone.
#[derive(Clone)]
pub struct Extension {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Extension {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extension")
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

/// The current time in Unix milliseconds, as statuses and the store record it.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Extension {
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The status without its call statistics and stderr tail: cheap enough for a caller that
    /// asks on every pass (the host loop), where [`Extension::status`] computes percentiles.
    pub fn brief(&self) -> Status {
        self.inner
            .core
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .status
            .clone()
    }

    /// A snapshot of the status.
    pub fn status(&self) -> Status {
        let mut s = self.brief();
        s.stderr_tail = self
            .inner
            .tail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lines();
        s.calls = self.inner.stats.snapshot();
        s
    }

    pub fn state(&self) -> State {
        *self.inner.changes.borrow()
    }

    /// Wait until `pred(state)` holds, at most `timeout`. Returns the last state seen.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(State) -> bool,
    ) -> Result<State, State> {
        let mut rx = self.inner.changes.subscribe();
        let res = tokio::time::timeout(timeout, rx.wait_for(|s| pred(*s))).await;
        match res {
            Ok(Ok(s)) => Ok(*s),
            _ => Err(self.state()),
        }
    }

    /// The session's peer while the extension is ready.
    pub fn peer(&self) -> Option<Peer> {
        self.inner.peer.borrow().clone()
    }

    /// Call `method`; fails at once if the extension is not ready. Latency is recorded per method.
    pub async fn call_raw(
        &self,
        method: &str,
        params: &RawValue,
        deadline: Option<Duration>,
    ) -> Result<Box<RawValue>, ExtCallError> {
        let Some(peer) = self.peer() else {
            return Err(ExtCallError::NotRunning {
                ext: self.inner.name.clone(),
                state: self.state(),
            });
        };
        // One span per call, fields not text; `debug`, so with no export configured the call
        // site is disabled and costs nothing (docs/operations.md, "Telemetry").
        let span = tracing::debug_span!(
            "extension.call",
            extension = %self.inner.name,
            method,
            direction = "host_to_extension",
            in_transaction = conduit_protocol::methods::host::IN_TRANSACTION.contains(&method),
            // Filled in by the session once it numbers the request.
            request_id = tracing::field::Empty,
            duration_us = tracing::field::Empty,
            outcome = tracing::field::Empty,
            error_code = tracing::field::Empty,
        );
        let t = Instant::now();
        let id = self
            .inner
            .next_call
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, (method.into(), t));
        // Removed however the call ends, dropped by its caller included.
        struct Done<'a>(&'a Inner, u64);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0
                    .in_flight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&self.1);
            }
        }
        let done = Done(&self.inner, id);
        // The request carries its remaining time (docs/protocol.md §11), written into the
        // params' text; `initialize` is not sent from here. The insertion keeps valid JSON
        // valid, so the text goes out as built, without a second parse.
        let carried = deadline.and_then(|d| {
            conduit_protocol::meta::with_remaining_ms(params.get(), d.as_millis() as u64)
        });
        let call = async {
            match &carried {
                Some(text) => peer.call_prebuilt(method, text, deadline).await,
                None => peer.call_raw(method, params, deadline).await,
            }
        };
        let res = tracing::Instrument::instrument(call, span.clone()).await;
        let took = t.elapsed();
        if matches!(res, Err(CallError::Closed { .. })) {
            // It failed because the child ended: left for the actor, which lists it in the
            // exit's record and then clears the table.
            std::mem::forget(done);
        }
        self.inner.stats.record(method, took, res.is_ok());
        if let Err(e) = &res
            && e.is(ErrorCode::Overloaded)
        {
            self.inner
                .overloaded_calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if !span.is_disabled() {
            span.record("duration_us", took.as_micros() as u64);
            match &res {
                Ok(_) => span.record("outcome", "ok"),
                Err(e) => span
                    .record("outcome", "error")
                    .record("error_code", e.code()),
            };
        }
        res.map_err(|source| ExtCallError::Call {
            ext: self.inner.name.clone(),
            source,
        })
    }

    /// Typed [`Extension::call_raw`].
    pub async fn call<P: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
        deadline: Option<Duration>,
    ) -> Result<R, ExtCallError> {
        let ext = || self.inner.name.clone();
        let bad = |detail: String| ExtCallError::Call {
            ext: ext(),
            source: CallError::BadResult {
                method: method.into(),
                detail,
            },
        };
        // With a deadline, `_meta.remaining_ms` goes in as the params are written (docs/
        // protocol.md §11), so `call_raw` finds it there and copies nothing.
        let with_meta = deadline.and_then(|d| {
            serde_json::value::to_raw_value(&WithMeta {
                meta: Meta {
                    remaining_ms: d.as_millis() as u64,
                },
                params,
            })
            .ok()
        });
        let params = match with_meta {
            Some(p) => p,
            None => serde_json::value::to_raw_value(params)
                .map_err(|e| bad(format!("params do not serialize: {e}")))?,
        };
        let raw = self.call_raw(method, &params, deadline).await?;
        serde_json::from_str(raw.get()).map_err(|e| {
            self.record_bad_answer(method);
            bad(e.to_string())
        })
    }

    /// What is in flight and what has crossed the pipes, for metrics.
    pub fn traffic(&self) -> Traffic {
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let t = &self.inner.traffic;
        Traffic {
            calls_in_flight: self
                .inner
                .in_flight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .len() as u64,
            callbacks_in_flight: self.peer().map_or(0, |p| p.incoming_in_flight() as u64),
            bytes_in: load(&t.bytes_in),
            bytes_out: load(&t.bytes_out),
            overloaded_calls: load(&self.inner.overloaded_calls),
            overloaded_callbacks: load(&t.refused_overloaded),
        }
    }

    /// The latency histogram of each method: cumulative counts at `bounds_us` (ascending), the
    /// total count and the sum of the latencies in microseconds.
    pub fn latency_histograms(&self, bounds_us: &[u64]) -> BTreeMap<String, LatencyHistogram> {
        self.inner.stats.histograms(bounds_us)
    }

    /// Count an answer that arrived but broke the method's rules, in the method's errors.
    pub fn record_bad_answer(&self, method: &str) {
        self.inner.stats.mark_error(method);
    }

    /// Ask the actor to restart the extension now (also from `backing-off`, `crash-looping`,
    /// `incompatible` or `refused`); resets the failure count.
    pub fn restart(&self) {
        let _ = self.inner.cmds.send(Cmd::Restart);
    }

    /// The calls awaiting an answer now, oldest first.
    fn in_flight(&self) -> Vec<InFlightCall> {
        let map = self
            .inner
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<(Instant, &str)> = map.values().map(|(m, t)| (*t, &**m)).collect();
        v.sort();
        v.into_iter()
            .map(|(t, m)| InFlightCall {
                method: m.to_owned(),
                age_ms: t.elapsed().as_millis() as u64,
            })
            .collect()
    }

    /// Whether `id` is a process of this extension's current or last child, as recorded.
    fn owns(&self, id: ProcId) -> bool {
        self.inner
            .recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&id)
    }

    fn update(&self, f: impl FnOnce(&mut Status)) {
        let state = {
            let mut core = self.inner.core.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut core.status);
            core.status.state
        };
        self.inner.changes.send_replace(state);
    }
}

struct Running {
    ext: Extension,
    task: JoinHandle<()>,
}

type RunningMap = Arc<Mutex<HashMap<String, Running>>>;

/// All supervised extensions.
pub struct Supervisor {
    running: RunningMap,
    /// The last status of each package that stopped, for its history (exits, last error).
    retired: Mutex<HashMap<String, Status>>,
    handlers: CallbackHandlers,
    shutdown: CancellationToken,
    /// Reaps (and kills) adopted orphans while this process is a subreaper.
    reaper: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor").finish_non_exhaustive()
    }
}

fn lock_map(map: &RunningMap) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
    map.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reap adopted orphans, and kill those no running extension claims.
fn reap_once(map: &RunningMap) {
    let exts: Vec<Extension> = lock_map(map).values().map(|r| r.ext.clone()).collect();
    let (_, killed) = process::reap_orphans(|id| exts.iter().any(|e| e.owns(id)));
    if killed > 0 {
        tracing::warn!(
            killed,
            "killed processes whose extension had stopped (they had left its process tree)"
        );
    }
}

impl Supervisor {
    /// A supervisor. Must be called inside a tokio runtime. If this process is a child
    /// subreaper ([`process::become_subreaper`]), it also reaps the orphans that come to it and
    /// kills those of extensions that no longer run.
    pub fn new(handlers: CallbackHandlers) -> Self {
        let running: RunningMap = Arc::new(Mutex::new(HashMap::new()));
        let shutdown = CancellationToken::new();
        let reaper = process::is_subreaper().then(|| {
            let (map, stop) = (running.clone(), shutdown.clone());
            tokio::spawn(async move {
                use tokio::signal::unix::{SignalKind, signal};
                let mut sigchld = signal(SignalKind::child()).ok();
                loop {
                    tokio::select! {
                        _ = async { match &mut sigchld { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {}
                        () = tokio::time::sleep(TRACK_INTERVAL) => {}
                        () = stop.cancelled() => break,
                    }
                    reap_once(&map);
                }
            })
        });
        Supervisor {
            running,
            retired: Mutex::new(HashMap::new()),
            handlers,
            shutdown,
            reaper: Mutex::new(reaper),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
        lock_map(&self.running)
    }

    fn retire(&self, ext: &Extension) {
        self.retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ext.name().to_owned(), ext.brief());
    }

    /// The last status of a package this supervisor ran and stopped (disabled, removed), for
    /// its history; `None` if it runs or never ran.
    pub fn last_status(&self, name: &str) -> Option<Status> {
        self.retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// Start supervising `spec`. An extension of the same name is stopped first.
    ///
    /// The new extension is listed (as `starting`) at once, even while the one it replaces is
    /// still stopping: whoever asks in between (the host loop) sees an extension about to
    /// start, not a gap.
    pub async fn start(&self, spec: ExtensionSpec) -> Extension {
        let (cmds, cmd_rx) = mpsc::unbounded_channel();
        let mut status = Status::new(
            &spec.name,
            &spec.version,
            State::Starting,
            spec.declared.clone(),
        );
        let earlier = self
            .retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&spec.name);
        if let Some(e) = &earlier {
            status.carry_history(e);
        }
        let ext = Extension {
            inner: Arc::new(Inner {
                name: spec.name.clone(),
                core: Mutex::new(Core { status }),
                recorded: Mutex::new(BTreeSet::new()),
                in_flight: Mutex::new(HashMap::new()),
                next_call: std::sync::atomic::AtomicU64::new(0),
                peer: watch::Sender::new(None),
                stats: stats::Stats::default(),
                traffic: Arc::default(),
                overloaded_calls: std::sync::atomic::AtomicU64::new(0),
                tail: Mutex::new(Tail::default()),
                cmds,
                changes: watch::Sender::new(State::Starting),
            }),
        };
        let handler = (self.handlers)(&spec.name);
        let mut running = self.lock();
        let previous = running.remove(&spec.name);
        let (actor_ext, shutdown) = (ext.clone(), self.shutdown.child_token());
        let task = tokio::spawn(async move {
            // The old one stops first (it owns the package's processes and log); its history
            // goes on in the new one.
            if let Some(old) = previous {
                let _ = old.ext.inner.cmds.send(Cmd::Stop);
                let _ = old.task.await;
                let old = old.ext.brief();
                actor_ext.update(|s| s.carry_history(&old));
            }
            actor(actor_ext, spec, handler, cmd_rx, shutdown).await
        });
        running.insert(
            ext.name().to_owned(),
            Running {
                ext: ext.clone(),
                task,
            },
        );
        drop(running);
        ext
    }

    /// Stop an extension gracefully and forget it (its history is kept). Does nothing if it is
    /// not supervised.
    pub async fn stop(&self, name: &str) {
        let running = self.lock().remove(name);
        if let Some(r) = running {
            let _ = r.ext.inner.cmds.send(Cmd::Stop);
            let _ = r.task.await;
            self.retire(&r.ext);
        }
    }

    pub fn get(&self, name: &str) -> Option<Extension> {
        self.lock().get(name).map(|r| r.ext.clone())
    }

    /// Every supervised extension, by name.
    pub fn list(&self) -> Vec<Extension> {
        let mut v: Vec<Extension> = self.lock().values().map(|r| r.ext.clone()).collect();
        v.sort_by(|a, b| a.name().cmp(b.name()));
        v
    }

    /// Stop every extension gracefully, all at once, and wait for them; then kill whatever
    /// adopted orphan is left.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let all: Vec<Running> = self.lock().drain().map(|(_, r)| r).collect();
        for r in all {
            let _ = r.task.await;
            self.retire(&r.ext);
        }
        let reaper = self.reaper.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = reaper {
            let _ = task.await;
            // Nothing runs now: every child that is not a leader goes, until none is left.
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                let (reaped, killed) = process::reap_orphans(|_| false);
                if (reaped == 0 && killed == 0) || Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// One run of the child: what the actor owns while it is alive.
struct Run {
    child: Child,
    pid: u32,
    /// Taken by the graceful stop, which closes it.
    session: Option<Session>,
    stderr: JoinHandle<()>,
    ledger: Option<Ledger>,
}

enum Outcome {
    /// Died or failed to start; restart after a delay.
    Failed {
        ready_at: Option<Instant>,
        error: Option<String>,
    },
    /// Refused the handshake's versions; wait for an operator.
    Incompatible(String),
    /// An operator asked for a restart; start again at once.
    Restart,
    /// Stop for good.
    Stop,
}

/// The preflights that may run at once: one per CPU.
fn preflight_permits() -> &'static tokio::sync::Semaphore {
    static PERMITS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    PERMITS.get_or_init(|| {
        tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get()))
    })
}

async fn actor(
    ext: Extension,
    spec: ExtensionSpec,
    handler: Arc<dyn Handler>,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    shutdown: CancellationToken,
) {
    let mut tracker = RestartTracker::default();
    let mut jitter = Jitter::default();
    let log = LogFile::new(&spec.log_path);
    let mut runs = 0u32;
    loop {
        // The preflight may hash a whole package: off the runtime's workers, and at most one
        // per CPU at once, so a thousand extensions starting together take a few blocking
        // threads rather than one each (and none waits behind a thousand hashes for a CPU).
        let preflight = match spec.preflight.clone() {
            Some(check) => {
                let _permit = preflight_permits().acquire().await;
                Some(
                    tokio::task::spawn_blocking(move || check())
                        .await
                        .unwrap_or_else(|e| Err(format!("the preflight check panicked: {e}"))),
                )
            }
            None => None,
        };
        if let Some(Err(e)) = preflight {
            tracing::error!(extension = %spec.name, error = %e, "refusing to start");
            ext.update(|s| {
                s.state = State::Refused;
                s.last_error = Some(e);
                s.pid = None;
                s.spawn_to_ready_ms = None;
                s.handshake_ms = None;
            });
            match wait_for_operator(&mut cmds, &shutdown).await {
                Cmd::Restart => continue,
                Cmd::Stop => break,
            }
        }
        // Every start after the first is a restart, whatever asked for it.
        if runs > 0 {
            ext.update(|s| s.restarts += 1);
        }
        runs += 1;
        let outcome = run_once(&ext, &spec, &handler, &log, &mut cmds, &shutdown).await;
        ext.inner.peer.send_replace(None);
        match outcome {
            Outcome::Stop => break,
            Outcome::Restart => {
                spec.policy.reset(&mut tracker);
                continue;
            }
            Outcome::Incompatible(msg) => {
                ext.update(|s| {
                    s.state = State::Incompatible;
                    s.last_error = Some(msg);
                    s.pid = None;
                    s.spawn_to_ready_ms = None;
                    s.handshake_ms = None;
                });
                match wait_for_operator(&mut cmds, &shutdown).await {
                    Cmd::Restart => continue,
                    Cmd::Stop => break,
                }
            }
            Outcome::Failed { ready_at, error } => {
                let decision = spec.policy.on_failure(
                    &mut tracker,
                    RunFacts {
                        ready_at,
                        died_at: Instant::now(),
                    },
                    jitter.unit(),
                );
                let state = if decision.crash_looping {
                    State::CrashLooping
                } else {
                    State::BackingOff
                };
                let cause = error.as_deref().unwrap_or("exited");
                let delay_ms = decision.delay.as_millis() as u64;
                tracing::warn!(extension = %spec.name, delay_ms, failures = decision.failures, %state, error = %cause, "extension failed; restarting after a delay");
                // A span from the failure to the next start (its duration is the backoff).
                let restart_span = tracing::debug_span!("extension.restart", extension = %spec.name, cause, delay_ms, failures = decision.failures, state = %state);
                ext.update(|s| {
                    s.state = state;
                    s.pid = None;
                    s.ready_since_ms = None;
                    s.spawn_to_ready_ms = None;
                    s.handshake_ms = None;
                    if error.is_some() {
                        s.last_error = error;
                    }
                    s.next_start_at_ms = Some(now_ms() + decision.delay.as_millis() as i64);
                    s.backoff_ms = Some(delay_ms);
                });
                tokio::select! {
                    () = tokio::time::sleep(decision.delay) => {}
                    cmd = cmds.recv() => match cmd {
                        Some(Cmd::Restart) => spec.policy.reset(&mut tracker),
                        Some(Cmd::Stop) | None => break,
                    },
                    () = shutdown.cancelled() => break,
                }
                ext.update(|s| {
                    s.next_start_at_ms = None;
                    s.backoff_ms = None;
                });
                drop(restart_span);
            }
        }
    }
    ext.update(|s| {
        s.state = State::Stopped;
        s.pid = None;
        s.spawn_to_ready_ms = None;
        s.handshake_ms = None;
        s.next_start_at_ms = None;
        s.backoff_ms = None;
        s.descendants.clear();
    });
}

async fn wait_for_operator(
    cmds: &mut mpsc::UnboundedReceiver<Cmd>,
    shutdown: &CancellationToken,
) -> Cmd {
    tokio::select! {
        cmd = cmds.recv() => cmd.unwrap_or(Cmd::Stop),
        () = shutdown.cancelled() => Cmd::Stop,
    }
}

/// Read the child's tree and record what is new (in memory, the ledger and the status).
/// Reads and records the run's tree; `true` if it has descendants or the record changed.
fn track(ext: &Extension, run: &Run) -> bool {
    let seen = tree::tree(run.pid);
    let changed = {
        let mut rec = ext.inner.recorded.lock().unwrap_or_else(|p| p.into_inner());
        let before = rec.len();
        // Forget what no longer exists at all, so the record stays the size of the tree (what
        // was just seen exists: no second read of its stat).
        rec.retain(|id| {
            seen.iter().any(|s| s.id == *id)
                || tree::stat(id.pid).is_some_and(|s| s.id.start == id.start)
        });
        let pruned = rec.len() != before;
        let mut added = false;
        for s in &seen {
            added |= rec.insert(s.id);
        }
        (added || pruned).then(|| rec.clone())
    };
    let was_changed = changed.is_some();
    if let Some(set) = changed
        && let Some(l) = &run.ledger
        && let Err(e) = l.write(&set)
    {
        tracing::warn!(extension = %ext.name(), path = %l.path().display(), error = %e, "cannot record the extension's processes");
    }
    let mut desc: Vec<u32> = seen
        .iter()
        .map(|s| s.id.pid)
        .filter(|p| *p != run.pid)
        .collect();
    desc.sort_unstable();
    let differs = ext
        .inner
        .core
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .status
        .descendants
        != desc;
    let busy = was_changed || !desc.is_empty();
    if differs {
        ext.update(|s| s.descendants = desc);
    }
    busy
}

async fn run_once(
    ext: &Extension,
    spec: &ExtensionSpec,
    handler: &Arc<dyn Handler>,
    log: &LogFile,
    cmds: &mut mpsc::UnboundedReceiver<Cmd>,
    shutdown: &CancellationToken,
) -> Outcome {
    ext.update(|s| {
        s.state = State::Starting;
        s.pid = None;
        s.descendants.clear();
        s.spawn_to_ready_ms = None;
        s.handshake_ms = None;
    });
    let spawned = Instant::now();
    let mut child = match process::spawn_confined(&spec.command, &spec.confine) {
        Ok((c, applied)) => {
            if let Some(limits) = spec.confine.limits {
                let mechanism = mechanism(&spec.confine);
                let notes = spec.limit_notes.clone();
                let sources = spec.limit_sources.clone();
                ext.update(|s| {
                    let stops = s.resources.as_ref().map_or(0, |r| r.limit_stops);
                    s.resources = Some(Resources {
                        limits,
                        sources,
                        mechanism,
                        sandbox: applied.sandbox,
                        usage: None,
                        limit_stops: stops,
                        notes,
                    });
                });
            }
            c
        }
        Err(e) => {
            let error = format!("cannot start `{}`: {e}", spec.command.program.display());
            return Outcome::Failed {
                ready_at: None,
                error: Some(error),
            };
        }
    };
    let pid = child.id().unwrap_or(0);
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let (Some(stdin), Some(stdout), Some(stderr)) = (stdin, stdout, stderr) else {
        unreachable!("all three are piped in process::spawn");
    };
    let tail = Tail::default();
    *ext.inner.tail.lock().unwrap_or_else(|p| p.into_inner()) = tail.clone();
    let stderr_log = LogFile::new(log.path());
    let marker = crate::log::run_marker(now_ms(), pid, &spec.version);
    let stderr =
        tokio::spawn(async move { stderr_log.capture_run(stderr, tail, Some(marker)).await });
    let session = Session::new(
        stdout,
        stdin,
        SharedHandler(handler.clone()),
        SessionConfig {
            counters: ext.inner.traffic.clone(),
            ..SessionConfig::named(&spec.name)
        },
    );
    let mut run = Run {
        child,
        pid,
        session: Some(session),
        stderr,
        ledger: spec.ledger.as_ref().map(Ledger::new),
    };
    ext.inner
        .recorded
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
    track(ext, &run);
    ext.update(|s| s.pid = Some(pid));

    // The handshake, bounded by the start timeout; the child dying meanwhile ends it early.
    // The limits hold from the start: a package that allocates before it answers is stopped
    // there too.
    let peer = session_peer(&run);
    let init = InitializeParams::current(&spec.host_version);
    let asked = Instant::now();
    let mut enforcer = spec.confine.limits.map(Enforcer::new);
    let handshake = {
        let call = tokio::time::timeout(
            spec.start_timeout,
            peer.call::<_, InitializeResult>(methods::host::INITIALIZE, &init, None),
        );
        tokio::pin!(call);
        loop {
            tokio::select! {
                r = &mut call => break r,
                status = run.child.wait() => {
                    let exit = status.ok().map(|st| ExitInfo::from_status(st, now_ms()));
                    return finish_failed(ext, run, exit, None, "exited during the handshake".into()).await;
                }
                () = shutdown.cancelled() => { stop_run(ext, run, spec.stop_grace, "the daemon stopping").await; return Outcome::Stop; }
                // A stop or restart asked for during the handshake is not kept waiting for it.
                cmd = cmds.recv() => {
                    let (outcome, why) = match cmd { Some(Cmd::Restart) => (Outcome::Restart, "a restart request"), Some(Cmd::Stop) | None => (Outcome::Stop, "a stop request") };
                    stop_run(ext, run, spec.stop_grace, why).await;
                    return outcome;
                }
                () = tokio::time::sleep_until(sample_due(&enforcer)), if enforcer.is_some() => {
                    let e = enforcer.as_mut().expect("sampled only with an enforcer");
                    if let Some(why) = e.sample(ext, run.pid) {
                        return over_limit(ext, run, None, why).await;
                    }
                }
            }
        }
    };
    let result = match handshake {
        Err(_) => {
            let msg = format!("no answer to `initialize` within {:?}", spec.start_timeout);
            return host_killed(ext, run, None, msg).await;
        }
        Ok(Err(e)) if e.is(ErrorCode::VersionMismatch) => {
            let data = match &e {
                CallError::Rpc { error, .. } => error.data.as_ref().map(|d| d.get().to_owned()),
                _ => None,
            };
            let msg = format!(
                "the extension speaks none of this host's protocol versions {PROTOCOL_VERSIONS:?}: {} (data: {})",
                e,
                data.as_deref().unwrap_or("none")
            );
            stop_run(ext, run, spec.stop_grace, "an incompatible handshake").await;
            return Outcome::Incompatible(msg);
        }
        Ok(Err(e)) if e.is(ErrorCode::ExtensionExited) => {
            // It closed stdout (or exited) during the handshake: which, the exit tells.
            let exit = tokio::time::timeout(Duration::from_millis(200), run.child.wait())
                .await
                .ok()
                .and_then(Result::ok)
                .map(|st| ExitInfo::from_status(st, now_ms()));
            return match exit {
                Some(exit) => {
                    finish_failed(ext, run, Some(exit), None, format!("handshake failed: {e}"))
                        .await
                }
                None => closed_stdout(ext, run, None).await,
            };
        }
        Ok(Err(e)) => {
            let msg = format!("handshake failed: {e}");
            return host_killed(ext, run, None, msg).await;
        }
        Ok(Ok(r)) => r,
    };
    if !PROTOCOL_VERSIONS.contains(&result.protocol_version) {
        let msg = format!(
            "the extension chose protocol version {}, which this host does not speak (it speaks {PROTOCOL_VERSIONS:?})",
            result.protocol_version
        );
        stop_run(ext, run, spec.stop_grace, "an incompatible handshake").await;
        return Outcome::Incompatible(msg);
    }

    let ready_at = Instant::now();
    tracing::info!(extension = %spec.name, pid, version = %result.extension.version, "extension ready");
    // The peer first: whoever sees `ready` can call at once.
    ext.inner.peer.send_replace(Some(peer));
    ext.update(|s| {
        s.state = State::Ready;
        s.ready_since_ms = Some(now_ms());
        s.spawn_to_ready_ms = Some(ready_at.duration_since(spawned).as_millis() as u64);
        s.handshake_ms = Some(ready_at.duration_since(asked).as_millis() as u64);
        s.protocol_version = Some(result.protocol_version);
        s.capabilities = Some(result.capabilities.clone());
        s.last_error = None;
    });

    // Crash detection: stdout EOF or child exit, whichever comes first; meanwhile the tree is
    // read and recorded every TRACK_INTERVAL.
    let watch = session_peer(&run);
    // Every TRACK_INTERVAL while the tree has descendants or just changed; a tree that is only
    // the extension itself is read ever less often, down to every TRACK_INTERVAL_QUIET, so a
    // thousand idle extensions cost the daemon a fraction of a CPU percent rather than ten.
    let mut every = TRACK_INTERVAL;
    let mut next_track = tokio::time::Instant::now() + every;
    // In a cgroup the kernel enforces memory.max itself: its OOM kills are counted there.
    let ooms = spec
        .confine
        .cgroup
        .as_deref()
        .map(|d| cgroup::read_use(d).oom_kills);
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(sample_due(&enforcer)), if enforcer.is_some() => {
                let e = enforcer.as_mut().expect("sampled only with an enforcer");
                if let Some(why) = e.sample(ext, run.pid) {
                    return over_limit(ext, run, Some(ready_at), why).await;
                }
            }
            status = run.child.wait() => {
                let exit = status.ok().map(|st| ExitInfo::from_status(st, now_ms()));
                if let (Some(before), Some(dir), Some(l)) = (ooms, spec.confine.cgroup.as_deref(), spec.confine.limits)
                    && cgroup::read_use(dir).oom_kills > before
                {
                    let why = format!("over its {} memory limit (killed by the kernel at the cgroup's memory.max)", limits::format_bytes(l.memory));
                    return over_limit(ext, run, Some(ready_at), why).await;
                }
                return finish_failed(ext, run, exit, Some(ready_at), String::new()).await;
            }
            _ = watch.closed() => {
                // It closed stdout (or the pipe broke) but may still be alive: end it. If it
                // had exited, its status is there to collect at once.
                let exit = tokio::time::timeout(Duration::from_millis(50), run.child.wait())
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|st| ExitInfo::from_status(st, now_ms()));
                return match exit {
                    Some(exit) => finish_failed(ext, run, Some(exit), Some(ready_at), String::new()).await,
                    None => closed_stdout(ext, run, Some(ready_at)).await,
                };
            }
            cmd = cmds.recv() => {
                ext.inner.peer.send_replace(None);
                let (outcome, why) = match cmd { Some(Cmd::Restart) => (Outcome::Restart, "a restart request"), Some(Cmd::Stop) | None => (Outcome::Stop, "a stop request") };
                stop_run(ext, run, spec.stop_grace, why).await;
                return outcome;
            }
            () = shutdown.cancelled() => {
                ext.inner.peer.send_replace(None);
                stop_run(ext, run, spec.stop_grace, "the daemon stopping").await;
                return Outcome::Stop;
            }
            () = tokio::time::sleep_until(next_track) => {
                every = if track(ext, &run) { TRACK_INTERVAL } else { (every * 2).min(TRACK_INTERVAL_QUIET) };
                next_track = tokio::time::Instant::now() + every;
            }
        }
    }
}

/// When the enforcer (if any) wants its next sample.
fn sample_due(enforcer: &Option<Enforcer>) -> tokio::time::Instant {
    enforcer.as_ref().map_or_else(
        || tokio::time::Instant::now() + Duration::from_secs(3600),
        Enforcer::due,
    )
}

fn session_peer(run: &Run) -> Peer {
    run.session
        .as_ref()
        .expect("the session is taken only by the stop, which ends the run")
        .peer()
}

/// The child closed its stdout while still running: the host kills it, and says so.
async fn closed_stdout(ext: &Extension, run: Run, ready_at: Option<Instant>) -> Outcome {
    let exit = kill_and_record(ext, run, ExitCause::ClosedStdout, None, |_| {}).await;
    let error = format!(
        "the extension closed its stdout while still running; the host stopped it ({})",
        exit.map_or("its status was not collected".to_owned(), |e| e.to_string())
    );
    Outcome::Failed {
        ready_at,
        error: Some(error),
    }
}

/// The host ends a run: no further calls reach it, its tree is recorded, it is killed, and its
/// exit is recorded with `cause` and `why` (and `also`, in the same status update); returns how
/// it exited, when that was collected.
pub(crate) async fn kill_and_record(
    ext: &Extension,
    mut run: Run,
    cause: ExitCause,
    why: Option<String>,
    also: impl FnOnce(&mut Status),
) -> Option<ExitInfo> {
    ext.inner.peer.send_replace(None);
    let in_flight = ext.in_flight();
    track(ext, &run);
    let exit = kill_run(&mut run).await;
    let rec = ExitRecord::new(run.pid, cause, why, exit, in_flight);
    ext.update(|s| {
        s.record_exit(rec);
        also(s);
    });
    end_run(ext, run).await;
    exit
}

/// The host gave up on the child (no handshake in time, a failed handshake): kill it, record
/// why.
async fn host_killed(ext: &Extension, run: Run, ready_at: Option<Instant>, why: String) -> Outcome {
    let exit = kill_and_record(
        ext,
        run,
        ExitCause::StoppedByHost,
        Some(why.clone()),
        |_| {},
    )
    .await;
    let error = match exit {
        Some(e) => format!("{why}; the host stopped it ({e})"),
        None => why,
    };
    Outcome::Failed {
        ready_at,
        error: Some(error),
    }
}

/// Record a run that ended on its own. Dropping the session fails every pending call at once.
async fn finish_failed(
    ext: &Extension,
    mut run: Run,
    exit: Option<ExitInfo>,
    ready_at: Option<Instant>,
    error: String,
) -> Outcome {
    ext.inner.peer.send_replace(None);
    let in_flight = ext.in_flight();
    let exit = match exit {
        Some(e) => Some(e),
        None => kill_run(&mut run).await,
    };
    let cause = match exit {
        Some(ExitInfo {
            signal: Some(_), ..
        }) => ExitCause::Signalled,
        _ => ExitCause::Exited,
    };
    let mut rec = ExitRecord::new(run.pid, cause, None, exit, in_flight);
    if !error.is_empty() {
        rec.summary = format!("{error} ({})", rec.summary);
    }
    ext.update(|s| s.record_exit(rec));
    end_run(ext, run).await;
    let error = match (error.is_empty(), exit) {
        (true, Some(e)) => Some(format!("the extension died ({e})")),
        (true, None) => None,
        (false, Some(e)) => Some(format!("{error} ({e})")),
        (false, None) => Some(error),
    };
    Outcome::Failed { ready_at, error }
}

/// After the child is gone (or given up on): fail pending calls, kill every process recorded in
/// its tree wherever it moved, finish the stderr copy, forget the ledger.
async fn end_run(ext: &Extension, mut run: Run) {
    drop(run.session.take());
    // Every call of this run has failed now; what its exit record listed is done with.
    ext.inner
        .in_flight
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
    let recorded = ext
        .inner
        .recorded
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let killed = tree::kill_all(&recorded, Some(run.pid), Duration::from_secs(1)).await;
    if killed > 0 {
        tracing::info!(extension = %ext.name(), killed, "killed the processes the extension left");
    }
    finish_stderr(run.stderr).await;
    if !tree::still_running(&recorded).is_empty() {
        tracing::warn!(extension = %ext.name(), "some of the extension's processes could not be killed within 1 s");
    } else if let Some(l) = &run.ledger {
        l.remove();
    }
    ext.update(|s| {
        s.descendants.clear();
        if let Some(r) = &mut s.resources {
            r.usage = None;
        }
    });
    drop(run.child);
    process::release_leader(run.pid);
}

/// SIGKILL the child's group and the child, and collect its status (bounded).
async fn kill_run(run: &mut Run) -> Option<ExitInfo> {
    let _ = process::signal_group(run.pid, nix::sys::signal::Signal::SIGKILL);
    let _ = run.child.start_kill();
    tokio::time::timeout(Duration::from_secs(2), run.child.wait())
        .await
        .ok()
        .and_then(Result::ok)
        .map(|st| ExitInfo::from_status(st, now_ms()))
}

async fn finish_stderr(task: JoinHandle<()>) {
    // The copy ends when every holder of the pipe is gone; after the group is killed that is
    // at once, but never wait on it for long.
    let abort = task.abort_handle();
    if tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .is_err()
    {
        abort.abort();
    }
}

/// The graceful stop: `shutdown` request → close stdin → SIGTERM to the group → SIGKILL, each
/// step bounded; then every process recorded in its tree is killed, wherever it moved.
async fn stop_run(ext: &Extension, mut run: Run, grace: Duration, why: &str) {
    use nix::sys::signal::Signal;
    // A tree stopped for its CPU share could not answer `shutdown` or see SIGTERM.
    signal_tree(run.pid, Signal::SIGCONT);
    ext.update(|s| s.state = State::Stopping);
    // What runs now is recorded before the child can exit and orphan it.
    track(ext, &run);
    let in_flight = ext.in_flight();
    let deadline = Instant::now() + grace;
    let peer = session_peer(&run);
    if !peer.is_closed() {
        let _ = peer
            .call::<_, Empty>(methods::host::SHUTDOWN, &Empty {}, Some(grace))
            .await;
    }
    track(ext, &run);
    if let Some(session) = run.session.take() {
        session.close(Duration::from_millis(100)).await;
    }
    let left = deadline.saturating_duration_since(Instant::now());
    let mut status = tokio::time::timeout(left, run.child.wait())
        .await
        .ok()
        .and_then(Result::ok);
    if status.is_none() {
        tracing::warn!(extension = %ext.name(), "did not exit after shutdown; sending SIGTERM");
        track(ext, &run);
        let _ = process::signal_group(run.pid, Signal::SIGTERM);
        status = tokio::time::timeout(Duration::from_secs(2), run.child.wait())
            .await
            .ok()
            .and_then(Result::ok);
    }
    if status.is_none() {
        tracing::warn!(extension = %ext.name(), "did not exit after SIGTERM; sending SIGKILL");
        let _ = process::signal_group(run.pid, Signal::SIGKILL);
        status = tokio::time::timeout(Duration::from_secs(2), run.child.wait())
            .await
            .ok()
            .and_then(Result::ok);
    }
    let exit = status.map(|st| ExitInfo::from_status(st, now_ms()));
    let rec = ExitRecord::new(
        run.pid,
        ExitCause::StoppedByHost,
        Some(why.to_owned()),
        exit,
        in_flight,
    );
    ext.update(|s| s.record_exit(rec));
    end_run(ext, run).await;
}
