//! The host loop: one pass at a time, every poll interval and at once when nudged (but no sooner
//! than `decide::MIN_PASS_SPACING` after the previous pass began, so a stream of events is
//! routed in batches).
//!
//! A pass routes pending events to Work (`work_kind.trigger`), fires due timers
//! (`recurrence.next`), matches active waits against new events (`dependency.filter`) and
//! commits planned emissions (`emit.commit`). Each of those calls is made inside its own write
//! transaction with the 250 ms deadline; a failed, late or malformed answer is logged, counted
//! and replaced by the call's documented fallback (`docs/protocol.md` §6), then the transaction
//! commits — never with a corrupt record, and never holding the writer past the deadline.
//! These commits skip their own fsync (`HostLoop::write`, `Durability::Deferred`): a power cut
//! may undo the last of them, and the step is then made again; every acknowledged write's
//! fsync makes them durable too.
//!
//! Each step reads the same way: decide (pure, `decide.rs`), make the call
//! (`HostLoop::in_tx_call`, the one way all four are made, which gives an
//! `Outcome`), apply the answer or the fallback value in the transaction, and count the
//! fallback after it commits.
//!
//! Which extension serves what comes from the capabilities of each extension's last handshake:
//! an event goes to the longest declared work kind that is its kind or a prefix of it ending at
//! a dot (`note.posted` → `note.posted`, else `note`); an event whose kind names no declared
//! work kind is marked routed to no Work. Nothing is routed before the package registry has
//! been applied at start: until then no kind's owner is known.
//!
//! Extensions not running but about to (on a first start, or idle: `decide::settling`) and
//! disabled ones are *held*: their work waits, durably. An idle one is started by what needs it
//! (`Extension::demand`); no pass waits for that start: a later one takes the work up. A pass
//! keeps ready extensions from idle stops while it runs (`calls::keep_awake`).
//!
//! Isolation: an extension that misses a deadline or fails a call is degraded (`health.rs`):
//! its in-transaction calls are not made for the rest of the pass and until a probe off the
//! writer answers; what it would have been called for waits where it is (events unrouted,
//! timers due, waits active, emissions planned). So one pass spends at most one deadline on
//! each extension.
//!
//! The loop runs on its own thread: SQLite calls block, and the in-transaction call is awaited
//! with `Handle::block_on` while the write transaction is open.
//!
//! Each pass also starts an `ingress.poll` of every declared ingress source that is due
//! (`ingress.rs`). Polls are not in-transaction calls: they run as tasks on the runtime.
//!
//! A backlog (after a restart, or an owner that was away) drains in bounded steps: routing
//! reads [`ROUTE_BATCH`] events at a time through the unrouted index, each batch its own
//! transaction; timers, waits and emissions (`paged.rs`) take [`PASS_LIMIT`] each a pass, and
//! a pass that read a full page of due timers or planned emissions it could act on is followed
//! by the next one at once (`PassReport::more`, still [`MIN_PASS_SPACING`] apart), not after
//! the poll interval.

mod calls;
pub(crate) mod decide;
mod ingress;
mod paged;
pub(crate) mod poll;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use conduit_protocol::IN_TRANSACTION_DEADLINE;
use conduit_protocol::calls::{Event, TriggerParams};
use conduit_protocol::methods::{Method, WorkKindTrigger, host};
use conduit_store::Durability;
use conduit_supervisor::{Extension, now_ms};
use tokio_util::sync::CancellationToken;

pub use calls::failure_text;
pub use decide::{
    MIN_PASS_SPACING, RECURRENCE_FALLBACK_MS, event_owner, fallback_groups, nudged_pass_delay,
    trigger_verdict, work_kind_of,
};
pub use ingress::INGRESS_LIMIT;
pub use poll::INGRESS_INTERVAL;

use super::health::{self, ProbeCall, RunFacts};
use super::shared::Core;
use calls::{answered, probe_once};
use decide::{Outcome, StartFacts};

/// The live extensions of a pass and their capabilities, by name (ordered: the pass visits
/// them, and settles a work kind two of them declare, in name order).
type Exts = BTreeMap<String, (Extension, Arc<conduit_protocol::Capabilities>)>;

/// How many unrouted events one routing step reads (and one trigger call carries).
pub const ROUTE_BATCH: u32 = 200;
/// How many due timers, active waits and planned emissions one pass handles of each.
pub const PASS_LIMIT: u32 = 100;
/// How many new events one pass checks against each wait.
pub const WAIT_EVENTS: u32 = 50;

/// While the file this variable names exists, the host loop makes no pass (fault injection:
/// a stalled loop, as the watchdog must notice). Unset in normal operation.
pub const STALL_FILE_VAR: &str = "CONDUIT_FAULT_STALL_HOST_LOOP";

/// What one pass did, for tests and logs.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PassReport {
    pub routed: usize,
    pub timers_fired: usize,
    pub waits_checked: usize,
    pub waits_satisfied: usize,
    pub emissions_committed: usize,
    pub emissions_failed: usize,
    pub fallbacks: usize,
    pub errors: Vec<String>,
    /// A step read a full page and made progress with it: more may be waiting, so the next
    /// pass starts without waiting for the poll interval or a nudge.
    pub more: bool,
}

/// The loop; [`HostLoop::spawn`] runs it on its own thread.
#[derive(Debug)]
pub struct HostLoop {
    core: Arc<Core>,
    rt: tokio::runtime::Handle,
    poll: Duration,
    shutdown: CancellationToken,
    /// Extensions whose in-transaction calls this pass does not make: degraded when it began,
    /// or failed during it.
    skip: RefCell<HashSet<String>>,
    /// Installed but disabled extensions and what they declare (their work is held).
    dormant: RefCell<Arc<super::shared::Dormant>>,
    /// The id of the last active wait the previous pass matched: each pass takes the next page
    /// of active waits, back to the first after a short page, so every wait is reached.
    waits_after: std::cell::Cell<i64>,
}

impl HostLoop {
    pub fn new(
        core: Arc<Core>,
        rt: tokio::runtime::Handle,
        poll: Duration,
        shutdown: CancellationToken,
    ) -> Self {
        HostLoop {
            core,
            rt,
            poll,
            shutdown,
            skip: RefCell::new(HashSet::new()),
            dormant: RefCell::new(Arc::default()),
            waits_after: std::cell::Cell::new(0),
        }
    }

    /// Run passes until `shutdown` is cancelled.
    pub fn spawn(self) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("conduit-host-loop".into())
            .spawn(move || self.run())
    }

    fn run(self) {
        // Fault injection for the watchdog's tests and for an operator who wants to see the
        // service manager act: while the file named by this variable exists, no pass starts.
        let stall = std::env::var_os(STALL_FILE_VAR).map(std::path::PathBuf::from);
        while !self.shutdown.is_cancelled() {
            if let Some(path) = &stall
                && path.exists()
            {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            // Until the registry is applied no kind's owner is known: routing now would send
            // every event of a package about to start to no Work.
            if !self.core.registry_applied() {
                self.idle(None, false);
                continue;
            }
            let t = Instant::now();
            // One span per pass (`debug`: free unless exported), its in-transaction calls nested.
            let span = tracing::debug_span!(
                "host_loop.pass",
                pass = self.core.stats.passes.load(Ordering::Relaxed) + 1,
                duration_us = tracing::field::Empty,
                routed = tracing::field::Empty,
                calls = tracing::field::Empty,
                fallbacks = tracing::field::Empty,
                errors = tracing::field::Empty,
            );
            let calls_before = self.core.stats.in_transaction_calls.load(Ordering::Relaxed);
            let _entered = span.enter();
            // A bug in one pass must not end the loop for the daemon's life: log it, count it,
            // and pass again.
            let report =
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.pass())) {
                    Ok(r) => r,
                    Err(_) => {
                        self.core.stats.panics.fetch_add(1, Ordering::Relaxed);
                        PassReport {
                            errors: vec!["the pass panicked (a bug); it will be retried".into()],
                            ..PassReport::default()
                        }
                    }
                };
            let took = t.elapsed();
            if !span.is_disabled() {
                let calls = self.core.stats.in_transaction_calls.load(Ordering::Relaxed);
                span.record("duration_us", took.as_micros() as u64)
                    .record("routed", report.routed as u64)
                    .record("calls", calls.saturating_sub(calls_before))
                    .record("fallbacks", report.fallbacks as u64)
                    .record("errors", report.errors.len() as u64);
            }
            drop(_entered);
            drop(span);
            self.core.stats.passes.fetch_add(1, Ordering::Relaxed);
            self.core
                .stats
                .last_pass_us
                .store(took.as_micros() as u64, Ordering::Relaxed);
            self.core
                .stats
                .pass_us_total
                .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
            for e in &report.errors {
                tracing::error!(error = %e, "host loop");
            }
            if report != PassReport::default() {
                tracing::debug!(
                    routed = report.routed,
                    timers_fired = report.timers_fired,
                    waits_checked = report.waits_checked,
                    waits_satisfied = report.waits_satisfied,
                    emissions_committed = report.emissions_committed,
                    emissions_failed = report.emissions_failed,
                    fallbacks = report.fallbacks,
                    errors = report.errors.len(),
                    took_us = took.as_micros() as u64,
                    "host loop pass"
                );
            }
            self.idle(Some(t), report.more);
        }
    }

    /// Wait for the next pass: the poll interval, a nudge or the shutdown. A nudge within
    /// [`decide::MIN_PASS_SPACING`] of the last pass's start (`last`) waits out the rest of it,
    /// so a stream of commits is routed in batches, not one pass per commit. With `more` (the
    /// last pass left a full page behind) the next pass needs no nudge.
    fn idle(&self, last: Option<Instant>, more: bool) {
        let (core, shutdown, poll) = (self.core.clone(), self.shutdown.clone(), self.poll);
        self.rt.block_on(async move {
            tokio::select! {
                () = tokio::time::sleep(poll) => {}
                () = async {
                    if !more {
                        core.nudged().await;
                    }
                    if let Some(last) = last {
                        tokio::time::sleep(decide::nudged_pass_delay(last.elapsed())).await;
                    }
                } => {}
                () = shutdown.cancelled() => {}
            }
        });
    }

    /// One pass over everything live.
    pub fn pass(&self) -> PassReport {
        let mut r = PassReport::default();
        let all: Exts = self
            .core
            .extensions()
            .into_iter()
            .map(|(e, c)| (e.name().to_owned(), (e, c)))
            .collect();
        // An extension on its first start, or idle, is waited for rather than given fallbacks
        // (`StartFacts::settling`): its work stays where it is until its handshake is done.
        let (mut settling, mut exts): (Exts, Exts) = all
            .into_iter()
            .partition(|(_, (e, _))| StartFacts::of(&e.run_brief()).settling());
        let _awake = calls::keep_awake(&mut exts, &mut settling);
        *self.dormant.borrow_mut() = self.core.dormant();
        self.tend_health(&exts);
        if let Err(e) = self.route(&exts, &settling, &mut r) {
            r.errors.push(format!("routing: {e}"));
        }
        if let Err(e) = self.fire_timers(&exts, &settling, &mut r) {
            r.errors.push(format!("timers: {e}"));
        }
        if let Err(e) = self.match_waits(&exts, &settling, &mut r) {
            r.errors.push(format!("waits: {e}"));
        }
        if let Err(e) = self.commit_emissions(&exts, &settling, &mut r) {
            r.errors.push(format!("emissions: {e}"));
        }
        ingress::start_polls(&self.core, &self.rt, &exts);
        ingress::demand_polls(settling.values().map(|(e, c)| (e, &**c)));
        r
    }

    /// Something in this pass needs `ext`: start it if it is idle, `why` its start reason.
    fn demand(&self, settling: &Exts, ext: &str, why: impl FnOnce() -> String) {
        if let Some((e, _)) = settling.get(ext) {
            e.demand(why);
        }
    }

    /// Bring each extension's health up to date and apply what `health::tend` decides: start
    /// due probes (off the writer), restart the unresponsive, and fix the set this pass skips.
    fn tend_health(&self, exts: &Exts) {
        let runs: Vec<RunFacts<'_>> = exts
            .iter()
            .map(|(name, (ext, _))| {
                let run = ext.run_brief();
                RunFacts {
                    name,
                    pid: run.pid,
                    ready: run.state == conduit_supervisor::State::Ready,
                }
            })
            .collect();
        let (threshold, now) = (self.core.unresponsive_after(), now_ms());
        let tending = health::tend(&mut self.core.lock_health(), &runs, threshold, now);
        *self.skip.borrow_mut() = tending.skip;
        for (name, view) in tending.restarts {
            let Some((ext, _)) = exts.get(&name) else {
                continue;
            };
            tracing::error!(
                extension = ext.name(),
                failures = view.failures,
                reason = view.reason.as_deref().unwrap_or(""),
                "extension is unresponsive (alive, but answered none of its last calls); restarting it"
            );
            let details = format!(
                "{} consecutive in-transaction calls or probes failed; last: {}",
                view.failures,
                view.reason.as_deref().unwrap_or("no answer")
            );
            ext.restart(conduit_supervisor::StopRequest::unresponsive(&details));
        }
        for probe in tending.probes {
            if let Some((ext, _)) = exts.get(&probe.name) {
                let task = probe_once(self.core.clone(), ext.clone(), probe.pid, probe.call);
                self.core.tasks.spawn_on(task, &self.rt);
            }
        }
    }

    /// Whether this pass makes `ext`'s in-transaction calls.
    fn callable(&self, ext: &str) -> bool {
        !self.skip.borrow().contains(ext)
    }

    /// Whether `ext`'s timers, waits and emissions wait this pass: it is settling or idle, it
    /// is installed but disabled, or this pass does not call it (degraded).
    fn held(&self, settling: &Exts, ext: &str) -> bool {
        settling.contains_key(ext) || self.dormant.borrow().contains_key(ext) || !self.callable(ext)
    }

    /// Make one in-transaction call and read its answer with `check` (the method's rule, and
    /// what the step takes from the answer). A failed call, or an answer `check` refuses
    /// (recorded against the method as a bad answer), gives the fallback and why.
    fn in_tx_call<M: Method, T>(
        &self,
        ext: Option<&Extension>,
        params: &M::Params,
        check: impl FnOnce(M::Result) -> Result<T, String>,
    ) -> Outcome<T> {
        let method = M::NAME;
        match self.call::<M>(ext, params) {
            Ok(res) => match check(res) {
                Ok(v) => Outcome::Answered(v),
                Err(why) => {
                    if let Some(e) = ext {
                        e.record_bad_answer(method);
                    }
                    Outcome::Fallback {
                        why: format!("malformed answer: {why}"),
                    }
                }
            },
            Err(why) => Outcome::Fallback { why },
        }
    }

    /// Make one in-transaction call: the one place the loop talks to an extension (the
    /// in-transaction mark, the deadline, the stats and the health bookkeeping, degrading on a
    /// miss). `Err` carries why the fallback applies.
    fn call<M: Method>(
        &self,
        ext: Option<&Extension>,
        params: &M::Params,
    ) -> Result<M::Result, String> {
        let method = M::NAME;
        let Some(ext) = ext else {
            return Err("no running extension serves it".into());
        };
        let _mark = self.core.enter_transaction(ext.name());
        self.core
            .stats
            .in_transaction_calls
            .fetch_add(1, Ordering::Relaxed);
        let res = self
            .rt
            .block_on(ext.call::<M>(params, Some(IN_TRANSACTION_DEADLINE)));
        match &res {
            Ok(_) => self.record_answer(ext),
            Err(e) => match answered(e) {
                Some(true) => self.record_answer(ext),
                Some(false) => {
                    let why = failure_text(e);
                    let call = serde_json::value::to_raw_value(params).map(|params| ProbeCall {
                        method: method.to_owned(),
                        params,
                    });
                    if let Ok(call) = call {
                        let (threshold, now) = (self.core.unresponsive_after(), now_ms());
                        if let Some(h) = self.core.lock_health().get_mut(ext.name()) {
                            h.missed(threshold, now, why.clone(), call);
                        }
                    }
                    self.skip.borrow_mut().insert(ext.name().to_owned());
                    tracing::warn!(
                        extension = ext.name(),
                        method,
                        reason = %why,
                        "extension degraded: its in-transaction calls wait until a probe answers"
                    );
                }
                None => {}
            },
        }
        res.map_err(|e| failure_text(&e))
    }

    fn record_answer(&self, ext: &Extension) {
        if let Some(h) = self.core.lock_health().get_mut(ext.name()) {
            h.answered(now_ms());
        }
    }

    /// One write transaction of a step, committed without an fsync of its own
    /// ([`Durability::Deferred`]): a power cut may undo the last of them until the next
    /// acknowledged write's fsync (or a checkpoint) covers them, and then the step is made
    /// again, as after a crash before its commit. Every step's calls may be made again anyway
    /// (protocol.md §6: in-transaction handlers answer the same params the same way), and what
    /// a caller was told (an acknowledged event, timer, wait or planned emission) is synced by
    /// its own commit. So the loop's steps do not each wait for the disk, nor hold the writer
    /// through an fsync that ingress then waits behind.
    fn write<T>(
        &self,
        f: impl FnOnce(&mut conduit_store::WriteTx<'_>) -> Result<T, conduit_store::StoreError>,
    ) -> Result<T, conduit_store::StoreError> {
        self.core.store.write_with(Durability::Deferred, f)
    }

    /// Count and log a fallback, once its transaction has committed.
    fn count_fallback(&self, r: &mut PassReport, ext: &str, method: &str, why: &str) {
        self.core.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        r.fallbacks += 1;
        tracing::warn!(
            extension = ext,
            method,
            reason = why,
            "in-transaction call failed; applying its fallback"
        );
    }

    fn route(
        &self,
        exts: &Exts,
        settling: &Exts,
        r: &mut PassReport,
    ) -> Result<(), conduit_store::StoreError> {
        let dormant = self.dormant.borrow();
        // Who owns what, worked out once there is something to route (most passes have none).
        let mut owners = None;
        let callable = |e: &Extension| self.callable(e.name());
        // Events wait (unrouted) behind a starting or degraded owner; later events of other
        // kinds are read past them, page by page, so they never block anyone else.
        let mut after = 0;
        loop {
            let events = self
                .core
                .store
                .read(|rd| rd.unrouted_events_after(after, ROUTE_BATCH))?;
            let n = events.len();
            if let Some(last) = events.last() {
                after = last.id;
            } else {
                return Ok(());
            }
            let (waiting, kinds) = owners.get_or_insert_with(|| {
                let held = settling.iter().map(|(n, (_, c))| (n.as_str(), &**c));
                let held = held.chain(dormant.iter().map(|(n, c)| (n.as_str(), &**c)));
                let live = exts.iter().map(|(n, (_, c))| (n.as_str(), &**c));
                let waiting = decide::waiting_kinds(live, held);
                (
                    waiting,
                    decide::owners(exts.values().map(|(e, c)| (e, &**c))),
                )
            });
            let mut by_kind: BTreeMap<String, Vec<Event>> = BTreeMap::new();
            for e in events {
                if let Some(kind) = decide::batch_of(&e.kind, kinds, waiting, callable) {
                    let kind = kind.to_owned();
                    by_kind.entry(kind).or_default().push(e);
                } else if let Some(owner) = decide::waiting_for(&e.kind, kinds, waiting) {
                    self.demand(settling, owner, || {
                        format!("started by event {} of kind {}", e.id, e.kind)
                    });
                }
            }
            for (kind, inputs) in by_kind {
                // A stop waits for the pass; each step is bounded, so check between steps.
                if self.shutdown.is_cancelled() {
                    return Ok(());
                }
                let ids: Vec<i64> = inputs.iter().map(|e| e.id).collect();
                match kinds.get(kind.as_str()) {
                    None => {
                        self.write(|tx| {
                            for id in &ids {
                                tx.mark_routed(*id, None, now_ms())?;
                            }
                            Ok(())
                        })?;
                    }
                    // It failed earlier in this batch's loop: the rest waits.
                    Some((ext, true)) if !self.callable(ext.name()) => continue,
                    Some((ext, trigger)) => {
                        let mut fell_back = None;
                        self.write(|tx| {
                            let groups = if *trigger {
                                let params = TriggerParams::new(kind.clone(), inputs);
                                let (groups, why) = self
                                    .in_tx_call::<WorkKindTrigger, _>(Some(*ext), &params, |res| {
                                        trigger_verdict(&res, &ids).map(|()| res.groups)
                                    })
                                    .or_fallback(|_| fallback_groups(&ids));
                                fell_back = why;
                                groups
                            } else {
                                fallback_groups(&ids)
                            };
                            let now = now_ms();
                            for g in &groups {
                                let work = tx.open_or_feed_work(
                                    &kind,
                                    &g.key,
                                    &g.event_ids,
                                    g.start,
                                    now,
                                )?;
                                for id in &g.event_ids {
                                    tx.mark_routed(*id, Some(work), now)?;
                                }
                            }
                            Ok(())
                        })?;
                        if let Some(why) = fell_back {
                            self.count_fallback(r, ext.name(), host::WORK_KIND_TRIGGER, &why);
                        }
                    }
                }
                // The decision about these events has committed: acknowledgement-to-routing.
                self.core.timings.routed(&ids, Instant::now());
                r.routed += ids.len();
            }
            if n < ROUTE_BATCH as usize {
                return Ok(());
            }
        }
    }
}
