//! The handle on one supervised extension ([`Extension`]): its status, the calls to it (the
//! typed [`Extension::call`] through the method table, and [`Extension::call_raw`], both by
//! the one path `Extension::request`), their statistics, and the commands the actor takes
//! (restart, stop).
//!
//! A call fails at once when the extension is not ready ([`ExtCallError::NotRunning`]); every
//! call's latency is recorded per method.
//!
//! What the handle holds is private to this file: the actor, a run's end and the enforcer
//! change it through the handle's crate-private methods, so every one of its locks is taken and
//! released here, and none is held across an await.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conduit_protocol::{Capabilities, ErrorCode, Method, RequestParams, Typed};
use conduit_rpc::{CallError, CallOptions, Peer, SessionCounters};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, watch};

use crate::log::Tail;
use crate::stats::{self, LatencyHistogram, Traffic};
use crate::status::{InFlightCall, State, Status, StopRequest};
use crate::tree::{self, ProcId, ProcStat};
use crate::usage::Usage;

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

/// What the actor is asked to do, by the handle and the registry.
pub(crate) enum Cmd {
    /// End the current run as the request says, then start again at once.
    Restart(StopRequest),
    Stop,
}

struct Inner {
    name: String,
    /// What [`Extension::brief`] copies out; changed only through [`Extension::update`] (which
    /// tells the state's waiters), except the use, which changes every sample.
    status: Mutex<Status>,
    /// Every process seen in the current child's tree (see [`crate::tree`]).
    recorded: Mutex<BTreeSet<ProcId>>,
    /// Calls awaiting an answer: id → (method, since when).
    in_flight: Mutex<HashMap<u64, (Box<str>, Instant)>>,
    next_call: std::sync::atomic::AtomicU64,
    peer: watch::Sender<Option<Peer>>,
    stats: stats::Stats,
    /// The last calls, when journaled (development installs).
    journal: crate::journal::Journal,
    /// Every session's bytes and refusals, across the extension's restarts.
    traffic: Arc<SessionCounters>,
    /// Host calls that failed with `overloaded` (not sent, or refused by the extension).
    overloaded_calls: std::sync::atomic::AtomicU64,
    tail: Mutex<Tail>,
    cmds: mpsc::UnboundedSender<Cmd>,
    /// Sends every state change, for waiters (tests, the CLI's "wait until ready").
    changes: watch::Sender<State>,
}

/// What [`Extension::run_brief`] reads: the current run's state, pid, restarts and whether its
/// handshake was accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunBrief {
    pub state: State,
    pub pid: Option<u32>,
    pub restarts: u32,
    pub handshaken: bool,
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

impl Extension {
    /// A handle on a new extension named `name`, shown as `status`, whose actor takes `cmds`.
    pub(crate) fn new(name: String, status: Status, cmds: mpsc::UnboundedSender<Cmd>) -> Self {
        let state = status.state;
        Extension {
            inner: Arc::new(Inner {
                name,
                status: Mutex::new(status),
                recorded: Mutex::new(BTreeSet::new()),
                in_flight: Mutex::new(HashMap::new()),
                next_call: std::sync::atomic::AtomicU64::new(0),
                peer: watch::Sender::new(None),
                stats: stats::Stats::default(),
                journal: crate::journal::Journal::default(),
                traffic: Arc::default(),
                overloaded_calls: std::sync::atomic::AtomicU64::new(0),
                tail: Mutex::new(Tail::default()),
                cmds,
                changes: watch::Sender::new(state),
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Its last calls, if journaled ([`ExtensionSpec::development`](crate::ExtensionSpec)).
    pub fn journal(&self) -> &crate::journal::Journal {
        &self.inner.journal
    }

    /// The status without its call statistics and stderr tail: cheap enough for a caller that
    /// asks on every pass (the host loop), where [`Extension::status`] computes percentiles.
    pub fn brief(&self) -> Status {
        self.inner
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The facts of the current run that a caller asking on every pass needs (the host loop),
    /// read without copying the status.
    pub fn run_brief(&self) -> RunBrief {
        let s = self.inner.status.lock().unwrap_or_else(|p| p.into_inner());
        RunBrief {
            state: s.state,
            pid: s.pid,
            restarts: s.restarts,
            handshaken: s.protocol_version.is_some(),
        }
    }

    /// The capabilities of the last accepted handshake (kept while it restarts), shared.
    pub fn capabilities(&self) -> Option<Arc<Capabilities>> {
        self.inner
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .capabilities
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

    /// What an overview shows of it: a few fields of the status, the newest exit, the calls in
    /// flight and the call figures across methods (percentiles computed again only after new
    /// calls). Cheaper than [`Extension::status`] by the stderr tail, the per-method table and
    /// the copy of the rest.
    pub fn glance(&self) -> crate::status::Glance {
        let mut g =
            crate::status::Glance::of(&self.inner.status.lock().unwrap_or_else(|p| p.into_inner()));
        g.in_flight = self
            .inner
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len() as u32;
        g.calls = self.inner.stats.summary(Instant::now());
        g
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

    /// Call the protocol method `M` with typed params and result (the method table ties the
    /// name to its types): [`Extension::request`] with the params serialized straight into the
    /// request's frame. An answer that does not read as `M`'s result is counted against the
    /// method.
    pub async fn call<M: Method>(
        &self,
        params: &M::Params,
        deadline: Option<Duration>,
    ) -> Result<M::Result, ExtCallError> {
        let raw = self.request(M::NAME, &Typed(params), deadline).await?;
        serde_json::from_str(raw.get()).map_err(|e| {
            self.record_bad_answer(M::NAME);
            ExtCallError::Call {
                ext: self.inner.name.clone(),
                source: CallError::BadResult {
                    method: M::NAME.into(),
                    detail: e.to_string(),
                },
            }
        })
    }

    /// Call `method` with raw params (a custom method, a probe repeating a call): the answer
    /// as raw JSON.
    pub async fn call_raw(
        &self,
        method: &str,
        params: &RawValue,
        deadline: Option<Duration>,
    ) -> Result<Box<RawValue>, ExtCallError> {
        self.request(method, params, deadline).await
    }

    /// The host's one call path to an extension: fails at once if it is not ready; otherwise
    /// `Peer::request` with the deadline carried in the params as `_meta.remaining_ms`
    /// (docs/protocol.md §11; `initialize` is not sent from here), in one span, counted in
    /// flight, its latency recorded per method.
    async fn request<P: RequestParams + ?Sized>(
        &self,
        method: &str,
        params: &P,
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
            in_transaction = conduit_protocol::methods::in_transaction(method),
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
        let opts = CallOptions::within(deadline).carrying_deadline();
        let call = peer.request(method, params, opts);
        let res = tracing::Instrument::instrument(call, span.clone()).await;
        let took = t.elapsed();
        if matches!(res, Err(CallError::Closed { .. })) {
            // It failed because the child ended: left for the actor, which lists it in the
            // exit's record and then clears the table.
            std::mem::forget(done);
        }
        self.inner.stats.record(method, took, res.is_ok());
        self.inner.journal.record(method, took, res.as_ref().err());
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
    /// `incompatible` or `refused`); `req` says who asks and why, as the exit's record will.
    /// An operator's restart resets the failure count and the failing streak; the host's
    /// (unresponsive) keeps them.
    pub fn restart(&self, req: StopRequest) {
        let _ = self.inner.cmds.send(Cmd::Restart(req));
    }

    /// The calls awaiting an answer now, oldest first.
    pub(crate) fn in_flight(&self) -> Vec<InFlightCall> {
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
    pub(crate) fn owns(&self, id: ProcId) -> bool {
        self.inner
            .recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&id)
    }

    /// Change the status, then tell the state's waiters.
    pub(crate) fn update(&self, f: impl FnOnce(&mut Status)) {
        let state = {
            let mut status = self.inner.status.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut status);
            status.state
        };
        self.inner.changes.send_replace(state);
    }

    /// Write the tree's current use into the status without waking the state's waiters: the
    /// use changes every sample, the state does not.
    pub(crate) fn show_usage(&self, usage: Usage) {
        let mut status = self.inner.status.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = &mut status.resources {
            r.usage = Some(usage);
        }
    }

    /// Show `desc` as the child's descendants; the state's waiters are told only when that
    /// changes the status.
    pub(crate) fn show_descendants(&self, desc: Vec<u32>) {
        let differs = self
            .inner
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .descendants
            != desc;
        if differs {
            self.update(|s| s.descendants = desc);
        }
    }

    /// Let calls through to `peer` (the run is ready), or stop them (`None`: the run ends).
    pub(crate) fn set_peer(&self, peer: Option<Peer>) {
        self.inner.peer.send_replace(peer);
    }

    /// Ask the actor to stop the extension for good.
    pub(crate) fn ask_to_stop(&self) {
        let _ = self.inner.cmds.send(Cmd::Stop);
    }

    /// A fresh stderr tail for a new run, shown in the status from now on.
    pub(crate) fn new_tail(&self) -> Tail {
        let tail = Tail::default();
        *self.inner.tail.lock().unwrap_or_else(|p| p.into_inner()) = tail.clone();
        tail
    }

    /// The byte and refusal counters every session of this extension adds to.
    pub(crate) fn session_counters(&self) -> Arc<SessionCounters> {
        self.inner.traffic.clone()
    }

    /// Add the processes just `seen` in the child's tree to the record, and forget recorded
    /// ones that no longer exist at all, so the record stays the size of the tree. Returns the
    /// record when it changed.
    pub(crate) fn record_tree(&self, seen: &[ProcStat]) -> Option<BTreeSet<ProcId>> {
        let mut rec = self
            .inner
            .recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let before = rec.len();
        // What was just seen exists: no second read of its stat.
        rec.retain(|id| {
            seen.iter().any(|s| s.id == *id)
                || tree::stat(id.pid).is_some_and(|s| s.id.start == id.start)
        });
        let pruned = rec.len() != before;
        let mut added = false;
        for s in seen {
            added |= rec.insert(s.id);
        }
        (added || pruned).then(|| rec.clone())
    }

    /// Every process recorded of the current (or last) child.
    pub(crate) fn recorded(&self) -> BTreeSet<ProcId> {
        self.inner
            .recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Forget the processes recorded of the last child, before a new one starts.
    pub(crate) fn forget_recorded(&self) {
        self.inner
            .recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Forget the calls in flight: the run they went to has ended, and every one has failed.
    pub(crate) fn forget_in_flight(&self) {
        self.inner
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}
