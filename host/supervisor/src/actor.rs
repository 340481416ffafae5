//! The actor: one task per extension that owns its child, session and stderr task, and walks
//! the states of the crate's diagram. [`actor`] loops over runs (preflight, start, the restart
//! policy's delay); [`run_once`] is one run, from spawning the child through its handshake to
//! its end. How a run ends is in `run.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use conduit_protocol::handshake::{InitializeParams, InitializeResult};
use conduit_protocol::{ErrorCode, PROTOCOL_VERSIONS, methods};
use conduit_rpc::{
    BoxFuture, CallError, Handler, HandlerResult, Peer, Request, Session, SessionConfig,
};
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::backoff::{Jitter, RestartTracker, RunFacts};
use crate::cgroup;
use crate::enforce::{Enforcer, mechanism};
use crate::extension::Extension;
use crate::held::hold;
use crate::life::Cmd;
use crate::lifecycle::format_idle_stop_after;
use crate::limits;
use crate::log::LogFile;
use crate::process::ExitInfo;
use crate::rest::{REST_LOOK_EVERY, Resting};
use crate::run::{
    Outcome, Run, closed_stdout, finish_failed, host_killed, over_limit, session_peer, stop_run,
    track,
};
use crate::spec::ExtensionSpec;
use crate::status::{Requester, Resources, State, StopRequest, now_ms};
use crate::tree::{CpuClock, Ledger, TRACK_INTERVAL, TRACK_INTERVAL_QUIET};

/// The callback handler of one extension, shared by the sessions of all its runs. With an
/// idle stop configured, each callback's start and end count as calls for the idle decision.
struct SharedHandler {
    handler: Arc<dyn Handler>,
    ext: Option<Extension>,
}

impl Handler for SharedHandler {
    fn request(&self, req: Request) -> BoxFuture<HandlerResult> {
        let Some(ext) = &self.ext else {
            return self.handler.request(req);
        };
        ext.touch();
        let (ext, call) = (ext.clone(), self.handler.request(req));
        Box::pin(async move {
            let res = call.await;
            ext.touch();
            res
        })
    }
    fn notification(&self, method: &str, params: Option<&RawValue>, peer: &Peer) {
        self.handler.notification(method, params, peer)
    }
}

/// The preflights that may run at once: one per CPU.
fn preflight_permits() -> &'static tokio::sync::Semaphore {
    static PERMITS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    PERMITS.get_or_init(|| {
        tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get()))
    })
}

pub(crate) async fn actor(
    ext: Extension,
    spec: ExtensionSpec,
    handler: Arc<dyn Handler>,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    shutdown: CancellationToken,
    resting: Arc<Resting>,
) {
    let mut tracker = RestartTracker::default();
    let mut jitter = Jitter::default();
    let log = LogFile::new(&spec.log_path);
    // Whether the next run waits for a need first (an on-demand extension, or one stopped for
    // idleness), and why the next run starts: the reason shown, and whether it counts as a
    // restart (a failure or a requested restart does; a first start or a need does not).
    let mut awaiting = spec.lifecycle.on_demand() && !spec.start_now;
    let mut next = (spec.start_reason.clone(), false);
    loop {
        if awaiting {
            ext.enter_idle();
            let Some(why) = await_demand(&mut cmds, &shutdown).await else {
                break;
            };
            tracing::info!(extension = %spec.name, reason = %why, "starting the extension on demand");
            ext.leave_idle();
            ext.update(|s| s.demand_starts += 1);
            next = (why, false);
            awaiting = false;
        }
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
            ext.update(|s| s.first_run = false);
            match hold(&ext, State::Refused, e, &mut cmds, &shutdown).await {
                Cmd::Restart(req) => {
                    forget_failures(&ext, &spec, &mut tracker, &req);
                    next = (restarted(&req), true);
                    continue;
                }
                Cmd::Stop | Cmd::Demand(_) => break,
            }
        }
        let (why, restart) = std::mem::replace(&mut next, (String::new(), true));
        ext.update(|s| {
            if restart {
                s.restarts += 1;
            }
            s.first_run = !restart;
            s.start_reason = Some(why);
        });
        let outcome = run_once(&ext, &spec, &handler, &log, &mut cmds, &shutdown, &resting).await;
        ext.set_peer(None);
        match outcome {
            Outcome::Stop => break,
            // Not a failure and not a restart: the restart policy does not count it.
            Outcome::Idle => {
                ext.update(|s| s.idle_stops += 1);
                awaiting = true;
            }
            Outcome::Restart(req) => {
                forget_failures(&ext, &spec, &mut tracker, &req);
                next = (restarted(&req), true);
            }
            Outcome::Incompatible(msg) => {
                ext.update(|s| s.first_run = false);
                match hold(&ext, State::Incompatible, msg, &mut cmds, &shutdown).await {
                    Cmd::Restart(req) => {
                        forget_failures(&ext, &spec, &mut tracker, &req);
                        next = (restarted(&req), true);
                    }
                    Cmd::Stop | Cmd::Demand(_) => break,
                }
            }
            Outcome::Failed { error, .. } if spec.development => {
                let why = format!(
                    "{} (a development install is not restarted after a failure; the next change, or `conduit ext restart {}`, starts it again)",
                    error.as_deref().unwrap_or("exited"),
                    spec.name
                );
                tracing::warn!(extension = %spec.name, error = %why, "development install failed; held stopped");
                match hold(&ext, State::Stopped, why, &mut cmds, &shutdown).await {
                    Cmd::Restart(req) => {
                        forget_failures(&ext, &spec, &mut tracker, &req);
                        continue;
                    }
                    // `wait_for_operator` passes no need on: only a change or an operator
                    // starts a held development run.
                    Cmd::Stop | Cmd::Demand(_) => break,
                }
            }
            Outcome::Failed { ready_at, error } => {
                if ext.retiring() {
                    // A newer version is starting beside it, from files that may be that
                    // version's already: this one is not started again.
                    tracing::warn!(extension = %spec.name, error = %error.as_deref().unwrap_or("exited"), "the version being replaced failed; it is not restarted");
                    if error.is_some() {
                        ext.update(|s| s.last_error = error);
                    }
                    break;
                }
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
                    s.first_run = false;
                    s.failing_since_ms.get_or_insert_with(now_ms);
                    s.failing_as = Some(state);
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
                next = ("restarted after it failed".into(), true);
                let sleep = tokio::time::sleep(decision.delay);
                tokio::pin!(sleep);
                let stop = loop {
                    tokio::select! {
                        () = &mut sleep => break false,
                        cmd = cmds.recv() => match cmd {
                            Some(Cmd::Restart(req)) => {
                                forget_failures(&ext, &spec, &mut tracker, &req);
                                next = (restarted(&req), true);
                                break false;
                            }
                            // A need does not cut a backoff short.
                            Some(Cmd::Demand(_)) => continue,
                            Some(Cmd::Stop) | None => break true,
                        },
                        () = shutdown.cancelled() => break true,
                    }
                };
                if stop {
                    break;
                }
                // The delay stays shown until the state changes (`run_once` or `hold` clear it
                // in the same update), so no one reads `backing-off` without its delay.
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

/// The start reason of the run a requested restart begins.
fn restarted(req: &StopRequest) -> String {
    match req.by {
        Requester::Operator => "restarted at an operator's request".into(),
        _ => format!("restarted by the host: {}", req.why),
    }
}

/// Wait, idle, for something to need the extension: the reason it gives, or `None` to stop.
/// A requested restart starts it too.
async fn await_demand(
    cmds: &mut mpsc::UnboundedReceiver<Cmd>,
    shutdown: &CancellationToken,
) -> Option<String> {
    tokio::select! {
        cmd = cmds.recv() => match cmd {
            Some(Cmd::Demand(why)) => Some(why),
            Some(Cmd::Restart(req)) => Some(restarted(&req)),
            Some(Cmd::Stop) | None => None,
        },
        () = shutdown.cancelled() => None,
    }
}

/// After a requested restart: an operator's forgets the failures counted so far and the
/// failing streak (the operator has seen it); the host's keeps both, so a restart for being
/// unresponsive never hides since when the extension has been in trouble.
fn forget_failures(
    ext: &Extension,
    spec: &ExtensionSpec,
    tracker: &mut RestartTracker,
    req: &StopRequest,
) {
    if req.by == Requester::Operator {
        spec.policy.reset(tracker);
        ext.update(|s| {
            s.failing_since_ms = None;
            s.failing_as = None;
        });
    }
}

/// End a run whose handshake found no protocol both sides speak: stopped, not restarted.
async fn incompatible(ext: &Extension, run: Run, spec: &ExtensionSpec, msg: String) -> Outcome {
    let req = StopRequest {
        by: Requester::Host,
        restart: false,
        why: "an incompatible handshake".into(),
    };
    Box::pin(stop_run(ext, run, spec.stop_grace, &req)).await;
    Outcome::Incompatible(msg)
}

async fn run_once(
    ext: &Extension,
    spec: &ExtensionSpec,
    handler: &Arc<dyn Handler>,
    log: &LogFile,
    cmds: &mut mpsc::UnboundedReceiver<Cmd>,
    shutdown: &CancellationToken,
    resting: &Resting,
) -> Outcome {
    ext.update(|s| {
        s.state = State::Starting;
        s.next_start_at_ms = None;
        s.backoff_ms = None;
        s.pid = None;
        s.descendants.clear();
        s.spawn_to_ready_ms = None;
        s.handshake_ms = None;
    });
    let spawned = Instant::now();
    // The bulk pipe: our end does not leak into the child (close-on-exec); its end becomes
    // descriptor 3 there and is closed on the forker thread once the child has it.
    let bulk = match &spec.bulk {
        None => None,
        Some(_) => match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
            Ok(ends) => Some(ends),
            Err(e) => {
                tracing::warn!(extension = %spec.name, error = %e, "cannot make the bulk pipe; artifacts go as JSON chunks this run");
                None
            }
        },
    };
    let (bulk, bulk_write) = bulk.unzip();
    let spawn =
        crate::start::spawn_on_forker(spec.command.clone(), spec.confine.clone(), bulk_write).await;
    let mut child = match spawn {
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
    let tail = ext.new_tail();
    let stderr_log = LogFile::new(log.path());
    let marker = crate::log::run_marker(now_ms(), pid, &spec.version);
    let stderr =
        tokio::spawn(async move { stderr_log.capture_run(stderr, tail, Some(marker)).await });
    let session = Session::new(
        stdout,
        stdin,
        SharedHandler {
            handler: handler.clone(),
            ext: spec.lifecycle.idle_stop_after.map(|_| ext.clone()),
        },
        SessionConfig {
            counters: ext.session_counters(),
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
    ext.forget_recorded();
    track(ext, &run);
    ext.update(|s| s.pid = Some(pid));

    // The handshake, bounded by the start timeout; the child dying meanwhile ends it early.
    // The limits hold from the start: a package that allocates before it answers is stopped
    // there too.
    let peer = session_peer(&run);
    let mut init = InitializeParams::current(&spec.host_version);
    if let (Some(read), Some(sink)) = (bulk, &spec.bulk) {
        sink(&peer, read);
        init = init.with_bulk();
    }
    let asked = Instant::now();
    let mut enforcer = spec.confine.limits.map(Enforcer::new);
    let handshake = {
        // On the heap: the actor's future holds what any of its awaits may need at once, and a
        // thousand idle actors would each keep room for a handshake they finished long ago.
        let mut call = Box::pin(tokio::time::timeout(
            spec.start_timeout,
            peer.call::<_, InitializeResult>(methods::host::INITIALIZE, &init, None),
        ));
        loop {
            tokio::select! {
                r = &mut call => break r,
                status = run.child.wait() => {
                    let exit = status.ok().map(|st| ExitInfo::from_status(st, now_ms()));
                    return Box::pin(finish_failed(ext, run, exit, None, "exited during the handshake".into())).await;
                }
                () = shutdown.cancelled() => { Box::pin(stop_run(ext, run, spec.stop_grace, &StopRequest::shutdown())).await; return Outcome::Stop; }
                // A stop or restart asked for during the handshake is not kept waiting for it.
                cmd = cmds.recv() => match cmd {
                    Some(Cmd::Demand(_)) => continue,
                    cmd => return Box::pin(end_on_request(ext, run, spec, cmd)).await,
                },
                () = tokio::time::sleep_until(sample_due(&enforcer)), if enforcer.is_some() => {
                    let e = enforcer.as_mut().expect("sampled only with an enforcer");
                    if let Some(why) = e.sample(ext, run.pid) {
                        return Box::pin(over_limit(ext, run, None, why)).await;
                    }
                }
            }
        }
    };
    let result = match handshake {
        Err(_) => {
            let msg = format!("no answer to `initialize` within {:?}", spec.start_timeout);
            return Box::pin(host_killed(ext, run, None, msg)).await;
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
            return incompatible(ext, run, spec, msg).await;
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
                    Box::pin(finish_failed(
                        ext,
                        run,
                        Some(exit),
                        None,
                        format!("handshake failed: {e}"),
                    ))
                    .await
                }
                None => Box::pin(closed_stdout(ext, run, None)).await,
            };
        }
        Ok(Err(e)) => {
            let msg = format!("handshake failed: {e}");
            return Box::pin(host_killed(ext, run, None, msg)).await;
        }
        Ok(Ok(r)) => r,
    };
    if !PROTOCOL_VERSIONS.contains(&result.protocol_version) {
        let msg = format!(
            "the extension chose protocol version {}, which this host does not speak (it speaks {PROTOCOL_VERSIONS:?})",
            result.protocol_version
        );
        return incompatible(ext, run, spec, msg).await;
    }

    let ready_at = Instant::now();
    tracing::info!(extension = %spec.name, pid, version = %result.extension.version, "extension ready");
    // The peer first: whoever sees `ready` can call at once.
    ext.set_peer(Some(peer));
    ext.update(|s| {
        s.state = State::Ready;
        s.ready_since_ms = Some(now_ms());
        s.spawn_to_ready_ms = Some(ready_at.duration_since(spawned).as_millis() as u64);
        s.handshake_ms = Some(ready_at.duration_since(asked).as_millis() as u64);
        s.protocol_version = Some(result.protocol_version);
        s.capabilities = Some(std::sync::Arc::new(result.capabilities.clone()));
        s.last_error = None;
    });
    // The idle period starts at ready.
    ext.touch();
    if let Some(told) = &spec.on_ready {
        told(ext);
    }
    let idle_after = spec.lifecycle.idle_stop_after;
    let mut idle_at = tokio::time::Instant::now() + idle_after.unwrap_or(Duration::from_secs(3600));

    // Crash detection: stdout EOF or child exit, whichever comes first; meanwhile the tree is
    // read and recorded every TRACK_INTERVAL.
    let watch = session_peer(&run);
    // Every TRACK_INTERVAL while the tree has descendants or just changed; a tree that is only
    // the extension itself is read ever less often, down to every TRACK_INTERVAL_QUIET, so a
    // thousand idle extensions cost the daemon a fraction of a CPU percent rather than ten.
    let mut every = TRACK_INTERVAL;
    let mut next_track = tokio::time::Instant::now() + every;
    // A tree found resting (the extension alone, idle, far from its limits) is parked with the
    // supervisor's sweep, which watches its CPU clock, and read again once that moves (or every
    // REST_LOOK_EVERY): meanwhile neither the tracking nor the sampling timer runs.
    let clock = CpuClock::of(run.pid);
    let mut rest: Option<(tokio::sync::oneshot::Receiver<()>, tokio::time::Instant)> = None;
    let stable_at = tokio::time::Instant::from_std(ready_at + spec.policy.stable_after);
    let mut stable = false;
    // In a cgroup the kernel enforces memory.max itself: its OOM kills are counted there.
    let ooms = spec
        .confine
        .cgroup
        .as_deref()
        .map(|d| cgroup::read_use(d).oom_kills);
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(sample_due(&enforcer)), if enforcer.is_some() && rest.is_none() => {
                let e = enforcer.as_mut().expect("sampled only with an enforcer");
                if let Some(why) = e.sample(ext, run.pid) {
                    return Box::pin(over_limit(ext, run, Some(ready_at), why)).await;
                }
            }
            // Woken by the sweep (its clock moved), or the resting tree's periodic read: read
            // it now, as before it rested (the sample is due already).
            () = rest_ends(&mut rest), if rest.is_some() => {
                rest = None;
                every = TRACK_INTERVAL;
                next_track = tokio::time::Instant::now();
            }
            status = run.child.wait() => {
                let exit = status.ok().map(|st| ExitInfo::from_status(st, now_ms()));
                if let (Some(before), Some(dir), Some(l)) = (ooms, spec.confine.cgroup.as_deref(), spec.confine.limits)
                    && cgroup::read_use(dir).oom_kills > before
                {
                    let why = format!("over its {} memory limit (killed by the kernel at the cgroup's memory.max)", limits::format_bytes(l.memory));
                    return Box::pin(over_limit(ext, run, Some(ready_at), why)).await;
                }
                return Box::pin(finish_failed(ext, run, exit, Some(ready_at), String::new())).await;
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
                    Some(exit) => Box::pin(finish_failed(ext, run, Some(exit), Some(ready_at), String::new())).await,
                    None => Box::pin(closed_stdout(ext, run, Some(ready_at))).await,
                };
            }
            cmd = cmds.recv() => {
                if matches!(cmd, Some(Cmd::Demand(_))) {
                    continue;
                }
                ext.set_peer(None);
                return Box::pin(end_on_request(ext, run, spec, cmd)).await;
            }
            () = tokio::time::sleep_until(idle_at), if idle_after.is_some() => {
                let after = idle_after.expect("looked at only with an idle stop");
                let streams = spec.open_streams.as_ref().map_or(0, |n| n());
                match ext.close_if_idle(after, streams, Instant::now()) {
                    Ok(()) => {
                        tracing::info!(extension = %spec.name, pid = run.pid, idle_for = %format_idle_stop_after(idle_after), "stopping the extension: it is idle");
                        let req = StopRequest::idle(&format_idle_stop_after(idle_after));
                        Box::pin(stop_run(ext, run, spec.stop_grace, &req)).await;
                        return Outcome::Idle;
                    }
                    Err(at) => idle_at = tokio::time::Instant::from_std(at),
                }
            }
            () = shutdown.cancelled() => {
                ext.set_peer(None);
                Box::pin(stop_run(ext, run, spec.stop_grace, &StopRequest::shutdown())).await;
                return Outcome::Stop;
            }
            // A run that stays ready this long ends the failing streak (as the restart policy
            // starts its count again after it).
            () = tokio::time::sleep_until(stable_at), if !stable => {
                stable = true;
                ext.update(|s| {
                    s.failing_since_ms = None;
                    s.failing_as = None;
                });
            }
            () = tokio::time::sleep_until(next_track), if rest.is_none() => {
                // Read before the tree: whatever the tree does after this moves the clock.
                let before = clock.and_then(CpuClock::read);
                let busy = track(ext, &run);
                every = if busy { TRACK_INTERVAL } else { (every * 2).min(TRACK_INTERVAL_QUIET) };
                next_track = tokio::time::Instant::now() + every;
                if let (false, Some(clock), Some(at)) = (busy, clock, before) {
                    // And its use, read after the clock too.
                    let may_rest = match enforcer.as_mut() {
                        None => true,
                        Some(e) => {
                            if let Some(why) = e.sample(ext, run.pid) {
                                return Box::pin(over_limit(ext, run, Some(ready_at), why)).await;
                            }
                            e.may_rest()
                        }
                    };
                    if may_rest {
                        rest = Some((resting.park(clock, at), tokio::time::Instant::now() + REST_LOOK_EVERY));
                    }
                }
            }
        }
    }
}

/// End a run because `cmd` asked (a channel closed is a stop): the graceful stop, recorded
/// with who asked; then restart at once or stop.
async fn end_on_request(
    ext: &Extension,
    run: Run,
    spec: &ExtensionSpec,
    cmd: Option<Cmd>,
) -> Outcome {
    let req = match &cmd {
        Some(Cmd::Restart(req)) => req.clone(),
        Some(Cmd::Stop | Cmd::Demand(_)) | None => StopRequest::operator_stop(),
    };
    stop_run(ext, run, spec.stop_grace, &req).await;
    match cmd {
        Some(Cmd::Restart(req)) => Outcome::Restart(req),
        Some(Cmd::Stop | Cmd::Demand(_)) | None => Outcome::Stop,
    }
}

/// Until a resting tree is to be read again: its clock moved (the sweep says so, or was
/// dropped), or its periodic read is due. Never, when it does not rest.
async fn rest_ends(rest: &mut Option<(tokio::sync::oneshot::Receiver<()>, tokio::time::Instant)>) {
    match rest {
        Some((woken, until)) => {
            tokio::select! {
                _ = woken => {}
                () = tokio::time::sleep_until(*until) => {}
            }
        }
        None => std::future::pending().await,
    }
}

/// When the enforcer (if any) wants its next sample.
fn sample_due(enforcer: &Option<Enforcer>) -> tokio::time::Instant {
    enforcer.as_ref().map_or_else(
        || tokio::time::Instant::now() + Duration::from_secs(3600),
        Enforcer::due,
    )
}
