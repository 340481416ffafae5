//! One run of the child ([`Run`], what the actor owns while it is alive), how it ended
//! ([`Outcome`]), and the ways a run ends: on its own ([`finish_failed`]), closing its stdout
//! ([`closed_stdout`]), given up on by the host ([`host_killed`]), over a limit
//! ([`over_limit`]), or stopped gracefully ([`stop_run`]). Each records the exit, fails the
//! pending calls, and kills every process recorded in the child's tree, wherever it moved.

use std::time::{Duration, Instant};

use conduit_protocol::calls::Empty;
use conduit_protocol::methods;
use conduit_rpc::{Peer, Session};
use tokio::task::JoinHandle;

use crate::enforce::signal_tree;
use crate::extension::Extension;
use crate::process::{self, ExitInfo};
use crate::status::{ExitCause, ExitRecord, State, Status, StopRequest, now_ms};
use crate::tree::{self, Ledger};

/// One run of the child: what the actor owns while it is alive.
pub(crate) struct Run {
    pub(crate) child: crate::child::ExtChild,
    pub(crate) pid: u32,
    /// Taken by the graceful stop, which closes it.
    pub(crate) session: Option<Session>,
    pub(crate) stderr: JoinHandle<()>,
    pub(crate) ledger: Option<Ledger>,
}

/// How a run ended, for the actor to decide what comes next.
pub(crate) enum Outcome {
    /// Died or failed to start; restart after a delay.
    Failed {
        ready_at: Option<Instant>,
        error: Option<String>,
    },
    /// Refused the handshake's versions; wait for an operator.
    Incompatible(String),
    /// Someone asked for a restart (the request says who); start again at once.
    Restart(StopRequest),
    /// Stop for good.
    Stop,
}

/// Read the child's tree and record what is new (in memory, the ledger and the status); `true`
/// if it has descendants or the record changed.
pub(crate) fn track(ext: &Extension, run: &Run) -> bool {
    let seen = tree::tree(run.pid);
    let changed = ext.record_tree(&seen);
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
    let busy = was_changed || !desc.is_empty();
    ext.show_descendants(desc);
    busy
}

pub(crate) fn session_peer(run: &Run) -> Peer {
    run.session
        .as_ref()
        .expect("the session is taken only by the stop, which ends the run")
        .peer()
}

/// The child closed its stdout while still running: the host kills it, and says so.
pub(crate) async fn closed_stdout(ext: &Extension, run: Run, ready_at: Option<Instant>) -> Outcome {
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
async fn kill_and_record(
    ext: &Extension,
    mut run: Run,
    cause: ExitCause,
    why: Option<String>,
    also: impl FnOnce(&mut Status),
) -> Option<ExitInfo> {
    ext.set_peer(None);
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

/// The tree went over a limit: kill it (a tree over its memory is owed no grace), record why,
/// count it; the actor restarts it with backoff.
pub(crate) async fn over_limit(
    ext: &Extension,
    run: Run,
    ready_at: Option<Instant>,
    why: String,
) -> Outcome {
    tracing::warn!(extension = %ext.name(), reason = %why, "stopping the extension: it is over a limit");
    kill_and_record(ext, run, ExitCause::OverLimit, Some(why.clone()), |s| {
        if let Some(r) = &mut s.resources {
            r.limit_stops += 1;
            r.usage = None;
        }
    })
    .await;
    Outcome::Failed {
        ready_at,
        error: Some(format!("stopped: {why}")),
    }
}

/// The host gave up on the child (no handshake in time, a failed handshake): kill it, record
/// why.
pub(crate) async fn host_killed(
    ext: &Extension,
    run: Run,
    ready_at: Option<Instant>,
    why: String,
) -> Outcome {
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
pub(crate) async fn finish_failed(
    ext: &Extension,
    mut run: Run,
    exit: Option<ExitInfo>,
    ready_at: Option<Instant>,
    error: String,
) -> Outcome {
    ext.set_peer(None);
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
    ext.forget_in_flight();
    let recorded = ext.recorded();
    let (killed, gone) = tree::kill_all(&recorded, Some(run.pid), Duration::from_secs(1)).await;
    if killed > 0 {
        tracing::info!(extension = %ext.name(), killed, "killed the processes the extension left");
    }
    finish_stderr(run.stderr).await;
    if !gone && !tree::still_running_shared(&recorded).await.is_empty() {
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
    let _ = tree::signal_group(run.pid, nix::sys::signal::Signal::SIGKILL);
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
pub(crate) async fn stop_run(ext: &Extension, mut run: Run, grace: Duration, req: &StopRequest) {
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
        let _ = tree::signal_group(run.pid, Signal::SIGTERM);
        status = tokio::time::timeout(Duration::from_secs(2), run.child.wait())
            .await
            .ok()
            .and_then(Result::ok);
    }
    if status.is_none() {
        tracing::warn!(extension = %ext.name(), "did not exit after SIGTERM; sending SIGKILL");
        let _ = tree::signal_group(run.pid, Signal::SIGKILL);
        status = tokio::time::timeout(Duration::from_secs(2), run.child.wait())
            .await
            .ok()
            .and_then(Result::ok);
    }
    let exit = status.map(|st| ExitInfo::from_status(st, now_ms()));
    let rec = ExitRecord::requested(run.pid, req, exit, in_flight);
    ext.update(|s| s.record_exit(rec));
    end_run(ext, run).await;
}
