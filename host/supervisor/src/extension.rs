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

use crate::call::{ExtCallError, InFlight};
use crate::life::{Cmd, Life};
use crate::log::Tail;
use crate::stats::{self, LatencyHistogram, Traffic};
use crate::status::{InFlightCall, RunBrief, State, Status, StopRequest};
use crate::tree::{self, ProcId, ProcStat};
use crate::usage::Usage;

struct Inner {
    name: String,
    /// What [`Extension::brief`] copies out; changed only through [`Extension::update`] (which
    /// tells the state's waiters), except the use, which changes every sample.
    status: Mutex<Status>,
    /// Every process seen in the current child's tree (see [`crate::tree`]).
    recorded: Mutex<BTreeSet<ProcId>>,
    /// Calls awaiting an answer, by id. Taken before the peer is read, so that a run closed
    /// for idleness (`close_if_idle`) never has a call begin on it unseen.
    in_flight: Mutex<HashMap<u64, InFlight>>,
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
    /// On demand, idle stops, replacement (see `life.rs`).
    life: Life,
    /// The version that replaced this one: every call made through this handle goes there.
    successor: Mutex<Option<Extension>>,
}

/// Keeps a ready run from being stopped for idleness while it lives
/// ([`Extension::keep_awake`]).
#[derive(Debug)]
pub struct Awake(Extension);

impl Drop for Awake {
    fn drop(&mut self) {
        self.0.inner.life.unwake();
    }
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
                life: Life::default(),
                successor: Mutex::new(None),
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

    /// Whether `other` is a handle on this very run of the registry (not another version of
    /// the same package).
    pub fn is(&self, other: &Extension) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
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
            first_run: s.first_run,
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

    /// The host's one call path to an extension: to its successor once a newer version has
    /// replaced it; fails at once if it is not ready; otherwise
    /// `Peer::request` with the deadline carried in the params as `_meta.remaining_ms`
    /// (docs/protocol.md §11; `initialize` is not sent from here), in one span, counted in
    /// flight, its latency recorded per method.
    async fn request<P: RequestParams + ?Sized>(
        &self,
        method: &str,
        params: &P,
        deadline: Option<Duration>,
    ) -> Result<Box<RawValue>, ExtCallError> {
        // Once a newer version has replaced this one, the call goes to it.
        if let Some(next) = self.successor() {
            return Box::pin(next.request(method, params, deadline)).await;
        }
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
        // The peer is read under the in-flight lock: a run being closed for idleness either
        // sees this call (and stays) or has already taken its peer away (and this call fails
        // as not running).
        let peer = {
            let mut in_flight = self
                .inner
                .in_flight
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let Some(peer) = self.peer() else {
                drop(in_flight);
                return Err(ExtCallError::NotRunning {
                    ext: self.inner.name.clone(),
                    state: self.state(),
                });
            };
            in_flight.insert(
                id,
                InFlight {
                    method: method.into(),
                    since: t,
                    until: deadline.map(|d| t + d),
                },
            );
            peer
        };
        self.touch();
        // Removed however the call ends, dropped by its caller included; its end counts as a
        // call for the idle decision.
        struct Touch<'a>(&'a Extension);
        impl Drop for Touch<'_> {
            fn drop(&mut self) {
                self.0.touch();
            }
        }
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
        let _touch = Touch(self);
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
        let mut v: Vec<(Instant, &str)> = map.values().map(|c| (c.since, &*c.method)).collect();
        v.sort();
        v.into_iter()
            .map(|(t, m)| InFlightCall {
                method: m.to_owned(),
                age_ms: t.elapsed().as_millis() as u64,
            })
            .collect()
    }

    /// Something needs this extension (`why` is shown as its start reason: `started by event
    /// 1234 of kind note.posted`): an idle one is started; one that runs or is starting is left
    /// as it is. Cheap to call every pass: one demand is sent per idle period.
    pub fn demand(&self, why: impl FnOnce() -> String) {
        if self.state() == State::Idle && self.inner.life.send_demand() {
            let _ = self.inner.cmds.send(Cmd::Demand(why()));
        }
    }

    /// Whether calls to it now wait for a need to start it rather than fail: it is idle (never
    /// started, or stopped for idleness), or its run is being stopped for idleness.
    pub fn awaits_demand(&self) -> bool {
        self.state() == State::Idle || self.inner.life.idling()
    }

    /// Start it if it is idle (`why` becomes its start reason) and wait until it is ready, at
    /// most `timeout`. Fails with [`ExtCallError::NotRunning`] when it does not get there: a
    /// start that failed, a stop, or the time running out.
    pub async fn ensure_ready(
        &self,
        why: impl FnOnce() -> String,
        timeout: Duration,
    ) -> Result<(), ExtCallError> {
        if let Some(next) = self.successor() {
            return Box::pin(next.ensure_ready(why, timeout)).await;
        }
        if self.peer().is_some() {
            return Ok(());
        }
        self.demand(why);
        let life = &self.inner.life;
        let settled = |s: State| match s {
            State::Starting => false,
            State::Idle => !life.demanded() && !life.idling(),
            _ => true,
        };
        match self.wait_for(timeout, settled).await {
            Ok(State::Ready) if self.peer().is_some() => Ok(()),
            Ok(state) | Err(state) => Err(ExtCallError::NotRunning {
                ext: self.inner.name.clone(),
                state,
            }),
        }
    }

    /// A call to it or a callback from it began or ended now.
    pub(crate) fn touch(&self) {
        self.inner.life.touch();
    }

    /// Close the run to new calls if it is still idle at `now` (no call in flight, none for
    /// `after`, nothing else open): `Ok` once closed (calls from now on find it not running and
    /// wait for a need), else when to look again. Decided and applied under the in-flight lock
    /// that `call_raw` takes before it reads the peer, so no call slips in between.
    pub(crate) fn close_if_idle(
        &self,
        after: Duration,
        streams_open: usize,
        now: Instant,
    ) -> Result<(), Instant> {
        let in_flight = self.lock_in_flight();
        let activity = crate::lifecycle::Activity {
            calls_in_flight: in_flight.len(),
            callbacks_in_flight: self.peer().map_or(0, |p| p.incoming_in_flight()),
            streams_open,
            kept_awake: self.inner.life.kept_awake(),
            last_call: self.inner.life.last_call(),
        };
        crate::lifecycle::idle_decision(after, &activity, now)?;
        self.inner.life.set_idling(true);
        self.set_peer(None);
        drop(in_flight);
        Ok(())
    }

    /// Keep a ready run from being stopped for idleness while the guard lives, without counting
    /// as a call (a host-loop pass that may call it): `None` when it is not ready (it does not
    /// run, or its idle stop has begun). Taken under the in-flight lock, as a call is.
    pub fn keep_awake(&self) -> Option<Awake> {
        let _in_flight = self.lock_in_flight();
        self.peer()?;
        self.inner.life.wake();
        Some(Awake(self.clone()))
    }

    fn lock_in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<u64, InFlight>> {
        self.inner
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Show it idle, waiting for a need (after an idle stop, or before its first start).
    pub(crate) fn enter_idle(&self) {
        self.update(|s| {
            s.state = State::Idle;
            s.pid = None;
            s.spawn_to_ready_ms = None;
            s.handshake_ms = None;
            s.next_start_at_ms = None;
            s.backoff_ms = None;
            s.descendants.clear();
            s.idle_since_ms.get_or_insert_with(crate::status::now_ms);
        });
        self.inner.life.set_idling(false);
        self.inner.life.clear_demand();
    }

    /// A need was taken up: it is no longer idle.
    pub(crate) fn leave_idle(&self) {
        // Starting first: a caller waiting for it (`ensure_ready`) must never see it idle with
        // its demand taken.
        self.update(|s| {
            s.state = State::Starting;
            s.idle_since_ms = None;
        });
        self.inner.life.clear_demand();
    }

    /// Mark this version as being replaced (its failed runs are not restarted), or no longer.
    pub(crate) fn set_retiring(&self, on: bool) {
        self.inner.life.set_retiring(on);
    }

    pub(crate) fn retiring(&self) -> bool {
        self.inner.life.retiring()
    }

    /// Send every call made through this handle from now on to `next`.
    pub(crate) fn set_successor(&self, next: Extension) {
        *self
            .inner
            .successor
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(next);
    }

    /// The version that replaced this one, if one has.
    pub fn successor(&self) -> Option<Extension> {
        self.inner
            .successor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How long the calls in flight may still wait, at most (a call without a deadline counts
    /// `default`): how long a replaced version is given to finish them.
    pub(crate) fn longest_wait(&self, default: Duration, now: Instant) -> Duration {
        self.inner
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|c| {
                c.until
                    .unwrap_or(c.since + default)
                    .saturating_duration_since(now)
            })
            .max()
            .unwrap_or_default()
    }

    /// Calls awaiting an answer and callbacks being served now.
    pub(crate) fn busy(&self) -> bool {
        !self
            .inner
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
            || self.peer().is_some_and(|p| p.incoming_in_flight() > 0)
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
